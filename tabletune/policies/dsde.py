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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from tabletune.policies.base import MODEL, BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.per_request import accepted_mask, default_features, drafter_features, tested_mask

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
    """One sequence's state (a snapshot, ``DsdePolicy.seq``): warm-up k, KL history, bounds once warm."""

    k: int
    history: list = field(default_factory=list)
    bounds: tuple[int, int] | None = None
    kl_bar: float = 0.0


def wvir_rows(hist: np.ndarray, count: np.ndarray, decay: float = DECAY) -> np.ndarray:
    """``intensity_ratio`` of every row at once: hist [r, W] right-aligned (the last ``count`` columns hold
    the history, oldest first). Returns [r]."""
    r, w = hist.shape
    age = np.arange(w - 1, -1, -1)[None, :]  # [1, W] age of each column (0: newest)
    valid = age < count[:, None]
    x = np.where(valid, hist, 0.0)

    def wvar(mask: np.ndarray) -> np.ndarray:
        wt = np.where(mask, decay ** age, 0.0)
        sw = np.maximum(wt.sum(axis=1), 1e-300)
        mean = (wt * x).sum(axis=1) / sw
        return (wt * (x - mean[:, None]) ** 2).sum(axis=1) / sw

    long_var = wvar(valid)
    short_var = wvar(valid & (age < np.maximum(count // 3, 1)[:, None]))
    ratio = np.where(long_var < 1e-6, 20.0, short_var / np.maximum(long_var, 1e-6))
    return np.where(count < 2, 0.0, ratio)


def dsl_rows(wvir: np.ndarray, kl_bar: np.ndarray, k_lo: np.ndarray, k_hi: np.ndarray) -> np.ndarray:
    """``dsl_length`` of every row at once."""
    risk = wvir * (np.exp(SF_ALPHA * kl_bar) - 1.0)
    sl = np.maximum(k_lo, np.ceil((k_hi - k_lo) * (1.0 - risk) + k_lo - 1e-9))
    return np.where(risk <= 1.0, sl, k_lo).astype(np.int64)


class _Rows:
    """Per-request arrays (one row per running request, reused after it finishes)."""

    def __init__(self, window: int, k_start: int) -> None:
        self.window, self.k_start = window, k_start
        self.slot: dict[int, int] = {}
        self.free: list[int] = []
        self._grow(0, 64)

    def _grow(self, old: int, new: int) -> None:
        def pad(arr: np.ndarray | None, fill, shape) -> np.ndarray:
            out = np.full(shape, fill, dtype=type(fill))
            if arr is not None:
                out[:old] = arr
            return out

        get = lambda name: getattr(self, name, None)  # noqa: E731
        self.k = pad(get("k"), 0, new)  # warm-up k
        self.hist = pad(get("hist"), np.nan, (new, self.window))  # right-aligned KL history
        self.count = pad(get("count"), 0, new)  # values in hist
        self.k_lo = pad(get("k_lo"), -1, new)  # bounds once warm (-1: warming up)
        self.k_hi = pad(get("k_hi"), -1, new)
        self.kl_bar = pad(get("kl_bar"), 0.0, new)
        self.acc_max = pad(get("acc_max"), -1, new)  # warm-up logs: max accepted, KL sum, count, max
        self.kl_sum = pad(get("kl_sum"), 0.0, new)
        self.kl_n = pad(get("kl_n"), 0, new)
        self.kl_max = pad(get("kl_max"), -np.inf, new)
        self.free += list(range(new - 1, old - 1, -1))

    def rows(self, ids: list[int]) -> np.ndarray:
        """[b] row of each request id, new rows for new ids."""
        out = []
        for rid in ids:
            row = self.slot.get(rid)
            if row is None:
                if not self.free:
                    self._grow(len(self.k), 2 * len(self.k))
                row = self.slot[rid] = self.free.pop()
                self.k[row], self.hist[row], self.count[row], self.kl_bar[row] = self.k_start, np.nan, 0, 0.0
                self.k_lo[row] = self.k_hi[row] = self.acc_max[row] = -1
                self.kl_sum[row], self.kl_n[row], self.kl_max[row] = 0.0, 0, -np.inf
            out.append(row)
        return np.array(out, dtype=np.int64)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """``rows`` of an id array, reusing the last answer when the batch is unchanged."""
        last = getattr(self, "_last", None)
        if last is not None and np.array_equal(last[0], ids):
            return last[1]
        out = self.rows(ids.tolist())
        self._last = (ids.copy(), out)
        return out

    def forget(self, ids: list[int]) -> None:
        if ids:
            self._last = None
        for rid in ids:
            row = self.slot.pop(int(rid), None)
            if row is not None:
                self.free.append(row)


class DsdePolicy:
    """Per sequence: SL from the stability of its recent KL values; the batch caps at ceil(mean SL).

    The state of all sequences lives in arrays (``_Rows``), so decide and observe are a few numpy
    operations on the batch; ``seq(rid)`` and ``length`` are the per-sequence reading of the same rules.
    """

    name: ClassVar[str] = "dsde"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, window: int = 30, k_start: int = 3, cap: bool = True) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        self.ctx = ctx
        self.k_min, self.k_max = min(1, ctx.k_max), ctx.k_max
        self.window, self.cap = window, cap
        self.table = _Rows(window, min(max(k_start, self.k_min), self.k_max))
        self._features: DraftFeatures | None = None
        self._ks = np.zeros(0, np.int64)
        self._rows = np.zeros(0, np.int64)  # the rows of the last decided batch

    def seq(self, request_id: int) -> _Seq:
        """A snapshot of one sequence's state."""
        t = self.table
        row = t.rows([int(request_id)])[0]
        n = int(t.count[row])
        hist = t.hist[row, self.window - n:].tolist() if n else []
        bounds = None if t.k_lo[row] < 0 else (int(t.k_lo[row]), int(t.k_hi[row]))
        return _Seq(int(t.k[row]), hist, bounds, float(t.kl_bar[row]))

    def request_ids(self) -> set[int]:
        return set(self.table.slot)

    @staticmethod
    def length(s: _Seq) -> int:
        """The sequence's SL (after warm-up) or its warm-up k (the per-sequence rule)."""
        if s.bounds is None or not s.history:
            return s.k
        return dsl_length(intensity_ratio(s.history), s.kl_bar, *s.bounds)

    def decide(self, state: BatchState) -> Decision:
        self._features = default_features(state, self.ctx, self.name) if state.features is not None else None
        t = self.table
        rows = self._rows = t.rows_of(state.request_ids)
        warm = t.k_lo[rows] >= 0
        ks = t.k[rows].copy()
        if warm.any():
            w = rows[warm]
            ks[warm] = dsl_rows(wvir_rows(t.hist[w], t.count[w]), t.kl_bar[w], t.k_lo[w], t.k_hi[w])
            if self.cap:
                ks[warm] = np.minimum(ks[warm], straggler_cap(ks[warm]))
        self._ks = ks
        return Decision.per_request(ks)

    def keep_drafting(self, state: BatchState, features: DraftFeatures | None, j: int,
                      active: np.ndarray) -> np.ndarray:
        """Draft position j + 1 while j < the row's capped SL (DSDE sets each length before drafting)."""
        return active & (self._ks > j)

    def observe(self, outcome: StepOutcome) -> None:
        values = self._kl_values(outcome)
        t = self.table
        ks, m = outcome.ks.astype(np.int64), outcome.accepted.astype(np.int64)
        drew = ks > 0
        if drew.any():
            rows = self._rows[drew] if len(self._rows) == len(drew) else t.rows(outcome.state.request_ids[drew].tolist())
            k, m = ks[drew], m[drew]
            b, k_max = len(rows), self.ctx.k_max
            if values is None:
                vals = np.full((b, k_max), np.nan)
            else:
                vals = np.where(np.arange(k_max)[None, :] < k[:, None], values[drew], np.nan)  # verified only
            valid = ~np.isnan(vals)
            n_new = valid.sum(axis=1)
            kl_sum = np.where(valid, vals, 0.0).sum(axis=1)
            # append to the right-aligned history: the new values as a left prefix of vals, then columns
            # n_new .. n_new + W - 1 of [history | vals] are the last W values in order
            if not np.array_equal(valid, np.arange(k_max)[None, :] < n_new[:, None]):
                order = np.argsort(~valid, axis=1, kind="stable")
                vals = np.take_along_axis(vals, order, axis=1)
            both = np.concatenate([t.hist[rows], vals], axis=1)  # [b, W + k_max]
            t.hist[rows] = np.take_along_axis(both, n_new[:, None] + np.arange(self.window)[None, :], axis=1)
            t.count[rows] = np.minimum(t.count[rows] + n_new, self.window)
            t.kl_bar[rows] = kl_sum / k
            cold = t.k_lo[rows] < 0
            if cold.any():
                self._warm_up(rows[cold], k[cold], m[cold], kl_sum[cold], n_new[cold],
                              np.where(valid, vals, -np.inf).max(axis=1)[cold])
        t.forget(outcome.finished_ids.tolist())
        self._features = None

    def _warm_up(self, rows, k, m, kl_sum, kl_n, kl_max) -> None:
        """Warm-up logs and doubling; the bounds of ``dynamic_bounds`` once the history is full."""
        t = self.table
        t.acc_max[rows] = np.maximum(t.acc_max[rows], m)
        t.kl_sum[rows] += kl_sum
        t.kl_n[rows] += kl_n
        t.kl_max[rows] = np.maximum(t.kl_max[rows], kl_max)
        t.k[rows] = np.where(m >= k, np.minimum(2 * k, self.k_max), t.k[rows])
        done = t.count[rows] >= self.window
        if done.any():
            r = rows[done]
            n = t.kl_n[r]
            mean_kl = np.where(n > 0, t.kl_sum[r] / np.maximum(n, 1), 0.0)
            max_kl = np.where(n > 0, t.kl_max[r], 1.0)
            max_kl = np.where(max_kl != 0, max_kl, 1.0)
            k_hi = np.clip(np.round(t.acc_max[r] * (1.0 + 0.5 * mean_kl / max_kl)), self.k_min, self.k_max)
            t.k_hi[r] = k_hi
            t.k_lo[r] = np.minimum(k_hi, np.maximum(self.k_min, np.ceil(0.1 * k_hi - 1e-9)))

    def _kl_values(self, outcome: StepOutcome) -> np.ndarray | None:
        k_max = self.ctx.k_max
        if outcome.kl is not None and self.ctx.default_drafter == MODEL:
            return outcome.kl[:, :k_max]
        f = self._features
        if f is None and outcome.state.features is not None:  # decided before drafting: the drafted signals
            f = drafter_features(outcome.state.features, self.ctx)
        if f is not None:
            return kl_proxy(f.top1_prob[:, :k_max], f.margin[:, :k_max], outcome.ks, outcome.accepted)
        return None
