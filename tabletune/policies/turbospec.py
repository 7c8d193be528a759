"""TurboSpec-style: offline step times plus a moving average of acceptance; argmax goodput each step.

Source: the goodput-driven lineage of SmartSpec (Liu et al., arXiv 2406.14066,
"TurboSpec") and vLLM PR #32374. Rule, every step at batch size b:

    k* = argmax_{k in ks} b * E_alpha[tokens | k] / T(b, k),
    E_alpha[tokens | k] = (1 - alpha^(k+1)) / (1 - alpha)

with T(b, k) the offline step-time profile and alpha one token acceptance rate,
tracked as an exponential moving average of censored counts:
alpha = EMA(accepted draft tokens) / EMA(draft tokens reached), decay ``ema`` per step.
No exploration: positions beyond the chosen k produce no evidence.

What this "-style" version assumes: SmartSpec models acceptance with one
per-token rate (so E[tokens|k] is geometric) and estimates it with a moving
average; we use the step-level censored estimate above, start alpha at the mean
of the prior rates, and take the offline profile as the cost model (SmartSpec fits
a batch-latency model; here the measured T(b, k) is at least as accurate).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tabletune.policies.base import BatchPolicy, BatchState, PolicyContext, StepOutcome


def geometric_tokens(alpha: float, k: np.ndarray) -> np.ndarray:
    """E[tokens | k] = (1 - alpha^(k+1)) / (1 - alpha) (bonus token included; k + 1 when alpha = 1)."""
    if alpha >= 1.0 - 1e-9:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


class TurboSpec(BatchPolicy):
    name: ClassVar[str] = "turbospec"
    observe_may_lag: ClassVar[bool] = True  # observe updates the EMA from the outcome alone
    decides_ahead: ClassVar[bool] = True  # its k needs the batch size and the EMA, nothing of the last step

    def __init__(self, ctx: PolicyContext, ema: float = 0.05) -> None:
        super().__init__(ctx)
        if not 0 < ema <= 1:
            raise ValueError(f"ema must lie in (0, 1], got {ema}")
        self.ema = float(ema)
        self.alpha = float(np.mean(ctx.prior_rates))
        self._acc = self.alpha  # EMA numerator and denominator, normalised to one reached token
        self._reached = 1.0
        self._ks = np.array(sorted(ctx.ks), dtype=float)
        self._cache: dict[int, np.ndarray] = {}
        self.label = "turbospec"

    def k_for(self, state: BatchState) -> int:
        scores = geometric_tokens(self.alpha, self._ks) / self._times(state.batch_size)
        return int(self._ks[int(np.argmax(scores))])  # argmax: ties go to the smaller k

    def _times(self, b: int) -> np.ndarray:
        """T(b, k) for the allowed k, cached per batch size."""
        times = self._cache.get(b)
        if times is None:
            times = self._cache[b] = np.array([self.ctx.cost.step_ms(b, int(k)) for k in self._ks])
        return times

    def observe(self, outcome: StepOutcome) -> None:
        ks, m = outcome.ks, outcome.accepted
        reached = float(np.minimum(m + 1, ks).sum())  # censored: positions 1..min(m+1, k) were tested
        if reached == 0:
            return
        d = self.ema
        self._acc = (1 - d) * self._acc + d * float(m.sum())
        self._reached = (1 - d) * self._reached + d * reached
        self.alpha = min(max(self._acc / self._reached, 1e-3), 1.0)
