"""The headroom of a cell: what an oracle that knows each draft's fate reaches, and a policy's share of it.

``FateOracle`` is a policy the simulator shows, before each step, the fate of every row's
draft (``fate[i]`` = m_i, the leading run of positions the target would accept, at most
k_max; from the replayed trace or the drawn acceptance) and, when the n-gram chain is
replayed, the fate of the n-gram drafter's proposal (``fate_ngram[i]``, its accepted run
within the tokens it proposes); a row takes the chain with the longer run (the n-gram chain
on ties: it takes no model drafting), so the oracle bounds Hybrid Spark's two drafters as well. It never drafts a rejected token
(a row stops at its first rejection) and, per step, picks the cap c that maximises the
step's tokens per ms under the cost rule (``tabletune.cost``):

    k_i(c) = min(m_i, c),   c* = argmax_c  sum_i (k_i(c) + 1) / T(b; k(c), d(c))

with d_i = k_i on the model chain and d_i = 0 on the n-gram chain (a lookup, no model drafting),
so each row drafts and verifies exactly the tokens it keeps, and a row's accepted run is
cut only where drafting it would cost more than it earns at that batch size (each request's
best k given the fates; myopic, one step at a time). The cell's headroom is

    oracle_ratio = oracle tok/s / best fixed-k tok/s      (>= 1 up to the oracle's myopia)
    headroom_share = (ratio - 1) / (oracle_ratio - 1)     (1: all of it; < 0: below the best fixed k)

for a policy whose tok/s over the best fixed k is ``ratio``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tabletune.cost import active_rows
from tabletune.policies.base import MODEL, NGRAM, BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome


class FateOracle:
    """Stops every row at its first rejection; per step the cap c* of the module docstring."""

    name: ClassVar[str] = "oracle"
    uses_features: ClassVar[bool] = True
    sees_fate: ClassVar[bool] = True  # the simulator sets ``fate`` before each decide

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self.fate: np.ndarray | None = None  # [batch_size] accepted run m_i of the coming step
        self.fate_ngram: np.ndarray | None = None  # [batch_size] the n-gram chain's, when it is replayed
        self._ks = np.zeros(0, np.int64)

    def decide(self, state: BatchState) -> Decision:
        if self.fate is None or len(self.fate) != state.batch_size:
            raise ValueError("oracle: the simulator must set the step's fate before decide")
        fate, drafter = self.fate, None
        if self.fate_ngram is not None:
            use_ng = (self.fate_ngram >= fate) & (self.fate_ngram > 0)
            fate, drafter = np.where(use_ng, self.fate_ngram, fate), np.where(use_ng, NGRAM, MODEL)
        self._ks = oracle_lengths(fate, self.ctx, None if drafter is None else drafter == NGRAM)
        return Decision.per_request(self._ks, drafter)

    def keep_drafting(self, state: BatchState, features: DraftFeatures | None, j: int,
                      active: np.ndarray) -> np.ndarray:
        return active & (self._ks > j)

    def observe(self, outcome: StepOutcome) -> None:
        self.fate = self.fate_ngram = None


def oracle_lengths(fate: np.ndarray, ctx: PolicyContext, free: np.ndarray | None = None) -> np.ndarray:
    """[b] k_i = min(m_i, c*) with c* = argmax_c sum_i (min(m_i, c) + 1) / T(b; min(m, c), d) (ties: smaller c);
    d_i = min(m_i, c), or 0 on the ``free`` rows (n-gram: no model drafting)."""
    b, k_max = len(fate), ctx.k_max
    m = np.minimum(np.asarray(fate, dtype=np.int64), k_max)
    if b == 0:
        return m
    caps = np.arange(k_max + 1)
    ks = np.minimum(m[None, :], caps[:, None])  # [caps, b]
    drafted = ks if free is None else np.where(free[None, :], 0, ks)
    step_ms = ctx.cost.rows_ms(b, active_rows(drafted, k_max), ks.mean(axis=1))
    c = int(np.argmax((b + ks.sum(axis=1)) / step_ms))
    return ks[c]


def oracle_ratio(oracle_tok_s: float, best_fixed_tok_s: float) -> float:
    """The oracle's tok/s over the best fixed k of the same cell."""
    if best_fixed_tok_s <= 0:
        raise ValueError(f"best fixed-k tok/s must be > 0, got {best_fixed_tok_s}")
    return oracle_tok_s / best_fixed_tok_s


def headroom_share(ratio: float, oracle: float) -> float | None:
    """(ratio - 1) / (oracle_ratio - 1); None when the oracle has no headroom (oracle_ratio <= 1)."""
    return (ratio - 1.0) / (oracle - 1.0) if oracle > 1.0 else None
