"""Will the tune fit? What it allocates, worked out before it allocates. Core: no torch, no vllm.

The tuner's engines keep one KV cache for ``max_num_seqs`` slots of ``max_len``
tokens each:

    kv_bytes = 2 (K and V) * num_layers * num_kv_heads * head_dim * bytes_per_value * slots * max_len

and need a workspace (activations, CUDA graphs' memory pools). A tune runs its
engines one after another (never two at once), so what must fit is the largest
one: ``engines`` counts those that would be alive together, and ``MemoryPlan``
says what ``weights + engines * (kv + workspace)`` needs against the free memory.

A long context may not hold ``max_num_seqs`` sequences. ``largest_batch`` is the largest
batch size that fits, per context (``BatchCap``); the tune measures that context up to it,
extends its row's last k to ``max_num_seqs`` (``capped_batch_sizes``, ``tabletune.tuner.run``),
and refuses (``check_caps``) only when not even one sequence fits: before measuring anything,
in the memory free at the start, and again for each context when its engine is about to be
built (the previous context's released).
"""

from __future__ import annotations

from dataclasses import dataclass

from tabletune.errors import InputError

GIB = float(1 << 30)


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_value: int, slots: int,
                   max_len: int) -> int:
    """2 * num_layers * num_kv_heads * head_dim * bytes_per_value * slots * max_len."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_value * slots * max_len


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes a tune will allocate on the device, and the bytes free for it."""

    free_bytes: int
    weights_bytes: int  # still to load (0 when already loaded)
    kv_bytes: int  # one engine's KV cache
    workspace_bytes: int  # one engine's activations and graph pools (a margin)
    engines: int = 1  # engines alive at the same time
    already_allocated_bytes: int = 0  # e.g. weights loaded before the check (for the message only)

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.engines * (self.kv_bytes + self.workspace_bytes)

    def describe(self) -> str:
        return (f"needs {self.need_bytes / GIB:.1f} GiB (KV {self.kv_bytes / GIB:.1f} GiB x {self.engines} engine(s), "
                f"workspace {self.workspace_bytes / GIB:.1f} GiB, weights to load {self.weights_bytes / GIB:.1f} GiB) "
                f"but {self.free_bytes / GIB:.1f} GiB is free"
                + (f" after {self.already_allocated_bytes / GIB:.1f} GiB of weights" if self.already_allocated_bytes
                   else ""))


def largest_batch(free: int, fixed: int, per_sequence: int, max_num_seqs: int, extra_slots: int = 0) -> int:
    """The largest b in 0..max_num_seqs with  fixed + (b + extra_slots) * per_sequence <= free
    (bytes, or KV tokens); 0 when not even one fits."""
    if per_sequence <= 0:
        return max_num_seqs
    return max(0, min(max_num_seqs, (free - fixed) // per_sequence - extra_slots))


@dataclass(frozen=True)
class BatchCap:
    """How many sequences one context length holds: ``batch_size`` (<= ``max_num_seqs``; 0: none), with
    ``numbers`` saying why (what ``max_num_seqs`` would need, and what there is) and ``free_bytes`` the
    device memory it was sized from (None: not a memory budget, e.g. vLLM's KV cache)."""

    context_len: int
    batch_size: int
    max_num_seqs: int
    numbers: str = ""
    free_bytes: int | None = None

    @property
    def capped(self) -> bool:
        return self.batch_size < self.max_num_seqs

    def describe(self) -> str:
        if not self.capped:
            return f"context {self.context_len}: {self.max_num_seqs} sequences fit"
        if self.batch_size < 1:
            return f"context {self.context_len}: not even one sequence fits ({self.numbers})"
        return (f"context {self.context_len}: {self.max_num_seqs} sequences do not fit ({self.numbers}): measured up "
                f"to b={self.batch_size}, its last k extended to {self.max_num_seqs}")


def capped_batch_sizes(batch_sizes: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """The grid's batch sizes up to ``cap``, and ``cap`` itself when the grid goes beyond it."""
    if cap >= max(batch_sizes):
        return batch_sizes
    return tuple(sorted({b for b in batch_sizes if b <= cap} | {cap}))


def check_caps(caps: list[BatchCap], source: str = "--context-lens") -> None:
    """Refuse (InputError, exit 2) when a context holds not even one sequence."""
    for cap in caps:
        if cap.batch_size < 1:
            raise InputError(source, "context_len", cap.context_len, cap.describe()
                             + ": lower the context length, or give the engine more memory")
