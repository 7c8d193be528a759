"""Adaptive verification (DSpark-style): a batch-wide budget of verified draft slots.

Source: the DSpark line of work on batch-level speculative verification budgets. Its
details are not public; this "-style" version assumes the rule stated in the issue:

1. Survival. Request i's drafted token at position j is accepted with probability
   p_ij = c(top1_ij), a calibration map from the default drafter's top-1 probability
   (for an n-gram drafter, its table confidence, see ``per_request.default_features``) to
   acceptance (``ConfidenceCalibrator``: 20 bins, Beta prior at the operator's mean
   prior rate, learned online from the tested tokens only, with decay). Slot (i, j)
   is worth its survival S_ij = prod_{l<=j} p_il, the chance it yields a token.
2. Budget. Slots are admitted in descending S (S falls along j, so each request gets
   a prefix). With B slots admitted the batch expects E(B) = b + sum of their S
   tokens (b bonus tokens) in T(B), and the budget is the B that maximises

       Theta(B) = E(B) / T(B)

   i.e. admit slots while Theta rises; taking the global maximum of the curve keeps a
   kink of the measured T (odd/even query lengths) from ending admission early.
   Because the longest draft sets the drafting time (below), the ranking runs once per
   length cap c = 1..k_max (only slots j <= c compete) and the best (c, B) wins.
3. T(B) follows the cost rule of ``tabletune.cost`` with k_bar = B / b. The policy reads
   the signals of every position, so the model drafter runs every row to k_max whatever
   the budget: drafting is a fixed D(b, k_max) and the budget buys verification,

       T(B) = V~(b, B / b) + D~(b, k_max)          (``sunk_draft``, the model drafter)

   For a drafter whose signals cost nothing to read (n-gram), a step drafts what it
   verifies, priced as the padded drafter T = V~(b, k_bar) + D~(b, k_top(B)), k_top(B)
   the longest admitted prefix (``StepCost.mixed_curve_ms``; an upper bound of the
   active-rows rule). With D = 0 both are T(budget) = T(b, B / b) (``StepCost.budget_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.cost import StepCost
from tabletune.policies.base import MODEL, BatchState, Decision, PolicyContext, StepOutcome
from tabletune.policies.per_request import accepted_mask, default_features, tested_mask


class ConfidenceCalibrator:
    """p(accepted | top-1 prob) per bin: (acc + n0 a0) / (tested + n0), counts decayed per update."""

    def __init__(self, prior_rate: float, num_bins: int = 20, prior_weight: float = 5.0, decay: float = 0.999) -> None:
        self.prior_rate, self.prior_weight, self.decay = prior_rate, prior_weight, decay
        self.num_bins = num_bins
        self.accepted = np.zeros(num_bins)
        self.tested = np.zeros(num_bins)

    def bins(self, top1: np.ndarray) -> np.ndarray:
        return np.minimum((np.asarray(top1) * self.num_bins).astype(np.int64), self.num_bins - 1)

    def rates(self) -> np.ndarray:
        """[num_bins] calibrated acceptance per bin."""
        n0 = self.prior_weight
        return (self.accepted + n0 * self.prior_rate) / (self.tested + n0)

    def __call__(self, top1: np.ndarray) -> np.ndarray:
        return self.rates()[self.bins(top1)]

    def update(self, top1: np.ndarray, accepted: np.ndarray) -> None:
        """Add tested tokens (top1 values and 0/1 outcomes), after decaying the old counts."""
        self.accepted *= self.decay
        self.tested *= self.decay
        idx = self.bins(top1)
        self.tested += np.bincount(idx, minlength=self.num_bins)
        self.accepted += np.bincount(idx, weights=np.asarray(accepted, dtype=float), minlength=self.num_bins)


@dataclass(frozen=True)
class Budget:
    ks: np.ndarray  # [batch_size] admitted prefix length per request
    slots: int  # B
    expected_tokens: float  # E(B), bonus tokens included
    step_ms: float  # T(B)

    @property
    def theta(self) -> float:
        """Theta = E(B) / T(B), tokens per ms."""
        return self.expected_tokens / self.step_ms


def mixed_curve_ms(cost: StepCost, batch_size: int, k_top: np.ndarray, k_bar: np.ndarray) -> np.ndarray:
    """Vectorised StepCost.mixed_ms for many (k_top, k_bar) pairs at one batch size."""
    return cost.mixed_curve_ms(batch_size, np.asarray(k_top, dtype=float), np.asarray(k_bar, dtype=float))


def allocate_budget(survival: np.ndarray, cost: StepCost, sunk_draft: bool = False) -> Budget:
    """Admit slots by descending survival under a length cap; keep the (cap, B) maximising Theta.

    survival is [batch_size, k_max], non-increasing along each row. For each cap
    c = 1..k_max only slots with j <= c compete (the longest draft sets the drafting
    time); B* = argmax_B E(B) / T(B) on that curve; the best cap wins. B = 0 (no
    speculation) is always a candidate. One sort serves every cap: the ranking of the
    slots j <= c is the full ranking with the others left out, so all caps are
    evaluated at once on [caps, slots] arrays (first maximum wins: smaller cap, fewer slots).
    ``sunk_draft``: every row drafts k_max anyway, T = V~(b, B / b) + D~(b, k_max) (module docstring).
    """
    b, k_max = survival.shape
    if sunk_draft:
        drafting = float(np.interp(float(k_max), np.array(cost.ks, dtype=float), cost.draft_row(b)))
        curve = lambda k_top, k_bar: cost.verify_ms(b, k_bar) + drafting  # noqa: E731
    else:
        curve = lambda k_top, k_bar: mixed_curve_ms(cost, b, k_top, k_bar)  # noqa: E731
    t_off = float(curve(np.zeros(1), np.zeros(1))[0])
    if b == 0 or k_max == 0:
        return Budget(ks=np.zeros(b, np.int64), slots=0, expected_tokens=float(b), step_ms=t_off)
    flat = survival.ravel()
    order = np.argsort(-flat, kind="stable")  # ties: lower request, then lower position
    pos = order % k_max + 1  # position j of each ranked slot
    caps = np.arange(1, k_max + 1)
    admit = pos[None, :] <= caps[:, None]  # [caps, slots]: slot may be admitted under cap c
    expected = b + np.cumsum(np.where(admit, flat[order][None, :], 0.0), axis=1)
    slots = np.cumsum(admit, axis=1)
    k_top = np.maximum.accumulate(np.where(admit, pos[None, :], 0), axis=1).astype(float)
    theta = np.where(admit, expected / curve(k_top, slots / b), -np.inf)
    c, i = np.unravel_index(int(np.argmax(theta)), theta.shape)
    if theta[c, i] <= b / t_off:
        return Budget(ks=np.zeros(b, np.int64), slots=0, expected_tokens=float(b), step_ms=t_off)
    taken = order[: i + 1][admit[c, : i + 1]]
    ks = np.bincount(taken // k_max, minlength=b).astype(np.int64)
    return Budget(ks=ks, slots=int(slots[c, i]), expected_tokens=float(expected[c, i]),
                  step_ms=float(expected[c, i] / theta[c, i]))


class AdaptiveVerificationPolicy:
    """Per step: survival-ranked slots under the Theta-maximising batch budget."""

    name: ClassVar[str] = "adaptive-verification"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, num_bins: int = 20, prior_weight: float = 5.0) -> None:
        self.ctx = ctx
        prior = float(np.mean(ctx.prior_rates)) if ctx.prior_rates else 0.5
        self.calibrator = ConfidenceCalibrator(prior, num_bins=num_bins, prior_weight=prior_weight)
        self._top1: np.ndarray | None = None
        self.last: Budget | None = None

    def survival(self, top1: np.ndarray) -> np.ndarray:
        """[batch_size, k_max] S_ij = prod_{l<=j} c(top1_il)."""
        return np.cumprod(self.calibrator(top1), axis=1)

    def decide(self, state: BatchState) -> Decision:
        top1 = default_features(state, self.ctx, self.name).top1_prob[:, : self.ctx.k_max]
        self._top1 = top1
        self.last = allocate_budget(self.survival(top1), self.ctx.cost, sunk_draft=self.ctx.default_drafter == MODEL)
        return Decision.per_request(self.last.ks)

    def observe(self, outcome: StepOutcome) -> None:
        if self._top1 is None:
            return
        top1, self._top1 = self._top1, None
        update_calibrator(self.calibrator, top1, outcome, self.ctx.default_drafter)


def update_calibrator(cal: ConfidenceCalibrator, top1: np.ndarray, outcome: StepOutcome, drafter: int = MODEL) -> None:
    """Feed one step's tested tokens of ``drafter`` to the calibrator (censoring-correct)."""
    k_max = top1.shape[1]
    tested = tested_mask(outcome.ks, outcome.accepted, k_max)
    tested &= (outcome.drafter == drafter)[:, None]
    if tested.any():
        cal.update(top1[tested], accepted_mask(outcome.accepted, k_max)[tested])
