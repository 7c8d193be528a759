"""The table optimizer: per batch size, the k that maximises modelled goodput.

For each b in 1..max_batch it picks k* = argmax_k b * E[tokens|k] / T(b, k) over
the allowed draft lengths ``ks`` (ties go to the smaller k) and compresses the choices into
ranges. With ``min_gain`` > 0 the k only changes between neighbouring batch
sizes when the new k beats the current one by at least that fraction, which
trades a little goodput for fewer ranges. With the default 0 the table is
optimal under the model at every b.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.cost import partial_draft_ms
from tabletune.goodput import DraftYield, expected_tokens, goodput, with_draft_rate
from tabletune.profile import StepProfile
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
