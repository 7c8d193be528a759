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
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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
class StaticDecision:
    k: int  # the best fixed k (k*)
    points: tuple[StaticPoint, ...]
    min_gain: float

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
        return (f"static check: table {self.mean_table_gain:+.1%} over k={self.k} with the table mechanism on; "
                f"the mechanism itself costs {self.mean_dynamic_cost:+.1%}; table vs static k={self.k}: "
                f"{self.mean_vs_static:+.1%} -> recommend {choice}")


def check_batch_sizes(measured: Sequence[int], count: int = 3) -> tuple[int, ...]:
    """A few measured batch sizes spread over the range: the smallest, the largest, and between (geometric)."""
    bs = sorted(set(measured))
    if len(bs) <= count:
        return tuple(bs)
    idx = sorted({round(i * (len(bs) - 1) / (count - 1)) for i in range(count)})
    return tuple(bs[i] for i in idx)


def decide_static(result: TableResult, static_points: Sequence[StepPoint],
                  dynamic_ms: dict[int, float], min_gain: float = 0.0) -> StaticDecision:
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
    return StaticDecision(k, tuple(out), min_gain)
