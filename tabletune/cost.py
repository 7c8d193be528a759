"""Step cost: T(b, k) from a measured profile, and how a step with mixed draft lengths is costed.

A uniform step (every request drafts k) costs the profile's T(b, k), linear in b
between measured batch sizes (``StepProfile.step_ms``). A step whose requests draft
different lengths k_1..k_b is costed as

    T(b, k_1..k_b) = T(b, 0) + f * (T~(b, k_max) - T(b, 0)) + (1 - f) * (T~(b, k_bar) - T(b, 0))

with k_max = max_i k_i (the drafter runs k_max sequential steps for the whole batch),
k_bar = sum_i k_i / b (the target verifies sum_i (k_i + 1) tokens), T~(b, x) the
profile linear in x between measured k, and f = ``draft_share`` the share of the
per-k cost that is drafting (paid for the longest draft) rather than verification
(paid per verified token). With all k_i equal this is exactly T(b, k). f = 0 costs a
step by its total verified tokens only; f = 1 charges every request the longest draft.
An n-gram drafter runs on the CPU, so its settings use f = 0.

Split rule (when the drafting time D(b, k) is given, ``draft_grid=``, e.g. by ``StepCost.split``): the step pays the
drafter for the longest chain and the target per verified token,

    T(b, k_1..k_b) = T~(b, k_bar) - D~(b, k_bar) + D~(b, k_max)

i.e. verification V = T - D at the mean length plus drafting at the longest. The share
of drafting then follows the measurement at every b instead of one constant f (on the
H200 8B EAGLE-style profiles, drafting is ~85% of the per-k cost at b <= 16 and ~25% at
b = 128). With all k_i equal this is again T(b, k).

``budget_ms(b, slots)`` is T for a batch-wide budget of verified draft slots,
T(b, slots / b) with f = 0; adaptive verification (DSpark-style) prices budgets with it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tabletune.profile import StepProfile


@dataclass(frozen=True)
class StepCost:
    """Offline step times T(b, k) plus the mixed-length rule above. Immutable and cheap to query."""

    profile: StepProfile
    draft_share: float = 0.5
    # D(b, k), the drafting time of a k-token chain (split rule): [k index][b index] over profile.ks x batch_sizes
    draft_grid: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.draft_share <= 1.0:
            raise ValueError(f"draft_share must lie in [0, 1], got {self.draft_share}")
        ks = self.profile.ks
        bs = self.profile.batch_sizes
        # grid[ki, bi] = T(bs[bi], ks[ki]); a k missing at some b is interpolated in b
        grid = np.array([[self.profile.step_ms(b, k) for b in bs] for k in ks], dtype=float)
        dgrid = None
        if self.draft_grid is not None:
            dgrid = np.array(self.draft_grid, dtype=float)
            if dgrid.shape != grid.shape or not np.all(np.isfinite(dgrid)) or np.any(dgrid < 0):
                raise ValueError(f"draft_grid must be {grid.shape} finite times >= 0 (ks x batch sizes)")
        object.__setattr__(self, "_dgrid", dgrid)
        object.__setattr__(self, "_ks", np.array(ks, dtype=float))
        object.__setattr__(self, "_bs", np.array(bs, dtype=float))
        object.__setattr__(self, "_grid", grid)
        object.__setattr__(self, "_cache", {})

    @classmethod
    def split(cls, profile: StepProfile, draft_ms: Callable[[int, int], float]) -> StepCost:
        """The split rule with D(b, k) = draft_ms(b, k) at the profile's measured (b, k), clipped at >= 0."""
        grid = tuple(tuple(max(float(draft_ms(b, k)), 0.0) for b in profile.batch_sizes) for k in profile.ks)
        return cls(profile, draft_grid=grid)

    @property
    def ks(self) -> list[int]:
        """The measured draft lengths."""
        return self.profile.ks

    @property
    def k_max(self) -> int:
        return int(self._ks[-1])  # type: ignore[attr-defined]

    def row(self, batch_size: float) -> np.ndarray:
        """T(b, k) for every measured k (same order as ``ks``), linear in b; cached per b."""
        return self._rows(batch_size)[0]

    def draft_row(self, batch_size: float) -> np.ndarray | None:
        """D(b, k) for every measured k (split rule), linear in b; None without a drafting profile."""
        return self._rows(batch_size)[1]

    def _rows(self, batch_size: float) -> tuple[np.ndarray, np.ndarray | None]:
        cache = self._cache  # type: ignore[attr-defined]
        out = cache.get(batch_size)
        if out is None:
            bs, grid, dgrid = self._bs, self._grid, self._dgrid  # type: ignore[attr-defined]
            out = (np.array([np.interp(batch_size, bs, g) for g in grid]),
                   None if dgrid is None else np.array([np.interp(batch_size, bs, g) for g in dgrid]))
            if len(cache) < 4096:
                cache[batch_size] = out
        return out

    def step_ms(self, batch_size: float, k: float) -> float:
        """T(b, k); a non-integer k is linear between the neighbouring measured k."""
        row = self.row(batch_size)
        ks = self._ks  # type: ignore[attr-defined]
        if k <= ks[0]:
            return float(row[0])
        if k >= ks[-1]:
            return float(row[-1])
        i = bisect.bisect_left(ks.tolist(), k)
        if ks[i] == k:
            return float(row[i])
        w = (k - ks[i - 1]) / (ks[i] - ks[i - 1])
        return float(row[i - 1] + w * (row[i] - row[i - 1]))

    def mixed_ms(self, ks: np.ndarray) -> float:
        """T(b, k_1..k_b) by the rule in the module docstring; ks is [batch_size] ints."""
        b = len(ks)
        if b == 0:
            return 0.0
        k_top = int(ks.max())
        k_bar = float(ks.sum()) / b
        if k_bar == k_top:
            return self.step_ms(b, k_top)
        return float(self.mixed_curve_ms(b, np.array([float(k_top)]), np.array([k_bar]))[0])

    def mixed_curve_ms(self, batch_size: int, k_top: np.ndarray, k_bar: np.ndarray) -> np.ndarray:
        """T(b, k_top, k_bar) for many (k_top, k_bar) pairs at one batch size (the rules above)."""
        ks = self._ks  # type: ignore[attr-defined]
        row, drow = self._rows(batch_size)
        if drow is not None:
            return np.interp(k_bar, ks, row) - np.interp(k_bar, ks, drow) + np.interp(k_top, ks, drow)
        t0 = float(np.interp(0.0, ks, row))
        f = self.draft_share
        return t0 + f * (np.interp(k_top, ks, row) - t0) + (1.0 - f) * (np.interp(k_bar, ks, row) - t0)

    def budget_ms(self, batch_size: int, slots: float) -> float:
        """T(budget): a step verifying ``slots`` draft tokens in total over the batch, T(b, slots/b)."""
        return self.step_ms(batch_size, slots / batch_size if batch_size else 0.0)


