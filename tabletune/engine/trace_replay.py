"""Trace replay: a real drafter's recorded per-token trace, replayed on any target through the forced-rejection cap.

A trace (``tabletune acceptance --trace-out``, ``docs/formats.md``) has one row per tested draft token at output
position ``gen_pos`` g (1 = the first token after the prefill's): its signals (top-1, entropy, margin; empty for
n-gram), whether the target accepted it, and for n-gram its suffix match length. A request's trace becomes arrays
by g: signals[g] and accepted[g] of the model chain; accepted_ngram[g], match[g] and run[g] (recorded rows from g
on: its proposals) of the n-gram chain. A position the trace lacks counts as rejected with no proposal, except
the n-gram chain's bonus position after a fully accepted recorded draft (``TokenTrace.bridged``); longer
outputs wrap around the trace. ``TracedReplayDrafter`` drafts the target's own greedy continuation with these
signals and caps the accepted count at the leading run of ``accepted`` of the row's chain: the acceptance follows
the trace, verification and drafting cost what the target and a real drafter cost (an EAGLE-style head by
default), and greedy outputs stay exactly the target's (``verify`` says why).
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tabletune.engine.drafters import Drafter, DraftSlots, EagleDrafter, ReplayDrafter
from tabletune.sim.replay import bridge_bonus

ABSENT_SIGNALS = (0.5, 1.0, 0.0)  # top-1, entropy, margin of a position the trace lacks


@dataclass(frozen=True)
class TokenTrace:
    """One request's recorded draft tokens by output position (index g - 1 for gen_pos g)."""

    request: str
    signals: np.ndarray  # [n, 3] float32: top-1 probability, entropy (nats), top-1 - top-2 margin
    accepted: np.ndarray  # [n] bool: the token at g was drafted, tested and accepted
    present: np.ndarray  # [n] bool: the trace has a row at g
    match_len: np.ndarray  # [n] int64: n-gram suffix match length at g (0: none)

    def bridged(self) -> TokenTrace:
        """The trace read as an n-gram chain: the bonus position after a fully accepted recorded draft counts as
        an accepted proposal (``tabletune.sim.replay.bridge_bonus``, the simulator's reading too)."""
        present, accepted, match = bridge_bonus(self.present, self.accepted, self.match_len)
        return TokenTrace(self.request, self.signals, accepted, present, match)

    @property
    def run(self) -> np.ndarray:
        """[n] int64: recorded rows from g on without a gap (the n-gram drafter's proposals at g)."""
        out = np.zeros(len(self.present), np.int64)
        for g in range(len(out) - 1, -1, -1):
            out[g] = (out[g + 1] + 1 if g + 1 < len(out) else 1) if self.present[g] else 0
        return out


def load_token_traces(path: str | Path) -> list[TokenTrace]:
    """The per-request traces of one trace file (``.csv`` or ``.csv.gz``), in file order."""
    opener = gzip.open if str(path).endswith(".gz") else open
    rows: dict[str, list[dict]] = {}
    with opener(path, "rt") as fh:  # type: ignore[operator]
        for r in csv.DictReader(fh):
            rows.setdefault(r["request"], []).append(r)
    if not rows:
        raise ValueError(f"trace {path} has no rows")
    return [_trace(name, rs) for name, rs in rows.items()]


def _trace(name: str, rows: list[dict]) -> TokenTrace:
    n = max(int(r["gen_pos"]) for r in rows)
    signals = np.tile(np.array(ABSENT_SIGNALS, np.float32), (n, 1))
    accepted, present = np.zeros(n, bool), np.zeros(n, bool)
    match = np.zeros(n, np.int64)
    for r in rows:
        g = int(r["gen_pos"]) - 1
        present[g] = True
        accepted[g] = r["accepted"] == "1"
        match[g] = int(float(r["ngram_len"] or 0))
        if r.get("top1_prob"):
            signals[g] = (float(r["top1_prob"]), float(r["entropy"]), float(r["margin"]))
    return TokenTrace(name, signals, accepted, present, match)


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

    def host_lookup(self, slots: list[int], positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ng = self.ngram_host[np.asarray(slots, np.int64), np.asarray(positions, np.int64)]
        return ng[:, 0].copy(), np.minimum(ng[:, 1], self.engine.k_max)

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

    def load(self, slot: int, prompt_len: int, model: TokenTrace, ngram: TokenTrace | None = None) -> None:
        """Write a request's traces into its slot: output position g sits at position prompt_len + g of the
        sequence; positions past the trace wrap around it."""
        length = self.ok.shape[1]
        g = np.arange(length) - prompt_len  # output position of each sequence position
        valid = g >= 1
        im = np.where(valid, (g - 1) % len(model.accepted), 0)
        ok = np.zeros((length, 2), np.int64)
        ok[:, 0] = model.accepted[im] & valid
        ng = np.zeros((length, 2), np.int64)
        if ngram is not None:
            ngram = ngram.bridged()
            ig = np.where(valid, (g - 1) % len(ngram.accepted), 0)
            ok[:, 1] = ngram.accepted[ig] & valid
            ng[:, 0] = np.where(valid, ngram.match_len[ig], 0)
            ng[:, 1] = np.where(valid, ngram.run[ig], 0)
        dev = self.ok.device
        self.signals[slot] = torch.from_numpy(model.signals[im]).to(dev)
        self.ok[slot] = torch.from_numpy(ok).to(dev)
        self.ngram[slot] = torch.from_numpy(ng).to(dev)
        self.ngram_host[slot] = ng


def pair_traces(model: list[TokenTrace], ngram: list[TokenTrace]) -> list[tuple[TokenTrace, TokenTrace | None]]:
    """Each model-chain trace with the n-gram trace of the same request (None if it has none)."""
    by_name = {t.request: t for t in ngram}
    return [(t, by_name.get(t.request)) for t in model]


def leading_runs(accepted: np.ndarray, k_max: int) -> np.ndarray:
    """[n] the leading run of accepted flags (at most k_max) from each position, wrapping around."""
    n = len(accepted)
    idx = (np.arange(n)[:, None] + np.arange(k_max)[None, :]) % n
    return np.cumprod(accepted[idx], axis=1).sum(axis=1)


def replay_rates(traces: list[TokenTrace], k_max: int) -> tuple[float, ...]:
    """Conditional rates a_1..a_k_max of the replay, a draft starting at a uniform position of each trace:

        a_j = #(runs >= j) / #(runs >= j - 1)       (a rate with no draft reaching j: the last known one)
    """
    runs = np.concatenate([leading_runs(t.accepted, k_max) for t in traces])
    out: list[float] = []
    for j in range(1, k_max + 1):
        reached = int((runs >= j - 1).sum())
        out.append(float((runs >= j).sum()) / reached if reached else (out[-1] if out else 0.0))
    return tuple(max(a, 1e-3) for a in out)


def ngram_length_rates(traces: list[TokenTrace], l_max: int = 16) -> tuple[float, ...]:
    """rates[L] = accepted share of the n-gram chain's recorded tokens at match length L (index 0: 0)."""
    match = np.concatenate([t.match_len[t.present] for t in traces])
    ok = np.concatenate([t.accepted[t.present] for t in traces])
    out = [0.0]
    for length in range(1, l_max + 1):
        sel = np.minimum(match, l_max) == length
        out.append(float(ok[sel].mean()) if sel.any() else out[-1])
    return tuple(out)
