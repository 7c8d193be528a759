"""DSDE-style: per-sequence draft length from KL-divergence stability, with a batch cap.

Source: Yang et al., "DSDE: Dynamic Speculative Decoding with KLD Stability for
Real-World Serving" (arXiv 2509.01083). DSDE reads a post-hoc signal, the KL
divergence between target and draft distributions at the verified positions, and
uses its regional stability (mean and variance over recent tokens) to set each
sequence's speculation length, with an adaptive cap SL_cap against stragglers in a
large batch. This "-style" version assumes the following concrete rule.

KL signal. The simulator reports KL(target || draft) at every verified position
(``StepOutcome.kl``), drawn by its stated model (``tabletune.sim.acceptance``: a noisy
decreasing function of the token's latent acceptance margin, large where the token is
rejected); the policy uses those values as they come. For an engine that reports no KL
(``kl`` is None), the policy falls back to a proxy from what every engine has: each
drafted token's top-1 probability p1, top-1/top-2 margin, and whether it was accepted.
At temperature 0 the target distribution is one-hot at its token x, so

    KL(p_target || q_draft) = -log q(x)

exactly: -log p1 for an accepted token (x is the draft's top-1) and, for a rejected
one, -log p2 with p2 = p1 - margin (assuming the target chose the draft's runner-up,
which bounds q(x) from above and so the KL from below). Only tested tokens count
(nothing after a draft's first rejection).

Length. Over the last ``window`` KL values of a sequence, mean mu and standard
deviation sd form a stability score z = mu + sd (an unstable region, with KL
spikes, scores worse than a calm one of the same mean). The per-token acceptance
estimate and the length are

    a_hat = exp(-c * z)
    SL    = clamp(floor(log(tau) / log(a_hat)), k_min, k_max)      (tau = 1/2)

i.e. draft the tokens whose survival a_hat^j stays >= tau. A sequence with fewer
than ``min_history`` values uses ``k_start``. The scale c puts z in acceptance units:
it is refit every 50 steps on the pooled tested tokens (each paired with its
sequence's z at decision time) so that mean(exp(-c z)) = their acceptance rate
(bisection; the mean falls monotonically in c). It starts at c = 1, which is exact
for a single greedy-proxy token (exp(-KL) = q(x)).

Cap. In a batch the drafter runs for the longest draft, so one long draft stalls the
step. SL_cap = ceil(mean(SL) + std(SL)) over the batch, and every SL_i <= SL_cap.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.policies.base import BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.per_request import PerRequest

P_FLOOR = 1e-6


@dataclass(frozen=True)
class DsdeConfig:
    k_min: int = 1
    k_max: int = 8
    k_start: int = 3
    window: int = 32
    min_history: int = 4
    tau: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.k_min <= self.k_start <= self.k_max:
            raise ValueError(f"need 0 <= k_min <= k_start <= k_max, got {self.k_min}, {self.k_start}, {self.k_max}")
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"tau must lie in (0, 1), got {self.tau}")
        if self.window < 2 or self.min_history < 2:
            raise ValueError("window and min_history must be >= 2")


def kl_proxy(top1_prob: Sequence[float], margin: Sequence[float], num_accepted: int) -> list[float]:
    """Greedy-target KL of the tested tokens: -log p1 if accepted, -log(p1 - margin) for the first rejected."""
    out = [-math.log(max(p, P_FLOOR)) for p in top1_prob[:num_accepted]]
    if num_accepted < len(top1_prob):
        p2 = top1_prob[num_accepted] - margin[num_accepted]
        out.append(-math.log(max(p2, P_FLOOR)))
    return out


def stability_score(kl_history: Sequence[float], cfg: DsdeConfig) -> float | None:
    """z = mean + standard deviation of the last ``window`` KL values; None below ``min_history``."""
    if len(kl_history) < cfg.min_history:
        return None
    recent = np.fromiter(kl_history, dtype=float)[-cfg.window:]
    return float(recent.mean()) + float(recent.std())


def stable_length(z: float | None, cfg: DsdeConfig, scale: float = 1.0) -> int:
    """SL = clamp(floor(log tau / log a_hat), k_min, k_max) with a_hat = exp(-c z); k_start if z is None."""
    if z is None:
        return cfg.k_start
    log_a = -scale * z
    if log_a >= -1e-12:
        return cfg.k_max
    sl = math.floor(math.log(cfg.tau) / log_a)
    return min(max(sl, cfg.k_min), cfg.k_max)


def fit_kl_scale(z: np.ndarray, accepted: np.ndarray) -> float:
    """c with mean(exp(-c z)) = mean(accepted), by bisection on log c in [1e-3, 1e3]."""
    z = np.asarray(z, dtype=float)
    rate = float(np.mean(accepted))
    lo, hi = math.log(1e-3), math.log(1e3)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if float(np.mean(np.exp(-math.exp(mid) * z))) > rate:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def straggler_cap(lengths: Sequence[int]) -> int:
    """SL_cap = ceil(mean + std) of the batch's lengths."""
    arr = np.asarray(lengths, dtype=float)
    if len(arr) == 0:
        return 0
    return int(math.ceil(float(arr.mean()) + float(arr.std()) - 1e-9))


