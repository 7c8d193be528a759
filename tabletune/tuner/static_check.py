"""Static or dynamic: is the table worth what vLLM's table mechanism costs? Core: no torch, no vllm.

With a ``num_speculative_tokens_per_batch_size`` table vLLM runs in dynamic-SD
mode, which can itself cost time: its V1 runner then drops CUDA graphs from
FULL_AND_PIECEWISE to PIECEWISE (vLLM issue #49548 reports 14% single-stream).
The tune times T(b, k) with the table on, as it will serve; then the best fixed
k* with the table off, T_static(b, k*), at a few batch sizes. At each such b:

    dynamic cost(b) = T_dyn(b, k*) / T_static(b, k*) - 1
    table vs static(b) = goodput_table(b) / (b * E[tokens | k*] / T_static(b, k*)) - 1

where goodput_table(b) = b * E[tokens | k(b)] / T_dyn(b, k(b)) is the tuned
table's modelled goodput. The table's predicted gain over k* (both in dynamic
mode) is (1 + table vs static) * (1 + dynamic cost) - 1. The recommendation is
the static config (``num_speculative_tokens = k*``, no table) when the mean over
the checked b of "table vs static" is below ``min_gain``: the table's predicted
gain is smaller than what the dynamic mode costs.

Plain decoding without a table keeps FULL graphs too, and a table's k = 0 rows pay
the PIECEWISE price (on an H100, +36-76% a step at k = 0). So the check also times
T_static(b, 0) where it can and reports, per checked b,

    no speculation vs table(b) = (b / T_static(b, 0)) / goodput_table(b) - 1

and the smallest checked b from which plain decoding serves more at every larger
checked b: a deployment whose load stays there should not speculate at all.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.goodput import goodput
from tabletune.optimizer import TableResult
from tabletune.profile import StepPoint


@dataclass(frozen=True)
class StaticPoint:
    """One checked batch size."""

    batch_size: int
    dynamic_ms: float  # T_dyn(b, k*), table mechanism on
    static_ms: float  # T_static(b, k*), table mechanism off
    table_gain: float  # the table's predicted gain over k* in dynamic mode
    dynamic_cost: float  # T_dyn / T_static - 1
    vs_static: float  # table goodput / static k* goodput - 1


@dataclass(frozen=True)
class NoSpecPoint:
    """Plain decoding (k = 0, no table, FULL graphs) at one checked batch size."""

    batch_size: int
    static_ms: float  # T_static(b, 0)
    vs_table: float  # its goodput (one token a request-step) / the table's modelled goodput - 1


@dataclass(frozen=True)
class StaticDecision:
    k: int  # the best fixed k (k*)
    points: tuple[StaticPoint, ...]
    min_gain: float
    no_spec: tuple[NoSpecPoint, ...] = ()  # empty: not checked

    @property
    def no_spec_from(self) -> int | None:
        """The smallest checked b from which plain decoding serves more at every larger checked b; None if none."""
        start = None
        for p in self.no_spec:  # ascending b
            if p.vs_table > 0:
                start = p.batch_size if start is None else start
            else:
                start = None
        return start

    @property
    def mean_vs_static(self) -> float:
        return statistics.fmean(p.vs_static for p in self.points)

    @property
    def mean_dynamic_cost(self) -> float:
        return statistics.fmean(p.dynamic_cost for p in self.points)

    @property
    def mean_table_gain(self) -> float:
        return statistics.fmean(p.table_gain for p in self.points)

    @property
    def recommend_static(self) -> bool:
        return self.mean_vs_static < self.min_gain

    def summary(self) -> str:
        choice = f"static k={self.k} (no table)" if self.recommend_static else "the table (dynamic mode)"
        line = (f"static check: table {self.mean_table_gain:+.1%} over k={self.k} with the table mechanism on; "
                f"the mechanism itself costs {self.mean_dynamic_cost:+.1%}; table vs static k={self.k}: "
                f"{self.mean_vs_static:+.1%} -> recommend {choice}")
        if not self.no_spec:
            return line
        each = ", ".join(f"{p.vs_table:+.1%} at b={p.batch_size}" for p in self.no_spec)
        start = self.no_spec_from
        verdict = (f"serve without speculation where the load stays at b >= {start}" if start is not None
                   else "speculation pays at every checked b")
        return f"{line}\nno speculation (no table) vs the table: {each} -> {verdict}"


def check_batch_sizes(measured: Sequence[int], count: int = 3) -> tuple[int, ...]:
    """A few measured batch sizes spread over the range: the smallest, the largest, and between (geometric)."""
    bs = sorted(set(measured))
    if len(bs) <= count:
        return tuple(bs)
    idx = sorted({round(i * (len(bs) - 1) / (count - 1)) for i in range(count)})
    return tuple(bs[i] for i in idx)


def decide_static(result: TableResult, static_points: Sequence[StepPoint],
                  dynamic_ms: dict[int, float], min_gain: float = 0.0,
                  no_spec_points: Sequence[StepPoint] = ()) -> StaticDecision:
    """The decision from the table's predictions, T_dyn(b, k*) and the static points (all of one k*).

    Static goodput is the table mode's fixed-k* goodput with its step time T_dyn(b, k*) replaced by
    T_static(b, k*): the same tokens per step (from the rates or the per-k yields) at the static cost."""
    if not static_points:
        raise ValueError("no static point measured")
    ks = {p.k for p in static_points}
    if len(ks) != 1:
        raise ValueError(f"static points must share one k, got {sorted(ks)}")
    k = ks.pop()
    by_b = {p.batch_size: p for p in result.predictions}
    out = []
    for p in sorted(static_points, key=lambda p: p.batch_size):
        pred = by_b[p.batch_size]
        static_goodput = pred.fixed_goodput[k] * dynamic_ms[p.batch_size] / p.median_ms
        out.append(StaticPoint(p.batch_size, dynamic_ms[p.batch_size], p.median_ms,
                               pred.goodput / pred.fixed_goodput[k] - 1.0,
                               dynamic_ms[p.batch_size] / p.median_ms - 1.0,
                               pred.goodput / static_goodput - 1.0))
    if any(p.k != 0 for p in no_spec_points):
        raise ValueError("no-speculation points must be k = 0")
    plain = tuple(NoSpecPoint(p.batch_size, p.median_ms,
                              goodput(p.batch_size, p.median_ms, 1.0) / by_b[p.batch_size].goodput - 1.0)
                  for p in sorted(no_spec_points, key=lambda p: p.batch_size))
    return StaticDecision(k, tuple(out), min_gain, plain)
