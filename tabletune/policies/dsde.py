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
(``kl`` is None), or a setting whose default drafter is the n-gram one, the policy falls
back to a proxy from what every engine has: each drafted token's top-1 probability p1,
top-1/top-2 margin, and whether it was accepted.
At temperature 0 the target distribution is one-hot at its token x, so

    KL(p_target || q_draft) = -log q(x)

exactly: -log p1 for an accepted token (x is the draft's top-1) and, for a rejected
one, -log p2 with p2 = p1 - margin (assuming the target chose the draft's runner-up,
which bounds q(x) from above and so the KL from below). Only tested tokens count
(nothing after a draft's first rejection).

Length. Over a sequence's recent KL values, the exponentially weighted mean mu and
standard deviation sd (span ``window`` tokens: weight alpha = 2 / (window + 1) per
value, mu <- mu + alpha d, var <- (1 - alpha)(var + alpha d^2) with d = x - mu)
form a stability score z = mu + sd (an unstable region, with KL spikes, scores worse
than a calm one of the same mean). The per-token acceptance estimate and the length are

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.policies.base import MODEL, BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.per_request import accepted_mask, default_features, tested_mask

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
        if self.window < 2 or self.min_history < 1:
            raise ValueError("window must be >= 2 and min_history >= 1")

    @property
    def alpha(self) -> float:
        return 2.0 / (self.window + 1.0)


def kl_proxy(top1_prob: np.ndarray, margin: np.ndarray, ks: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """[b, k_max] greedy-target KL of the tested tokens, NaN elsewhere.

    -log p1 at accepted positions, -log(p1 - margin) at the first rejected one (if drafted).
    """
    k_max = top1_prob.shape[1]
    acc = accepted_mask(accepted, k_max)
    tested = tested_mask(ks, accepted, k_max)
    p = np.where(acc, top1_prob, top1_prob - margin)
    return np.where(tested, -np.log(np.maximum(p, P_FLOOR)), np.nan)


def ew_update(mean: np.ndarray, var: np.ndarray, count: np.ndarray, x: np.ndarray,
              alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One exponentially weighted mean/variance update per row where x is not NaN (the first value sets mu)."""
    valid = ~np.isnan(x)
    first = valid & (count == 0)
    d = np.where(valid, x - mean, 0.0)
    new_mean = np.where(first, x, mean + alpha * d)
    new_var = np.where(first, 0.0, np.where(valid, (1.0 - alpha) * (var + alpha * d * d), var))
    return new_mean, new_var, count + valid


def stable_lengths(z: np.ndarray, cfg: DsdeConfig, scale: float = 1.0) -> np.ndarray:
    """SL = clamp(floor(log tau / log a_hat), k_min, k_max), a_hat = exp(-c z); k_start where z is NaN."""
    z = np.asarray(z, dtype=float)
    log_a = -scale * np.maximum(np.nan_to_num(z, nan=1.0), 1e-12)
    sl = np.clip(np.floor(math.log(cfg.tau) / log_a), cfg.k_min, cfg.k_max)
    return np.where(np.isnan(z), cfg.k_start, sl).astype(np.int64)


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


def straggler_cap(lengths: Sequence[int] | np.ndarray) -> int:
    """SL_cap = ceil(mean + std) of the batch's lengths."""
    arr = np.asarray(lengths, dtype=float)
    if len(arr) == 0:
        return 0
    return int(math.ceil(float(arr.mean()) + float(arr.std()) - 1e-9))


def capped_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """min(SL_i, SL_cap) for every sequence of the batch."""
    arr = np.asarray(lengths, dtype=np.int64)
    return np.minimum(arr, straggler_cap(arr))


class DsdePolicy:
    """Per request: SL from the stability of its recent KL values; the batch caps stragglers.

    The KL values come from ``StepOutcome.kl`` (the simulator's KL(target || draft) at every
    verified position, see ``tabletune.sim.acceptance``); an engine that reports none, or a
    setting whose default drafter is the n-gram one (the engine's KL is the model drafter's),
    gets the greedy-target proxy ``kl_proxy`` from the default drafter's p1 and margin.
    Per-request statistics live in arrays (one row per running request, rows reused).
    """

    name: ClassVar[str] = "dsde"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, window: int = 32, k_start: int = 3, tau: float = 0.5,
                 cap: bool = True, pool_tokens: int = 8192, refit_steps: int = 50) -> None:
        k_max = ctx.k_max
        self.ctx = ctx
        self.cfg = DsdeConfig(k_min=min(1, k_max), k_max=k_max, k_start=min(k_start, k_max), window=window, tau=tau)
        self.cap = cap
        self.refit_steps, self.pool_tokens = refit_steps, pool_tokens
        self.rows: dict[int, int] = {}
        self.free: list[int] = []
        self.mean, self.var, self.count = np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
        self.scale = 1.0  # c
        self.pool: list[tuple[np.ndarray, np.ndarray]] = []  # tested tokens: (their sequence's z, accepted)
        self.steps = 0
        self._features: DraftFeatures | None = None
        self._z = np.zeros(0)

    def row_of(self, request_ids: np.ndarray) -> np.ndarray:
        """Array rows of the requests (new requests get a free or new row)."""
        out = []
        for rid in request_ids.tolist():
            row = self.rows.get(rid)
            if row is None:
                if not self.free:
                    n = len(self.mean)
                    self.free = list(range(max(2 * n, 16) - 1, n - 1, -1))
                    grow = max(2 * n, 16) - n
                    self.mean = np.r_[self.mean, np.zeros(grow)]
                    self.var = np.r_[self.var, np.zeros(grow)]
                    self.count = np.r_[self.count, np.zeros(grow, np.int64)]
                row = self.rows[rid] = self.free.pop()
                self.mean[row] = self.var[row] = self.count[row] = 0
            out.append(row)
        return np.array(out, dtype=np.int64)

    def scores(self, request_ids: np.ndarray) -> np.ndarray:
        """z = mu + sd per request; NaN below ``min_history`` values."""
        rows = self.row_of(request_ids)
        z = self.mean[rows] + np.sqrt(self.var[rows])
        return np.where(self.count[rows] >= self.cfg.min_history, z, np.nan)

    def decide(self, state: BatchState) -> Decision:
        self._features = default_features(state, self.ctx, self.name) if state.features is not None else None
        self._z = self.scores(state.request_ids)
        lengths = stable_lengths(self._z, self.cfg, self.scale)
        return Decision.per_request(capped_lengths(lengths) if self.cap else lengths)

    def observe(self, outcome: StepOutcome) -> None:
        rows = self.row_of(outcome.state.request_ids)
        values = self._kl_values(outcome)
        if values is not None:
            mean, var, count = self.mean[rows], self.var[rows], self.count[rows]
            width = int(outcome.ks.max()) if len(outcome.ks) else 0  # later columns are all NaN
            for j in range(min(width, values.shape[1])):
                mean, var, count = ew_update(mean, var, count, values[:, j], self.cfg.alpha)
            self.mean[rows], self.var[rows], self.count[rows] = mean, var, count
        self._pool(outcome)
        for rid in outcome.finished_ids.tolist():
            row = self.rows.pop(int(rid), None)
            if row is not None:
                self.free.append(row)
        self._features = None
        self.steps += 1
        if self.steps % self.refit_steps == 0 and self.pool:
            z = np.concatenate([p[0] for p in self.pool])[-self.pool_tokens:]
            ok = np.concatenate([p[1] for p in self.pool])[-self.pool_tokens:]
            self.pool = [(z, ok)]
            if len(z) >= 64:
                self.scale = fit_kl_scale(z, ok)

    def _pool(self, outcome: StepOutcome) -> None:
        """Pair each tested token with its sequence's z at decision time (for the scale c)."""
        if len(self._z) != len(outcome.ks):
            return
        k_max = self.ctx.k_max
        tested = tested_mask(outcome.ks, outcome.accepted, k_max) & ~np.isnan(self._z)[:, None]
        if tested.any():
            z = np.broadcast_to(self._z[:, None], tested.shape)[tested]
            self.pool.append((z, accepted_mask(outcome.accepted, k_max)[tested].astype(float)))

    def _kl_values(self, outcome: StepOutcome) -> np.ndarray | None:
        k_max = self.ctx.k_max
        if outcome.kl is not None and self.ctx.default_drafter == MODEL:
            return outcome.kl[:, :k_max]
        if self._features is not None:
            f = self._features
            return kl_proxy(f.top1_prob[:, :k_max], f.margin[:, :k_max], outcome.ks, outcome.accepted)
        return None