def capped_lengths(lengths: Sequence[int]) -> list[int]:
    """min(SL_i, SL_cap) for every sequence of the batch."""
    cap = straggler_cap(lengths)
    return [min(sl, cap) for sl in lengths]


class DsdePolicy:
    """Per request: SL from the stability of its recent KL values; the batch caps stragglers.

    The KL values come from ``StepOutcome.kl`` (the simulator's KL(target || draft) at every
    verified position, see ``tabletune.sim.acceptance``); an engine that reports none gets
    the greedy-target proxy ``kl_proxy`` from the drafted tokens' p1 and margin.
    """

    name: ClassVar[str] = "dsde"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, window: int = 32, k_start: int = 3, tau: float = 0.5,
                 cap: bool = True, pool_tokens: int = 8192, refit_steps: int = 50) -> None:
        k_max = ctx.k_max
        self.ctx = ctx
        self.cfg = DsdeConfig(k_min=1, k_max=k_max, k_start=min(k_start, k_max), window=window, tau=tau)
        self.cap = cap
        self.refit_steps = refit_steps
        self.history: PerRequest[deque] = PerRequest(lambda: deque(maxlen=self.cfg.window))
        self.scale = 1.0  # c
        self.pool_z: deque = deque(maxlen=pool_tokens)  # tested tokens: their sequence's z, and accepted
        self.pool_ok: deque = deque(maxlen=pool_tokens)
        self.steps = 0
        self._features: DraftFeatures | None = None
        self._z: list[float | None] = []

    def decide(self, state: BatchState) -> Decision:
        self._features = state.features
        self._z = [stability_score(self.history.get(rid), self.cfg) for rid in state.request_ids.tolist()]
        lengths = [stable_length(z, self.cfg, self.scale) for z in self._z]
        return Decision.per_request(np.array(capped_lengths(lengths) if self.cap else lengths, dtype=np.int64))

    def observe(self, outcome: StepOutcome) -> None:
        for i, rid in enumerate(outcome.state.request_ids.tolist()):
            k, m = int(outcome.ks[i]), int(outcome.accepted[i])
            if k == 0:
                continue
            values = self._kl_values(outcome, i, k, m)
            self.history.get(rid).extend(values)
            z = self._z[i] if i < len(self._z) else None
            if z is not None:
                n_tested = min(m + 1, k)
                self.pool_z.extend([z] * n_tested)
                self.pool_ok.extend([1] * m + [0] * (n_tested - m))
        self.history.forget(outcome)
        self._features, self._z = None, []
        self.steps += 1
        if self.steps % self.refit_steps == 0 and len(self.pool_z) >= 64:
            self.scale = fit_kl_scale(np.array(self.pool_z), np.array(self.pool_ok))

    def _kl_values(self, outcome: StepOutcome, i: int, k: int, m: int) -> list[float]:
        if outcome.kl is not None:
            values = outcome.kl[i, :k]
            return values[~np.isnan(values)].tolist()
        if self._features is not None:
            f = self._features
            return kl_proxy(f.top1_prob[i, :k].tolist(), f.margin[i, :k].tolist(), m)
        return []
