"""Live override: a watched table file pins the controller's table (no torch, no vllm).

The plugin watches ``TABLETUNE_TABLE_FILE`` (for example a key of a mounted
ConfigMap, or the file ``tabletune control --output`` writes):

* the file appears or changes and holds a valid table: **pin** it (the controller
  keeps observing but neither explores nor installs);
* the file is deleted: **unpin** (the controller resumes from the pinned table);
* the file changes but is invalid (bad JSON, bad ranges, k above the engine's k_max):
  **refused** with one log line per bad version; the last good table stays, pinned
  or not. A version is refused only when the next poll finds it unchanged: a file
  written in place (truncated, then written) can be read between the two, and that
  empty or partial read is the write in progress, not a bad version.

Formats: vLLM's (``{"num_speculative_tokens": N, "num_speculative_tokens_per_batch_size":
[...]}``, what ``tabletune tune`` writes as ``speculative_config.json``) or a bare list of
ranges. Change detection is one ``os.stat`` per poll (mtime, size, inode; it follows
symlinks, so the atomic ``..data`` swap of a Kubernetes ConfigMap volume counts as a change),
at most once per ``poll_s``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tabletune.errors import InputError
from tabletune.table import DraftTable

POLL_S = 1.0


@dataclass(frozen=True)
class TableFileEvent:
    """What a poll found: ``kind`` is "pin" (with ``table``), "unpin" or "invalid" (with ``problem``)."""

    kind: str
    table: DraftTable | None = None
    problem: str = ""


class TableFileWatcher:
    """Polls one path; ``poll(now_s)`` returns an event when the file changed, else None."""

    def __init__(self, path: str | os.PathLike[str], k_max: int, poll_s: float = POLL_S) -> None:
        self.path = Path(path)
        self.k_max = k_max
        self.poll_s = poll_s
        self._signature: tuple[int, int, int] | None = None
        self._next_s: float | None = None
        self.pinned = False
        self.rejected = 0
        self._unsettled: tuple[int, int, int] | None = None  # an invalid version seen once

    def poll(self, now_s: float) -> TableFileEvent | None:
        if self._next_s is not None and now_s < self._next_s:
            return None
        self._next_s = now_s + self.poll_s
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._signature = self._unsettled = None
            if self.pinned:
                self.pinned = False
                return TableFileEvent("unpin")
            return None
        except OSError as exc:
            return self._invalid(None, f"{self.path}: cannot stat: {exc.strerror}")
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        if signature == self._signature:
            return None
        try:
            table = DraftTable.load(self.path)
            table = DraftTable.from_ranges(table.as_lists(), self.k_max, source=str(self.path))
        except InputError as exc:
            if signature != self._unsettled:
                self._unsettled = signature  # perhaps a write in progress: refused if the next poll finds it
                return None
            return self._invalid(signature, str(exc))
        self._unsettled = None
        self._signature = signature
        self.pinned = True
        return TableFileEvent("pin", table)

    def _invalid(self, signature: tuple[int, int, int] | None, problem: str) -> TableFileEvent:
        self._signature, self._unsettled = signature, None
        self.rejected += 1
        return TableFileEvent("invalid", problem=problem)
