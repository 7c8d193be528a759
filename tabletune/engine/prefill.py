"""The target's prompt pass, eager or replayed from a CUDA graph per prompt length (docs/engine.md).

A prompt of a length up to ``max_len`` runs eager the first two times (the first makes the GEMM choices of its
shapes); after the second its length is captured, and later prompts of that length replay the graph with their own
tokens and slot, so one-off lengths cost no capture. At most ``PREFILL_GRAPHS`` lengths get one, each in its own
memory pool (a prefill replays between the steps' graphs, never inside them).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass

import torch

from tabletune.engine.kv_cache import KVCache
from tabletune.engine.model import Decoder

PREFILL_GRAPHS = 16  # prompt lengths that get a prefill graph (each holds its own memory pool)
log = logging.getLogger(__name__)


@contextlib.contextmanager
def collector_paused():
    """Python's garbage collector run first, then off for the block (a CUDA graph capture): an earlier engine's
    graphs, freed by a collection that fell inside the capture, would invalidate it."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class PrefillGraph:
    """The target's prefill of one prompt length, captured: write ``tokens`` and ``slot``, replay, read ``hidden``
    [n, hidden] and ``logits`` [1, vocab] (the last position's, fp32); both are overwritten by the next replay."""
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # [n] int64
    slot: torch.Tensor  # [1] int64
    hidden: torch.Tensor
    logits: torch.Tensor


class Prefill:
    """``prefill(tokens, slot)``: (hidden [n, hidden], the last position's logits [1, vocab] fp32) of one prompt
    ``tokens`` [n] written into cache slot ``slot`` [1]. ``max_len`` 0: always eager."""

    def __init__(self, target: Decoder, cache: KVCache, max_len: int) -> None:
        self.target, self.cache, self.max_len = target, cache, max_len
        self.graphs: dict[int, PrefillGraph] = {}  # prompt length -> its captured prefill
        self.seen: dict[int, int] = {}  # prompt length -> prompts of that length prefilled so far

    def forward(self, tokens: torch.Tensor, slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager pass."""
        zero = torch.zeros(1, dtype=torch.long, device=tokens.device)
        hidden = self.target(tokens[None], zero, slot, self.cache, prefill_at=(0, slot))[0]
        return hidden, self.target.logits(hidden[-1:]).float()

    def __call__(self, tokens: torch.Tensor, slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = tokens.shape[0]
        pg = self.graphs.get(n)
        if pg is not None:
            pg.tokens.copy_(tokens)
            pg.slot.copy_(slot)
            pg.graph.replay()
            return pg.hidden, pg.logits
        out = self.forward(tokens, slot)
        self.seen[n] = seen = self.seen.get(n, 0) + 1
        if seen >= 2 and n <= self.max_len and len(self.graphs) < PREFILL_GRAPHS:
            try:
                self.graphs[n] = self.capture(tokens.clone(), slot.clone())
            except RuntimeError as exc:  # a forward that cannot be captured: eager from now on, serving goes on
                log.warning("prefill of %d tokens not captured (%s); prompts run eager", n, exc)
                self.max_len = 0
        return out

    def capture(self, tokens: torch.Tensor, slot: torch.Tensor) -> PrefillGraph:
        """``forward`` of these static inputs captured as a CUDA graph, in its own memory pool. The capture is
        thread-local: a prefill is captured while serving, and another thread's CUDA work (the online head's
        updates on their side stream) must neither be captured nor fail the capture."""
        g = torch.cuda.CUDAGraph()
        with collector_paused(), torch.cuda.graph(g, capture_error_mode="thread_local"):
            hidden, logits = self.forward(tokens, slot)
        return PrefillGraph(g, tokens, slot, hidden, logits)