def partial_draft_ms(profile: StepProfile, batch_size: int, k: int, draft_rate: float, draft_share: float) -> float:
    """T_q(b, k): the expected step time when each of b requests drafts k tokens with probability q, else none.

    A drafter that proposes only on a match (n-gram) leaves a share 1 - q of the rows undrafted. With
    P = 1 - (1 - q)^b the chance that some row drafts, and k_bar = q k / P the mean draft length given
    that one does, the mixed-length rule of this module with draft share f gives

        T_q(b, k) = (1 - P) T(b, 0) + P [T(b, 0) + f (T(b, k) - T(b, 0)) + (1 - f) (T~(b, k_bar) - T(b, 0))]

    f is measured, not assumed: ``fit_draft_share`` fits it to timed steps whose rows drafted different
    lengths (an engine that pads every row to the longest draft has f = 1; one that verifies only the
    drafted tokens has f = 0). q = 1 or k = 0 gives T(b, k).
    """
    if not 0.0 < draft_rate <= 1.0:
        raise ValueError(f"draft_rate must lie in (0, 1], got {draft_rate}")
    if not 0.0 <= draft_share <= 1.0:
        raise ValueError(f"draft_share must lie in [0, 1], got {draft_share}")
    t_k = profile.step_ms(batch_size, k)
    if k == 0 or draft_rate == 1.0:
        return t_k
    t_0 = profile.step_ms(batch_size, 0)
    p_any = 1.0 - (1.0 - draft_rate) ** batch_size
    k_bar = draft_rate * k / p_any
    ks = profile.ks
    t_bar = float(np.interp(k_bar, ks, [profile.step_ms(batch_size, x) for x in ks]))
    drafted = t_0 + draft_share * (t_k - t_0) + (1.0 - draft_share) * (t_bar - t_0)
    return (1.0 - p_any) * t_0 + p_any * drafted


