"""DSDE: per-sequence speculation length from the stability of recent KL divergences, with a batch cap.

Source: Yang et al., "DSDE: Dynamic Speculative Decoding with KLD Stability for
Real-World Serving" (arXiv 2509.01083), and the authors' released vLLM-based code
(repository samsungsds-research-paper/DSDE, ``vllm/spec_decode/dynamic_scheduler.py``,
its ``KLScheduler`` and ``coordinate_batch_k``; vLLM PR #26504 upstreams per-sequence
lengths). Reimplemented from that description, not copied. Per sequence:

* History. KL(target || draft) of every verified draft token goes into the sequence's
  history of the last ``window`` = 30 values (the authors' ``dsl_activation_tokens``).
* Warm-up, until the history holds ``window`` values: k starts at ``k_start``, doubles
  (capped at k_max) after a draft that was accepted in full and stays otherwise; the
  accepted counts m and KL values are logged. At the end the sequence's bounds are

      k_hi = clamp(round(max m * (1 + 0.5 * mean KL / max KL)), k_min, k_max)
      k_lo = clamp(ceil(0.1 * k_hi), k_min, k_hi)

* Length (after warm-up), from the weighted variance intensity ratio of the history
  (WVIR: the weighted variance of its last n // 3 values over that of all n, weights
  0.9^age; 20 when the long-window variance is below 1e-6; 0 below 2 values) and the
  mean KL of the last step's draft, kl_bar:

      SF = exp(2 * kl_bar) - 1                          (temperature 0)
      SL = max(k_lo, ceil((k_hi - k_lo) * (1 - WVIR * SF) + k_lo))   if WVIR * SF <= 1
      SL = k_lo                                                      otherwise

* Cap. In a batch the drafter runs for the longest draft, so SL_cap = ceil(mean SL)
  over the batch's sequences past warm-up, and each of them drafts min(SL, SL_cap).

KL signal. The simulator reports KL(target || draft) at every verified position
(``StepOutcome.kl``, by its stated model in ``tabletune.sim.acceptance``). For an engine
that reports none, trace replay, or an n-gram default drafter, the policy uses a proxy
from what every engine has: at temperature 0 the target is one-hot at its token x, so
KL = -log q(x): -log p1 for an accepted token and, for the first rejected one,
-log p2 with p2 = p1 - margin (assuming the target chose the draft's runner-up); only
tested tokens count.

Assumed where the code leaves it open: during warm-up the sequence drafts its doubling
k (the code also returns k_min from the scheduler there); k_start = 3, k_min = 1 and
k_max = the context's k_max (the authors' defaults depend on their vLLM config).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from tabletune.policies.base import MODEL, BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.per_request import PerRequest, accepted_mask, default_features, tested_mask

P_FLOOR = 1e-6
SF_ALPHA = 2.0  # SF = exp(2 * kl_bar) - 1
DECAY = 0.9  # WVIR weights 0.9^age


def kl_proxy(top1_prob: np.ndarray, margin: np.ndarray, ks: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """[b, k_max] greedy-target KL of the tested tokens, NaN elsewhere.

    -log p1 at accepted positions, -log(p1 - margin) at the first rejected one (if drafted).
    """
    k_max = top1_prob.shape[1]
    acc = accepted_mask(accepted, k_max)
    tested = tested_mask(ks, accepted, k_max)
    p = np.where(acc, top1_prob, top1_prob - margin)
    return np.where(tested, -np.log(np.maximum(p, P_FLOOR)), np.nan)


def weighted_variance(values: np.ndarray, weights: np.ndarray) -> float:
    """sum w (x - mean_w)^2 / sum w, mean_w = sum w x / sum w."""
    mean = float((weights * values).sum() / weights.sum())
    return float((weights * (values - mean) ** 2).sum() / weights.sum())


def intensity_ratio(history: Sequence[float], decay: float = DECAY) -> float:
    """WVIR: weighted variance of the last n // 3 values over that of all n (weights decay^age)."""
    x = np.asarray(history, dtype=float)
    n = len(x)
    if n < 2:
        return 0.0
    short = max(1, n // 3)
    long_var = weighted_variance(x, decay ** np.arange(n - 1, -1, -1))
    if long_var < 1e-6:
        return 20.0
    return weighted_variance(x[-short:], decay ** np.arange(short - 1, -1, -1)) / long_var


def dsl_length(wvir: float, kl_bar: float, k_lo: int, k_hi: int) -> int:
    """SL from WVIR and the last step's mean KL (module docstring)."""
    risk = wvir * (math.exp(SF_ALPHA * kl_bar) - 1.0)
    if risk <= 1.0:
        return max(k_lo, math.ceil((k_hi - k_lo) * (1.0 - risk) + k_lo - 1e-9))
    return k_lo


def dynamic_bounds(accepted: Sequence[int], kls: Sequence[float], k_min: int, k_max: int) -> tuple[int, int]:
    """(k_lo, k_hi) at the end of warm-up (module docstring); (k_min, k_max) without samples."""
    if not accepted:
        return k_min, k_max
    mean_kl = float(np.mean(kls)) if len(kls) else 0.0
    max_kl = float(np.max(kls)) if len(kls) else 1.0
    max_kl = max_kl if max_kl != 0 else 1.0
    k_hi = min(k_max, max(k_min, round(max(accepted) * (1.0 + 0.5 * mean_kl / max_kl))))
    k_lo = min(k_hi, max(k_min, math.ceil(0.1 * k_hi - 1e-9)))
    return k_lo, k_hi


def straggler_cap(lengths: Sequence[int] | np.ndarray) -> int:
    """SL_cap = ceil(mean SL) of the batch's lengths."""
    arr = np.asarray(lengths, dtype=float)
    return int(math.ceil(float(arr.mean()) - 1e-9)) if len(arr) else 0


@dataclass
class _Seq:
    """One sequence's state: its k during warm-up, its KL history, warm-up logs, bounds once warm."""

    k: int
    history: deque = field(default_factory=deque)
    accepted: list = field(default_factory=list)
    kls: list = field(default_factory=list)
    bounds: tuple[int, int] | None = None
    kl_bar: float = 0.0


class DsdePolicy:
    """Per sequence: SL from the stability of its recent KL values; the batch caps at ceil(mean SL)."""

    name: ClassVar[str] = "dsde"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, window: int = 30, k_start: int = 3, cap: bool = True) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        self.ctx = ctx
        self.k_min, self.k_max = min(1, ctx.k_max), ctx.k_max
        self.window, self.cap = window, cap
        k0 = min(max(k_start, self.k_min), self.k_max)
        self.seqs: PerRequest[_Seq] = PerRequest(lambda: _Seq(k0, deque(maxlen=window)))
        self._features: DraftFeatures | None = None
        self._ks = np.zeros(0, np.int64)

    def length(self, s: _Seq) -> int:
        """The sequence's SL (after warm-up) or its warm-up k."""
        if s.bounds is None or not s.history:
            return s.k
        return dsl_length(intensity_ratio(s.history), s.kl_bar, *s.bounds)

    def decide(self, state: BatchState) -> Decision:
        self._features = default_features(state, self.ctx, self.name) if state.features is not None else None
        seqs = [self.seqs.get(rid) for rid in state.request_ids.tolist()]
        ks = np.array([self.length(s) for s in seqs], dtype=np.int64)
        warm = np.array([s.bounds is not None for s in seqs], dtype=bool)
        if self.cap and warm.any():
            ks = np.where(warm, np.minimum(ks, straggler_cap(ks[warm])), ks)
        self._ks = ks
        return Decision.per_request(ks)

    def keep_drafting(self, state: BatchState, features: DraftFeatures | None, j: int,
                      active: np.ndarray) -> np.ndarray:
        """Draft position j + 1 while j < the row's capped SL (DSDE sets each length before drafting)."""
        return active & (self._ks > j)

    def observe(self, outcome: StepOutcome) -> None:
        values = self._kl_values(outcome)
        for i, rid in enumerate(outcome.state.request_ids.tolist()):
            k, m = int(outcome.ks[i]), int(outcome.accepted[i])
            if k == 0:
                continue
            s = self.seqs.get(rid)
            kls = [] if values is None else [float(v) for v in values[i, :k] if not np.isnan(v)]  # verified only
            s.history.extend(kls)
            s.kl_bar = sum(kls) / k
            if s.bounds is None:
                s.accepted.append(m)
                s.kls.extend(kls)
                if m >= k:
                    s.k = min(2 * k, self.k_max)
                if len(s.history) >= self.window:
                    s.bounds = dynamic_bounds(s.accepted, s.kls, self.k_min, self.k_max)
        self.seqs.forget(outcome)
        self._features = None

    def _kl_values(self, outcome: StepOutcome) -> np.ndarray | None:
        k_max = self.ctx.k_max
        if outcome.kl is not None and self.ctx.default_drafter == MODEL:
            return outcome.kl[:, :k_max]
        if self._features is not None:
            f = self._features
            return kl_proxy(f.top1_prob[:, :k_max], f.margin[:, :k_max], outcome.ks, outcome.accepted)
        return None
