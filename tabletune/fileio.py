"""Atomic writes: a temporary file in the same folder, then os.replace.

A crash or a bad input never leaves a half-written output behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike[str], obj: object) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: str | os.PathLike[str]) -> object:
    """Read JSON; a missing or malformed file raises InputError naming it."""
    from tabletune.errors import InputError

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(str(path), "<file>", str(path), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "<file>", str(path), "not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(str(path), "<json>", exc.msg, f"invalid JSON at line {exc.lineno}") from None
