"""The static-mode engine (fixed k, no table) in a child process of its own.

A second ``vllm.LLM`` in one process trips vLLM's kernel-override scan (see
tests/integrations/test_vllm_tuner.py), and the tuning engine's memory must be
gone before the static one allocates; a child process does both. The parent
speaks JSON lines with it: ``{"op": "context", "n": N}``, ``{"op": "step", "b":
b, "k": k, "n": steps}`` (answer: ``{"samples_ms": [...], "scheduled_tokens":
[...]}``), ``{"op": "cap", "n": N}`` (answer: a ``BatchCap``), ``{"op": "close"}``.
Answers are the stdout lines starting with ``REPLY_PREFIX``; anything else the
engine prints is passed through to stderr. The
child runs ``python -m tabletune.integrations.vllm.tuner_engine`` (``serve_static`` there).
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

from tabletune.profile import Fingerprint
from tabletune.tuner import EngineSpec, StepSamples
from tabletune.tuner.budget import BatchCap

REPLY_PREFIX = "TABLETUNE-REPLY "
SERVER_MODULE = "tabletune.integrations.vllm.tuner_engine"  # its ``__main__`` runs ``serve_static``


class StaticEngine:
    """``tabletune.tuner.Engine`` (measure_step, set_context_len, close) over the child process."""

    def __init__(self, spec: EngineSpec, k: int) -> None:
        self.k_max = spec.k_max
        self.max_batch_size = spec.max_batch_size
        self.context_len = spec.context_len
        arg = json.dumps({"spec": dataclasses.asdict(spec), "k": k})
        self.proc = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, arg], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self._reply()  # started

    def _reply(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY_PREFIX):
                return json.loads(line[len(REPLY_PREFIX):])
            sys.stderr.write(line)
        raise RuntimeError(f"the static-mode vLLM engine exited ({self.proc.wait()}) before it answered")

    def _ask(self, **request) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def set_context_len(self, context_len: int) -> None:
        self._ask(op="context", n=context_len)
        self.context_len = context_len

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples:
        got = self._ask(op="step", b=batch_size, k=k, n=num_steps)
        return StepSamples(tuple(got["samples_ms"]), tuple(got["scheduled_tokens"]))

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(**self._ask(op="fingerprint"))

    def batch_cap(self, context_len: int) -> BatchCap:
        """The largest batch this engine's KV cache holds at ``context_len`` (it has less memory than the
        tuning engine had)."""
        return BatchCap(**self._ask(op="cap", n=context_len))

    def measure_acceptance(self, prompts, k, max_tokens):
        raise NotImplementedError("the static-mode engine only times steps")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._ask(op="close")
            finally:
                self.proc.wait(timeout=120)


VLLM_DEFAULT_UTILIZATION = 0.9  # --gpu-memory-utilization when not given (vLLM 0.26 and 0.32)


def fit_memory_flags(flags: tuple[str, ...], free_bytes: int, total_bytes: int) -> tuple[str, ...]:
    """The engine flags with ``--gpu-memory-utilization`` lowered to what is free, less the headroom asked for.

    vLLM refuses to start when utilization x total exceeds the free memory, and the tuning engine does
    not give all of its memory back in-process (on an H100, 15.4 GiB of 79 stayed held), so the static
    engine, started after it, asks for at most (free - headroom) / total, rounded down to a hundredth. The
    headroom is what vLLM's default utilization leaves, (1 - 0.9) x total: vLLM's profile undercounts what
    its steps allocate (on an H100 a static engine at 0.79 held 63.5 GiB, 0.9 GiB over its 62.6, and a
    1 GiB margin ended in an out-of-memory error), and the tuning engine ran with that headroom.
    """
    flags = tuple(flags)
    want, at = VLLM_DEFAULT_UTILIZATION, None
    for i, flag in enumerate(flags):
        if flag == "--gpu-memory-utilization" and i + 1 < len(flags):
            want, at = float(flags[i + 1]), (i, i + 2)
        elif flag.startswith("--gpu-memory-utilization="):
            want, at = float(flag.split("=", 1)[1]), (i, i + 1)
    headroom = (1.0 - VLLM_DEFAULT_UTILIZATION) * total_bytes
    fits = math.floor((free_bytes - headroom) / total_bytes * 100) / 100
    if want <= fits:
        return flags
    rest = flags if at is None else flags[:at[0]] + flags[at[1]:]
    return (*rest, "--gpu-memory-utilization", f"{fits:.2f}")
