"""The table optimizer: per batch size, the k that maximises modelled goodput.

For each b in 1..max_batch it picks k* = argmax_k b * E[tokens|k] / T(b, k) over
the allowed draft lengths ``ks`` (ties go to the smaller k) and compresses the choices into
ranges. With ``min_gain`` > 0 the k only changes between neighbouring batch
sizes when the new k beats the current one by at least that fraction, which
trades a little goodput for fewer ranges. With the default 0 the table is
optimal under the model at every b.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.cost import partial_draft_ms
from tabletune.goodput import DraftYield, expected_tokens, goodput, with_draft_rate
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable


@dataclass(frozen=True)
class OptimizeOptions:
    max_batch: int | None = None  # default: the profile's largest measured batch size
    k_max: int | None = None
    ks: tuple[int, ...] | None = None  # allowed k, e.g. those with CUDA graphs
    min_gain: float = 0.0
    draft_rate: float = 1.0  # share of request-steps that draft (``AcceptanceCounts.draft_rate``)
    # measured draft share f of the partial-draft cost (``cost.partial_draft_ms``); None: the linear q model
    draft_share: float | None = None
    # a drafter that proposes only on a match: its yield measured at each k (``goodput.DraftYield``); when
    # given, these replace ``rates`` and ``draft_rate``, the allowed k are those measured, and a step costs
    # T_q(b, k) at ``draft_share`` (1 when None)
    yields: tuple[DraftYield, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.k_max is not None and self.k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {self.k_max}")
        if self.min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain}")
        if not 0 < self.draft_rate <= 1:
            raise ValueError(f"draft_rate must lie in (0, 1], got {self.draft_rate}")
        if self.draft_share is not None and not 0 <= self.draft_share <= 1:
            raise ValueError(f"draft_share must lie in [0, 1], got {self.draft_share}")
        if self.ks is not None and (not self.ks or min(self.ks) < 0):
            raise ValueError(f"ks must be non-empty and >= 0, got {self.ks}")
        if len({y.k for y in self.yields}) != len(self.yields):
            raise ValueError(f"one yield per k, got k {[y.k for y in self.yields]}")


@dataclass(frozen=True)
class BatchPrediction:
    """Modelled goodput (tokens/s) at one batch size."""

    batch_size: int
    k: int  # the table's k
    goodput: float  # the table's goodput
    fixed_goodput: dict[int, float]  # every allowed fixed k

    @property
    def best_fixed_k(self) -> int:
        """The fixed k with the highest goodput at this batch size."""
        return best_k(self.fixed_goodput)

    @property
    def optimum(self) -> float:
        return max(self.fixed_goodput.values())

    @property
    def loss_vs_best_fixed(self) -> float:
        """1 - table / best-fixed-k goodput at this b (0 for an optimal table)."""
        return 1.0 - self.goodput / self.optimum


@dataclass(frozen=True)
class TableResult:
    table: DraftTable
    ks: tuple[int, ...]  # the allowed draft lengths the table chose among
    predictions: tuple[BatchPrediction, ...]
    tolerance: tuple[dict[int, float], ...] = ()  # tol[b-1][k] the table was smoothed with (else none)

    @property
    def best_single_k(self) -> int:
        """The one k an operator would fix for all loads: best mean share of the optimum."""
        return best_single_k(self.predictions)

    @property
    def loss_vs_optimum(self) -> tuple[float, float]:
        """(mean, worst) over b of 1 - table / exact-optimum goodput: what the table gives up for simplicity."""
        losses = [p.loss_vs_best_fixed for p in self.predictions]
        return sum(losses) / len(losses), max(losses)

    def gain_vs_fixed(self, k: int) -> tuple[float, float]:
        """(mean, minimum) over b of table goodput / fixed-k goodput - 1."""
        return gain_vs(self.predictions, [p.fixed_goodput[k] for p in self.predictions])


def allowed_ks(profile: StepProfile, num_rates: int, options: OptimizeOptions) -> tuple[int, ...]:
    """Measured k, limited by the rates known (the yields measured, when given), k_max and ``options.ks``."""
    ks = [k for k in profile.ks if k <= num_rates]
    if options.yields:
        ks = [k for k in profile.ks if k in {y.k for y in options.yields}]
    if options.k_max is not None:
        ks = [k for k in ks if k <= options.k_max]
    if options.ks is not None:
        missing = sorted(set(options.ks) - set(profile.ks))
        if missing:
            raise ValueError(f"draft lengths {missing} have no step-time measurements (measured k: {profile.ks})")
        ks = [k for k in ks if k in options.ks]
    if not ks:
        raise ValueError("no draft length is allowed by the profile, rates (or yields), k_max and ks")
    return tuple(sorted(ks))


def goodput_grid(profile: StepProfile, rates: Sequence[float], ks: Sequence[int], max_batch: int,
                 draft_rate: float = 1.0, draft_share: float | None = None,
                 yields: Sequence[DraftYield] = ()) -> list[dict[int, float]]:
    """grid[b-1][k] = modelled goodput at batch size b with fixed k (``draft_rate``: see goodput.py;
    with ``draft_share`` the partial-draft cost of ``partial_goodput_grid``; with ``yields`` the
    measured yields of ``yield_goodput_grid``)."""
    if yields:
        by_k = {y.k: y for y in yields}
        share = 1.0 if draft_share is None else draft_share
        return yield_goodput_grid(profile, [by_k[k] for k in ks], max_batch, share)
    if draft_rate < 1.0 and draft_share is not None:
        return partial_goodput_grid(profile, rates, ks, max_batch, draft_rate, draft_share)
    tokens = {k: expected_tokens(rates, k) for k in ks}
    step_ms = {k: profile.dense_step_ms(max_batch, k) for k in ks}
    if draft_rate == 1.0:
        return [{k: goodput(b, step_ms[k][b - 1], tokens[k]) for k in ks} for b in range(1, max_batch + 1)]
    if 0 not in profile.ks:
        raise ValueError(f"a draft rate below 1 ({draft_rate:.3f}) needs T(b, 0) measured; the profile has k {profile.ks}")
    base = profile.dense_step_ms(max_batch, 0)
    grid = []
    for b in range(1, max_batch + 1):
        row = {}
        for k in ks:
            tokens_q, step_q = with_draft_rate(tokens[k], step_ms[k][b - 1], base[b - 1], draft_rate)
            row[k] = goodput(b, step_q, tokens_q)
        grid.append(row)
    return grid


def best_k(row: dict[int, float]) -> int:
    """argmax over k; ties go to the smaller k."""
    return max(sorted(row), key=lambda k: (row[k], -k))


def optimize_table(profile: StepProfile, rates: Sequence[float], options: OptimizeOptions = OptimizeOptions()) -> TableResult:
    max_batch = options.max_batch or profile.max_batch_size
    ks = allowed_ks(profile, len(rates), options)
    grid = goodput_grid(profile, rates, ks, max_batch, options.draft_rate, options.draft_share, options.yields)
    return table_from_grid(grid, ks, options)


def table_from_grid(grid: list[dict[int, float]], ks: tuple[int, ...], options: OptimizeOptions) -> TableResult:
    """Per b the best k of the grid (with ``min_gain`` hysteresis), compressed into ranges."""
    chosen: list[int] = []
    for row in grid:
        k = best_k(row)
        if chosen and options.min_gain > 0 and k != chosen[-1]:
            if row[k] < row[chosen[-1]] * (1 + options.min_gain):
                k = chosen[-1]
        chosen.append(k)
    table = DraftTable.from_dense(chosen)
    return TableResult(table, ks, predict(table, grid))


def predict(table: DraftTable, grid: list[dict[int, float]]) -> tuple[BatchPrediction, ...]:
    """Per-b goodput of a table against every fixed k, from a goodput grid."""
    ks = sorted(grid[0])
    dense = table.dense(len(grid))
    out = []
    for b, row in enumerate(grid, start=1):
        k = dense[b]
        if k not in row:  # a table k that was not measured: nearest smaller allowed
            k = max([x for x in ks if x <= k] or [ks[0]])
        out.append(BatchPrediction(b, k, row[k], dict(row)))
    return tuple(out)


def evaluate_table(profile: StepProfile, rates: Sequence[float], table: DraftTable, max_batch: int,
                   ks: Sequence[int] | None = None, draft_rate: float = 1.0,
                   draft_share: float | None = None, yields: Sequence[DraftYield] = ()) -> tuple[BatchPrediction, ...]:
    """Predicted goodput of any table (e.g. vLLM's documented one) under the model."""
    ks = list(ks) if ks is not None else [k for k in profile.ks if k <= len(rates)]
    return predict(table, goodput_grid(profile, rates, ks, max_batch, draft_rate, draft_share, yields))


def best_single_k(predictions: Sequence[BatchPrediction]) -> int:
    ks = sorted(predictions[0].fixed_goodput)
    return max(ks, key=lambda k: (sum(p.fixed_goodput[k] / p.optimum for p in predictions), -k))


def gain_vs(predictions: Sequence[BatchPrediction], other_goodput: Sequence[float]) -> tuple[float, float]:
    """(mean, minimum) over b of our goodput / other goodput - 1."""
    gains = [p.goodput / g - 1.0 for p, g in zip(predictions, other_goodput)]
    return sum(gains) / len(gains), min(gains)


def partial_goodput_grid(profile: StepProfile, rates: Sequence[float], ks: Sequence[int], max_batch: int,
                         draft_rate: float, draft_share: float) -> list[dict[int, float]]:
    """grid[b-1][k] for a drafter that proposes in a share q of request-steps (n-gram: only on a match).

    ``rates`` are conditional acceptance over the drafts that were made (censored as usual), so a
    request-step yields E_q = 1 + q (E[tokens | k] - 1) tokens, and a step costs the measured
    partial-draft time T_q(b, k) (``tabletune.cost.partial_draft_ms``, draft share f fitted to timed
    mixed steps):  goodput_q(b, k) = b E_q / T_q(b, k).
    """
    if 0 not in profile.ks:
        raise ValueError(f"a draft rate below 1 ({draft_rate:.3f}) needs T(b, 0) measured; the profile has k {profile.ks}")
    grid = []
    for b in range(1, max_batch + 1):
        row = {}
        for k in ks:
            tokens_q = 1.0 + draft_rate * (expected_tokens(rates, k) - 1.0)
            row[k] = goodput(b, partial_draft_ms(profile, b, k, draft_rate, draft_share), tokens_q)
        grid.append(row)
    return grid


def yield_goodput_grid(profile: StepProfile, yields: Sequence[DraftYield], max_batch: int,
                       draft_share: float) -> list[dict[int, float]]:
    """grid[b-1][k] = b * tokens_per_step(k) / T_q(k)(b, k) from yields measured at each k (``DraftYield``)."""
    if 0 not in profile.ks:
        raise ValueError(f"partial drafting needs T(b, 0) measured; the profile has k {profile.ks}")
    return [{y.k: goodput(b, partial_draft_ms(profile, b, y.k, max(y.draft_rate, 1e-6), draft_share),
                          y.tokens_per_step) for y in yields} for b in range(1, max_batch + 1)]


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
        given_up = f"gives up {mean:.1%} mean ({worst:.1%} worst b) vs the exact optimum"
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
