"""GammaTune-style: acceptance-driven heuristic update of each request's draft length.

Source: Gautam, Shrestha and Reddy, "Token-Driven GammaTune: Adaptive Calibration for
Enhanced Speculative Decoding" (arXiv 2504.00030). The paper adapts the speculation
length gamma (our k) from token acceptance with a heuristic switching mechanism; its
exact constants are not reproduced here. This "-style" version assumes:

* the round's oracle length is the accepted count m when a token was rejected, and
  k + 1 when all k drafted tokens were accepted (the draft was too short);
* gamma moves to that target by an exponential moving average whose weight switches
  with the outcome: a full acceptance grows gamma fast (weight ``grow`` on the target),
  a rejection shrinks it slowly (weight ``shrink``):

      target = k + 1            if m == k
               m                otherwise
      gamma <- (1 - w) * gamma + w * target,   w = grow if m == k else shrink

* k = clamp(round(gamma), k_min, k_max), per request, starting from ``k_start``.

Defaults grow = 0.5, shrink = 0.25 make one full acceptance at k add about half a token,
and a first-token rejection at k = 4 remove one token. For comparison, transformers'
``num_assistant_tokens_schedule="heuristic"`` is the additive special case
(k + 2 on full acceptance, k - 1 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.policies.base import BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.per_request import PerRequest


@dataclass(frozen=True)
class GammaTuneConfig:
    k_start: int = 4
    k_min: int = 1
    k_max: int = 8
    grow: float = 0.5
    shrink: float = 0.25

    def __post_init__(self) -> None:
        if not 0 <= self.k_min <= self.k_start <= self.k_max:
            raise ValueError(f"need 0 <= k_min <= k_start <= k_max, got {self.k_min}, {self.k_start}, {self.k_max}")
        for name in ("grow", "shrink"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)}")


def gamma_target(num_drafted: int, num_accepted: int) -> float:
    """The round's oracle length: k + 1 after a full acceptance, else the accepted count m."""
    return num_drafted + 1.0 if num_accepted >= num_drafted else float(num_accepted)


def update_gamma(gamma: float, num_drafted: int, num_accepted: int, cfg: GammaTuneConfig) -> float:
    """gamma <- (1 - w) gamma + w target, w switching between grow and shrink; clamped to [k_min, k_max]."""
    if num_drafted <= 0:
        return gamma
    w = cfg.grow if num_accepted >= num_drafted else cfg.shrink
    new = (1.0 - w) * gamma + w * gamma_target(num_drafted, num_accepted)
    return min(max(new, float(cfg.k_min)), float(cfg.k_max))


def gamma_to_k(gamma: float, cfg: GammaTuneConfig) -> int:
    """k = clamp(round(gamma), k_min, k_max), halves rounded up."""
    return min(max(int(gamma + 0.5), cfg.k_min), cfg.k_max)


class GammaTunePolicy:
    """Per request: k from its own gamma, updated after every verified draft."""

    name: ClassVar[str] = "gammatune"
    uses_features: ClassVar[bool] = False

    def __init__(self, ctx: PolicyContext, k_start: int = 4, grow: float = 0.5, shrink: float = 0.25) -> None:
        k_max = ctx.k_max
        self.ctx = ctx
        self.cfg = GammaTuneConfig(k_start=min(k_start, k_max), k_min=min(1, k_max), k_max=k_max,
                                   grow=grow, shrink=shrink)
        self.gamma: PerRequest[list[float]] = PerRequest(lambda: [float(self.cfg.k_start)])
        self._ks = np.zeros(0, np.int64)

    def decide(self, state: BatchState) -> Decision:
        ks = [gamma_to_k(self.gamma.get(rid)[0], self.cfg) for rid in state.request_ids.tolist()]
        self._ks = np.array(ks, dtype=np.int64)
        return Decision.per_request(self._ks)

    def keep_drafting(self, state: BatchState, features: DraftFeatures | None, j: int,
                      active: np.ndarray) -> np.ndarray:
        """Draft position j + 1 while j < the row's gamma length (GammaTune sets the length before drafting)."""
        return active & (self._ks > j)

    def observe(self, outcome: StepOutcome) -> None:
        for rid, k, m in zip(outcome.state.request_ids.tolist(), outcome.ks.tolist(), outcome.accepted.tolist()):
            g = self.gamma.get(rid)
            g[0] = update_gamma(g[0], k, m, self.cfg)
        self.gamma.forget(outcome)
