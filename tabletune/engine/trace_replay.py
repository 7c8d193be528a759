"""Trace replay: a real drafter's recorded per-token trace, replayed on any target through the forced-rejection cap.

A request's trace (``tabletune.token_trace.TokenTrace``: signals, acceptance, n-gram match and proposals by output
position g) is written into its slot by sequence position; longer outputs wrap around the trace.
``TracedReplayDrafter`` drafts the target's own greedy continuation with these signals and caps the accepted count
at the leading run of ``accepted`` of the row's chain (the n-gram chain read ``bridged``): the acceptance follows
the trace, verification and drafting cost what the target and a real drafter cost (an EAGLE-style head by
default), and greedy outputs stay exactly the target's (``verify`` says why).
"""

from __future__ import annotations

import numpy as np
import torch

from tabletune.engine.drafters import Drafter, DraftSlots, EagleDrafter, ReplayDrafter
from tabletune.token_trace import TokenTrace
# benchmarks/engine_grid_sim.py imports these from here
from tabletune.token_trace import load_token_traces, ngram_length_rates, pair_traces, replay_rates  # noqa: F401


class TracedReplayDrafter(ReplayDrafter):
    """The replay drafter with per-slot traces by sequence position (``load``): the drafted tokens' recorded
    signals, and per chain (model, n-gram) the leading run of recorded acceptances, the step's cap.

    Drafting costs what the real drafter costs: ``cost`` (default: an EAGLE-style head of random weights on the
    target, ``EagleDrafter``; or any drafter, e.g. a ``DraftModelDrafter`` of the draft model's shape; the null
    ``Drafter()``: free) runs its own catch-up and per-position computation for exactly the rows and positions
    drafted, into private arrays; the drafts verified and the signals read are the oracle's and the trace's."""

    name = "trace"
    has_meta = True

    def __init__(self, cost: Drafter | None = None) -> None:
        self.cost = cost

    def setup(self, engine) -> None:
        super().setup(engine)
        self.cost = self.cost or EagleDrafter(engine.target)
        self.cost.setup(engine)
        self.cost.out = DraftSlots(engine.drafts.clone(), engine.draft_sig.clone())
        s, n, dev = engine.cache.num_slots + 1, engine.cfg.max_len, engine.device
        self.signals = torch.zeros(s, n, 3, device=dev)  # top-1, entropy, margin by position
        self.ok = torch.zeros(s, n, 2, dtype=torch.long, device=dev)  # accepted: model, n-gram chain
        self.ngram = torch.zeros(s, n, 2, dtype=torch.long, device=dev)  # n-gram match length, proposals
        self.ngram_host = np.zeros((s, n, 2), np.int64)  # the same on the host, for the lookup before drafting

    def begin(self, slots, start, last, k):
        self.lookup(slots, start, last, k)
        self.cost.begin(slots, start, last, k)

    def host_lookup(self, slots: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ng = self.ngram_host[np.asarray(slots, np.int64), np.asarray(positions, np.int64)]  # a fresh array
        return ng[:, 0], np.minimum(ng[:, 1], self.engine.k_max)

    def lookup(self, slots, start, last, k):
        """The replayed drafts, signals and chains' runs (no drafting cost: a row put on the n-gram chain before
        drafting pays its verification only)."""
        super().begin(slots, start, last, k)
        k_max = self.engine.k_max
        idx = start[:, None] + 1 + torch.arange(k_max, device=start.device)
        self.out.signals[slots] = self.signals[slots].gather(1, idx[..., None].expand(-1, -1, 3))
        ok = self.ok[slots].gather(1, idx[..., None].expand(-1, -1, 2))
        ngram = self.ngram[slots].gather(1, (start + 1)[:, None, None].expand(-1, 1, 2))[:, 0]
        self.engine.draft_meta[slots] = torch.cat([ngram[:, :1], ngram[:, 1:].clamp_max(k_max),
                                                   torch.cumprod(ok, dim=1).sum(1)], 1)

    def draft(self, slots, j):
        self.cost.draft(slots, j)

    def prefill(self, *args):
        self.cost.prefill(*args)

    def observe(self, *args):
        self.cost.observe(*args)

    def reset(self, *args):
        self.cost.reset(*args)

    def load(self, slot: int, prompt_len: int, model: TokenTrace, ngram: TokenTrace | None = None,
             offset: int = 0) -> None:
        """Write a request's traces into its slot: output position g reads the traces' row g - 1 + offset, at
        position prompt_len + g of the sequence; rows past the trace wrap around it (an n-gram proposal does not:
        its run ends with the trace)."""
        length = self.ok.shape[1]
        g = np.arange(length) - prompt_len  # output position of each sequence position
        valid = g >= 1
        im = np.where(valid, (g - 1 + offset) % len(model.accepted), 0)
        ok = np.zeros((length, 2), np.int64)
        ok[:, 0] = model.accepted[im] & valid
        ng = np.zeros((length, 2), np.int64)
        if ngram is not None:
            ngram = ngram.bridged().fitted(len(model.accepted))  # the two chains wrap together
            ok[:, 1] = ngram.accepted[im] & valid
            ng[:, 0] = np.where(valid, ngram.match_len[im], 0)
            ng[:, 1] = np.where(valid, ngram.run[im], 0)
        dev = self.ok.device
        self.signals[slot] = torch.from_numpy(model.signals[im]).to(dev)
        self.ok[slot] = torch.from_numpy(ok).to(dev)
        self.ngram[slot] = torch.from_numpy(ng).to(dev)
        self.ngram_host[slot] = ng