@dataclass(frozen=True)
class MixedStep:
    """One timed step whose rows drafted different lengths: k_top = max k_i, k_bar = mean k_i."""

    batch_size: int
    k_top: int
    k_bar: float
    measured_ms: float


def fit_draft_share(profile: StepProfile, steps: list[MixedStep]) -> float:
    """Least-squares f in  measured - T~(b, k_bar) = f (T(b, k_top) - T~(b, k_bar)),  clipped to [0, 1].

    T comes from ``profile`` (uniform steps of the same engine); a step with k_bar = k_top carries no
    information about f and is skipped. Raises ValueError when no step has k_bar < k_top.
    """
    cost = StepCost(profile)
    xs, ys = [], []
    for s in steps:
        t_top, t_bar = cost.step_ms(s.batch_size, s.k_top), cost.step_ms(s.batch_size, s.k_bar)
        if t_top - t_bar > 0:
            xs.append(t_top - t_bar)
            ys.append(s.measured_ms - t_bar)
    if not xs:
        raise ValueError("no mixed step with k_bar < k_top (and T(k_top) > T(k_bar)) to fit the draft share on")
    x, y = np.array(xs), np.array(ys)
    return float(np.clip((x * y).sum() / (x * x).sum(), 0.0, 1.0))


def fit_share_and_level(profile: StepProfile, steps: list[MixedStep], iterations: int = 50) -> tuple[float, float]:
    """(f, level) for steps timed apart from the profile: measured = level (T~(b, k_bar) + f (T(b, k_top) -
    T~(b, k_bar))), fitted robustly on relative times.

    Steps recorded while serving real text (the tuner's acceptance runs) differ from the profile's
    uniform steps in context, content and the machine's load at the time, so their level is a
    parameter of its own: dividing by T~(b, k_bar), r = level + level f x with x = (T(b, k_top) -
    T~(b, k_bar)) / T~(b, k_bar) is a line whose intercept is the level and whose slope over
    intercept is f. Steps with x = 0 (no row drafted, or all alike) pin the level. Huber-weighted
    least squares (re-weighted ``iterations`` times, MAD scale) keeps a step slowed by another
    process from moving the fit; f is clipped to [0, 1]. Raises ValueError without a step with x > 0.
    """
    cost = StepCost(profile)
    xs, rs = [], []
    for s in steps:
        t_top, t_bar = cost.step_ms(s.batch_size, s.k_top), cost.step_ms(s.batch_size, s.k_bar)
        if t_bar > 0:
            xs.append(max(t_top - t_bar, 0.0) / t_bar)
            rs.append(s.measured_ms / t_bar)
    x, r = np.array(xs), np.array(rs)
    if not np.any(x > 0):
        raise ValueError("no mixed step with k_bar < k_top (and T(k_top) > T(k_bar)) to fit the draft share on")
    design = np.stack([np.ones_like(x), x], axis=1)
    weights = np.ones_like(r)
    for _ in range(iterations):
        root = np.sqrt(weights)
        coef = np.linalg.lstsq(design * root[:, None], r * root, rcond=None)[0]
        resid = r - design @ coef
        scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
        if scale <= 0:
            break
        limit = 1.345 * scale
        weights = np.where(np.abs(resid) <= limit, 1.0, limit / np.maximum(np.abs(resid), 1e-12))
    level, slope = float(coef[0]), float(coef[1])
    return float(np.clip(slope / level, 0.0, 1.0)) if level > 0 else 1.0, level
