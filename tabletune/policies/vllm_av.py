"""vLLM's adaptive verification, reimplemented here as the shipped peer (``vllm-av``).

"-style" reimplementation of vLLM's adaptive verification (vLLM PRs #47808 "DSpark
confidence-scheduled verification" and #52228 "Acceptance estimation for adaptive
verification", ``"enable_adaptive_verification": true`` on the V2 model runner), from
their descriptions; no code is copied. Every request drafts the full ``k_max`` tokens
(vLLM drafts ``num_speculative_tokens``; only verification adapts), so it has no
``keep_drafting``; the step verifies a prefix of each draft:

1. Startup cost model, timed once at one context (vLLM times dummy steps at a synthetic
   context of 8192 tokens; here: the engine's own profile ``ctx.cost`` at its context),
   as two 1-D curves (``StartupCost``):

       verify_ms[t]  target forward over t query tokens in total, t = 1..b_max (k_max + 1);
                     t <= k_max + 1: one request of t tokens, V(1, t - 1); above: full rows
                     of k_max + 1 tokens, V(t / (k_max + 1), k_max), linear in t between them
       draft_ms[n]   the drafter's k_max-token chain for n requests, D(n, k_max)

   with D the profile's drafting time (split rule) or f (T - T(b, 0)) (draft share f), and
   V = T - D. Assumed: the dummy steps pack tokens into full rows; nothing in the model
   depends on how the t tokens split into requests (b and k jointly), on the context the
   requests actually have, or on a user's measured profile.
2. Survival from the drafter's confidences (#52228): p_ij = sigmoid(w logit(top1_ij) + c_j),
   one slope w and an intercept c_j per position, fitted by logistic regression (Newton,
   a small ridge) on the tokens the target tested (censoring-correct: positions
   j <= min(m + 1, k)), refitted every ``refit_every`` steps (100) on the last ``memory``
   tested tokens. S_ij = prod_{l<=j} p_il. For the first ``warmup_steps`` steps (300)
   every draft is verified in full, to collect unbiased outcomes.
3. Batch budget over the flat list of the n k_max slots sorted by S (descending),

       B* = argmax_B (n + sum of the B best S) / (draft_ms[n] + verify_ms[n + B]),

   then the global top-B* slots are verified; S falls along a row, so each request keeps
   a prefix. Ties are broken by request then position (stable sort).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.cost import StepCost
from tabletune.policies.base import BatchState, Decision, PolicyContext, StepOutcome
from tabletune.controller.calibration import LogitCalibration
from tabletune.policies.per_request import default_features, tested_mask


def drafting_ms(cost: StepCost, batch_size: float) -> np.ndarray:
    """D(b, k) over the measured ks at one b: the split rule's drafting profile, else f (T - T(b, 0))."""
    row = cost.row(batch_size)
    drow = cost.draft_row(batch_size)
    return drow if drow is not None else cost.draft_share * (row - row[0])


@dataclass(frozen=True)
class StartupCost:
    """verify_ms by total query tokens and draft_ms by request count (module docstring, 1)."""

    verify_tokens: np.ndarray  # [points] total query tokens t, increasing
    verify_ms: np.ndarray  # [points] target forward time at t tokens
    draft_requests: np.ndarray  # [points] request counts n
    draft_ms: np.ndarray  # [points] drafter time of a k_max chain for n requests

    @classmethod
    def from_cost(cls, cost: StepCost, k_max: int) -> StartupCost:
        ks = np.array(cost.ks, dtype=float)
        bs = np.array(cost.profile.batch_sizes, dtype=float)

        def verify(b: float, k: float) -> float:
            return float(np.interp(k, ks, cost.row(b) - drafting_ms(cost, b)))

        width = k_max + 1
        small = [(t, verify(1, t - 1)) for t in range(1, width)]
        full = [(b * width, verify(b, k_max)) for b in bs]
        tokens, times = zip(*sorted(small + full))
        drafts = [float(np.interp(k_max, ks, drafting_ms(cost, b))) for b in bs]
        return cls(np.array(tokens, float), np.array(times, float), bs, np.array(drafts, float))

    def verify_at(self, tokens: np.ndarray | float) -> np.ndarray:
        return np.interp(tokens, self.verify_tokens, self.verify_ms)

    def draft_at(self, num_requests: float) -> float:
        return float(np.interp(num_requests, self.draft_requests, self.draft_ms))


@dataclass(frozen=True)
class AvBudget:
    ks: np.ndarray  # [batch_size] verified prefix per request
    slots: int  # B*
    expected_tokens: float  # n + sum of the admitted survivals
    step_ms: float  # draft_ms[n] + verify_ms[n + B*]


def av_budget(survival: np.ndarray, startup: StartupCost) -> AvBudget:
    """B* = argmax_B (n + top-B sum of S) / (draft_ms[n] + verify_ms[n + B]); the top-B* slots, as prefixes."""
    n, k_max = survival.shape
    flat = survival.ravel()
    order = np.argsort(-flat, kind="stable")
    expected = n + np.concatenate([[0.0], np.cumsum(flat[order])])  # [n k_max + 1], B = 0..n k_max
    step_ms = startup.draft_at(n) + startup.verify_at(n + np.arange(len(expected)))
    best = int(np.argmax(expected / step_ms))
    ks = np.bincount(order[:best] // k_max, minlength=n).astype(np.int64) if k_max else np.zeros(n, np.int64)
    return AvBudget(ks, best, float(expected[best]), float(step_ms[best]))


class VllmAdaptiveVerification:
    """vLLM's adaptive verification (module docstring): full drafts, a global top-B* verified."""

    name: ClassVar[str] = "vllm-av"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, warmup_steps: int = 300, refit_every: int = 100,
                 memory: int = 20_000) -> None:
        if warmup_steps < 0 or refit_every < 1 or memory < 1:
            raise ValueError(f"vllm-av: warmup_steps >= 0, refit_every >= 1, memory >= 1; got "
                             f"{warmup_steps}, {refit_every}, {memory}")
        self.ctx = ctx
        self.warmup_steps, self.refit_every = warmup_steps, refit_every
        self.startup = StartupCost.from_cost(ctx.cost, ctx.k_max)
        self.calibration = LogitCalibration(ctx.k_max, memory)
        self.steps = 0
        self.last: AvBudget | None = None
        self._top1: np.ndarray | None = None

    def decide(self, state: BatchState) -> Decision:
        k_max = self.ctx.k_max
        self._top1 = default_features(state, self.ctx, self.name).top1_prob[:, :k_max]
        if self.steps < self.warmup_steps:
            self.last = None
            return Decision.per_request(np.full(state.batch_size, k_max, np.int64))
        self.last = av_budget(np.cumprod(self.calibration(self._top1), axis=1), self.startup)
        return Decision.per_request(self.last.ks)

    def observe(self, outcome: StepOutcome) -> None:
        self.steps += 1
        if self._top1 is not None:
            top1, self._top1 = self._top1, None
            k_max = top1.shape[1]
            tested = tested_mask(outcome.ks, outcome.accepted, k_max)
            tested &= (outcome.drafter == self.ctx.default_drafter)[:, None]
            rows, cols = np.nonzero(tested)
            self.calibration.add(top1[rows, cols], cols, (cols < outcome.accepted[rows]).astype(float))
        if self.steps % self.refit_every == 0:
            self.calibration.refit()
