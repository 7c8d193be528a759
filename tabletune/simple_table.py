"""The default table: the simplest one whose every change of k gains what the points resolve. Core: no torch.

``smooth_within_noise`` starts from the best fixed k and changes k over a range only where the
change gains at least the noise floor (1%) at some batch size of the range, by the tune's own
goodput model (``tabletune.optimizer.goodput_grid``), and more than the T(b, k) points there resolve
(``point_noise``, widened for the number of differences tested, ``family_scale``). ``verdict`` says
whether the table is worth using over the best fixed k, and what it gives up against the exact optimum.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.optimizer import OptimizeOptions, TableResult, allowed_ks, goodput_grid, predict
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable

RESOLVE_Z = 2.0 * math.sqrt(2.0)  # two standard errors of the difference of two equally noisy medians
RANGE_TO_SIGMA = {2: 1.128, 3: 1.693}  # expected range of n normal samples, in standard deviations


def point_noise(samples_ms: Sequence[float]) -> float | None:
    """The smallest relative difference from another point that this point's median resolves: about two
    standard errors of the difference of two medians, RESOLVE_Z * se / median.

    se is the standard error of the median, 1.2533 sigma / sqrt(n), with sigma = IQR / 1.349 from 4
    samples on and range / d2(n) from 2 to 3; None (unknown) for a single sample. It shrinks with the
    samples: a point of 100 steps with a 10% spread resolves 2.5%, one of 4 steps 12%.
    """
    n = len(samples_ms)
    median = statistics.median(samples_ms)
    if n >= 4:
        sigma = StepPoint(1, 0, tuple(samples_ms)).spread * median / 1.349
    elif n >= 2:
        sigma = (max(samples_ms) - min(samples_ms)) / RANGE_TO_SIGMA[n]
    else:
        return None
    return RESOLVE_Z * 1.2533 * sigma / math.sqrt(n) / median


def family_scale(comparisons: int) -> float:
    """How much wider a two-sided 95% interval must be for ``comparisons`` differences tested at once
    (Bonferroni): z(0.025 / m) / z(0.025), e.g. 1.0 for m = 1, 1.68 for 13 batch sizes x 4 other k."""
    if comparisons < 1:
        raise ValueError(f"comparisons must be >= 1, got {comparisons}")
    z = statistics.NormalDist().inv_cdf
    return z(1 - 0.025 / comparisons) / z(1 - 0.025)


def noise_tolerance(profile: StepProfile, max_batch: int, ks: Sequence[int], floor: float = 0.0,
                    comparisons: int = 1) -> list[dict[int, float]]:
    """tol[b-1][k]: the relative difference T(b, k) resolves (``point_noise`` times
    ``family_scale(comparisons)``), at least ``floor``.

    A point with a single sample takes the largest noise measured in the profile (unknown is not
    zero). A measured b uses its point's noise; a b between two measured batch sizes the larger of
    theirs; beyond the largest measured b, that point's.
    """
    known = {(p.batch_size, p.k): point_noise(p.samples_ms) for p in profile.points}
    worst = max((v for v in known.values() if v is not None), default=0.0)
    scale = family_scale(comparisons)
    noise = {key: scale * (worst if v is None else v) for key, v in known.items()}
    measured = profile.batch_sizes
    out = []
    for b in range(1, max_batch + 1):
        lo = max([x for x in measured if x <= b], default=measured[0])
        hi = min([x for x in measured if x >= b], default=measured[-1])
        out.append({k: max(floor, noise.get((lo, k), 0.0), noise.get((hi, k), 0.0)) for k in ks})
    return out


DEFAULT_NOISE_FLOOR = 0.01  # a change of k must gain at least 1% at some batch size of its range


def resolved_gain(row: dict[int, float], tol_row: dict[int, float], k: int, other: int) -> float:
    """How far k beats ``other`` at one batch size beyond what the points resolve:

        g(b, k) / g(b, other) - 1 - max(tol(b, k), tol(b, other))

    >= 0 (with g(b, k) > g(b, other)) means the change from ``other`` to k gains at least the noise floor
    and more than the two points resolve (``noise_tolerance``)."""
    gain = row[k] / row[other] - 1.0
    return gain - max(tol_row[k], tol_row[other]) if gain > 0 else -math.inf


def best_fixed_k(grid: Sequence[dict[int, float]]) -> int:
    """The one k an operator would fix for all loads: argmax_k sum_b g(b, k) / max_k' g(b, k')
    (ties: the smaller k); ``best_single_k`` on a grid."""
    ks = sorted(grid[0])
    return max(ks, key=lambda k: (sum(row[k] / max(row.values()) for row in grid), -k))


def _best_window(d: Sequence[float], justified: Sequence[bool], lo: int, hi: int) -> tuple[float, int, int]:
    """(sum, a, c): the largest sum of d[a..c], lo <= a <= c <= hi, over windows holding a justified index
    (Kadane's maximum subarray, forced through a justified index j: best sum ending at j plus best
    non-negative sum starting after j); (-inf, 0, 0) when none is justified."""
    ending: dict[int, tuple[float, int]] = {}
    s, a = 0.0, lo
    for j in range(lo, hi + 1):
        s, a = (s + d[j], a) if s > 0 else (d[j], j)
        ending[j] = (s, a)
    starting: dict[int, tuple[float, int]] = {hi + 1: (0.0, hi)}
    s, c = 0.0, hi
    for j in range(hi, lo - 1, -1):
        s, c = (s + d[j], c) if s > 0 else (d[j], j)
        starting[j] = (s, c)
    best = (-math.inf, 0, 0)
    for j in range(lo, hi + 1):
        if justified[j]:
            after, c = starting[j + 1] if starting[j + 1][0] > 0 else (0.0, j)
            total = ending[j][0] + after
            if total > best[0]:
                best = (total, ending[j][1], c)
    return best


def simple_ks(grid: Sequence[dict[int, float]], tol: Sequence[dict[int, float]]) -> list[int]:
    """The dense k per batch size (index b - 1) of the simplest table whose every change of k gains what
    the points resolve.

    With r(b, k) = g(b, k) / g(b, k_fix), k_fix = ``best_fixed_k`` (so sum_b r = n is the best fixed k):

    1. start from k_fix at every b (where the points cannot tell k apart, the best fixed k stays);
    2. in a range [lo, hi] holding k_here, take the window [a, c] and k != k_here that maximise
       sum_{b=a..c} r(b, k) - r(b, k_here) > 0 among windows holding a b where
       ``resolved_gain``(b, k, k_here) >= 0; give it k, then do the same inside it (against k) and in
       the parts left and right of it (against k_here);
    3. merge neighbouring ranges (k1 on R1, k2 on R2) when neither gains resolved over the other
       anywhere in its own range, into the k that maximises sum r over R1 + R2; repeat;
    4. if the mean of r is below 1 (the table below the best fixed k), return k_fix everywhere.

    With zero noise and floor every strict gain is resolved and this is the exact argmax per b (up to ties).
    """
    n, ks = len(grid), sorted(grid[0])
    fix = best_fixed_k(grid)
    r = [{k: row[k] / row[fix] for k in ks} for row in grid]
    chosen = [fix] * n
    todo = [(0, n - 1, fix)]
    while todo:
        lo, hi, here = todo.pop()
        best = (0.0, 0, 0, here)
        for k in ks:
            if k == here:
                continue
            d = {b: r[b][k] - r[b][here] for b in range(lo, hi + 1)}
            ok = {b: resolved_gain(grid[b], tol[b], k, here) >= 0 for b in range(lo, hi + 1)}
            total, a, c = _best_window(d, ok, lo, hi)
            if total > best[0] + 1e-12:
                best = (total, a, c, k)
        total, a, c, k = best
        if k == here:
            continue
        chosen[a:c + 1] = [k] * (c - a + 1)
        todo += [(a, c, k)] + ([(lo, a - 1, here)] if a > lo else []) + ([(c + 1, hi, here)] if c < hi else [])
    chosen = _merge_unresolved(chosen, grid, tol, r)
    return chosen if sum(r[b][k] for b, k in enumerate(chosen)) >= n - 1e-9 else [fix] * n


def _merge_unresolved(chosen: list[int], grid: Sequence[dict[int, float]], tol: Sequence[dict[int, float]],
                      r: Sequence[dict[int, float]]) -> list[int]:
    """Step 3 of ``simple_ks``: merge neighbouring ranges whose change of k neither side resolves."""
    while True:
        ranges = DraftTable.from_dense(chosen).ranges
        for (s1, e1, k1), (s2, e2, k2) in zip(ranges, ranges[1:]):
            left = any(resolved_gain(grid[b - 1], tol[b - 1], k1, k2) >= 0 for b in range(s1, e1 + 1))
            right = any(resolved_gain(grid[b - 1], tol[b - 1], k2, k1) >= 0 for b in range(s2, e2 + 1))
            if not (left or right):
                span = range(s1 - 1, e2)
                k = max(sorted(r[0]), key=lambda x: (sum(r[b][x] for b in span), -x))
                chosen = chosen[:s1 - 1] + [k] * len(span) + chosen[e2:]
                break
        else:
            return chosen


def smooth_within_noise(profile: StepProfile, rates: Sequence[float], options: OptimizeOptions = OptimizeOptions(),
                        noise_floor: float = DEFAULT_NOISE_FLOOR) -> TableResult:
    """The simplest table whose every change of k gains, by the model, at least ``noise_floor`` at some batch
    size of its range and more than the points there resolve (``simple_ks``; default floor 1%).

    tol(b, k) = max(``noise_floor``, s_m * ``point_noise`` of the T(b, k) points around b) (``noise_tolerance``:
    two standard errors of the difference of two medians, widened by s_m = ``family_scale``(m) for the
    m = measured batch sizes x (allowed k - 1) differences the table tests; goodput's relative noise is
    T's). Where the
    points cannot tell k apart the table holds the best fixed k over the range, and it is never below the
    best fixed k in mean goodput. ``options.min_gain`` is not used here. With zero spread and a zero floor
    this is ``optimize_table``.
    """
    if noise_floor < 0:
        raise ValueError(f"noise_floor must be >= 0, got {noise_floor}")
    max_batch = options.max_batch or profile.max_batch_size
    ks = allowed_ks(profile, len(rates), options)
    grid = goodput_grid(profile, rates, ks, max_batch, options.draft_rate, options.draft_share, options.yields)
    comparisons = len(profile.batch_sizes) * max(1, len(ks) - 1)
    tol = noise_tolerance(profile, max_batch, ks, noise_floor, comparisons)
    table = DraftTable.from_dense(simple_ks(grid, tol))
    return TableResult(table, ks, predict(table, grid), tuple(tol))


@dataclass(frozen=True)
class Verdict:
    """Is the table worth using over the best fixed k, within the noise measured?"""

    fixed_k: int
    worth_it: bool  # some change of k gains more than the noise (the table has more than one range)
    mean_gain: float  # mean over b of g_table / g_fixed - 1
    best_gain: float  # the largest g_table / g_fixed - 1 over b
    best_b: int  # where
    noise: float  # what the points resolve there (max of tol of both k, at least the floor)
    loss_vs_optimum: tuple[float, float]  # (mean, worst b) of 1 - g_table / max_k g: what simplicity gives up

    def summary(self) -> str:
        mean, worst = self.loss_vs_optimum
        given_up = f"gives up {mean:.1%} mean ({worst:.1%} worst b) vs the exact optimum of the measured medians"
        if not self.worth_it:
            return (f"verdict: fixed k={self.fixed_k} is as good within the measured noise (no change of k gains "
                    f"more than the noise at any batch size); serve num_speculative_tokens={self.fixed_k} "
                    f"(the table {given_up})")
        return (f"verdict: the table is worth using over fixed k={self.fixed_k}: {self.mean_gain:+.1%} mean, "
                f"{self.best_gain:+.1%} at b={self.best_b} where the points resolve {self.noise:.1%}; it {given_up}")


def verdict(result: TableResult) -> Verdict:
    """The table against its best fixed k: gain_b = g(b, k(b)) / g(b, k_fix) - 1, worth it when the table
    changes k at all (``smooth_within_noise`` changes k only for a resolved gain); a one-range table is
    its own fixed k."""
    fix = result.best_single_k
    gains = [p.goodput / p.fixed_goodput[fix] - 1.0 for p in result.predictions]
    i = max(range(len(gains)), key=lambda j: gains[j])
    p = result.predictions[i]
    noise = max(result.tolerance[i][p.k], result.tolerance[i][fix]) if result.tolerance else 0.0
    losses = [pr.loss_vs_best_fixed for pr in result.predictions]
    worth = len(result.table.ranges) > 1
    return Verdict(fix if worth else result.table.ranges[0][2], worth, sum(gains) / len(gains), gains[i], i + 1, noise,
                   (sum(losses) / len(losses), max(losses)))
