"""Where the table's choice is uncertain: refinement between batch sizes, and close calls.

``refinement_batch_sizes``: the chosen k differs between two neighbouring
measured batch sizes, so the switch point lies between them; measure the midpoint.

Close calls: measured batch sizes where two draft lengths are too close to call.

The table picks argmax_k goodput(b, k) from one measurement window per batch
size. On a CPU the median step time of a point moves by a few percent between
windows (other processes, caches, the growing context), so a choice made on a
small predicted edge is a coin flip: the first demo tune chose k=3 over k=2 at
b=16 on a 1.8% edge, and three later windows measured T(16,3) / T(16,2) at 1.19
instead of the first window's 1.12 (k=2 ahead by 4%); closed-loop serving then
ran the table 11% below fixed k=2 at load 16.

So after the grid, every measured b whose runner-up k is within ``margin`` of
the best (modelled goodput, ``b * E[tokens|k] / T(b, k)``) is measured again in
``windows`` fresh windows, each round-robin over the close k; the new samples
join the old ones (the median of the pooled samples, at least three windows,
is what decides). This module imports neither torch nor vllm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.profile import StepPoint, StepProfile


def refinement_batch_sizes(profile: StepProfile, rates: Sequence[float], k_max: int,
                           options: OptimizeOptions | None = None) -> list[int]:
    """Midpoints between neighbouring measured b whose chosen k differ (not yet measured); ``options``
    (default: k_max alone) as the table will be built, e.g. with measured yields."""
    result = optimize_table(profile, rates, options or OptimizeOptions(k_max=k_max))
    chosen = {p.batch_size: p.k for p in result.predictions}
    bs = profile.batch_sizes
    out = []
    for lo, hi in zip(bs, bs[1:]):
        if chosen[lo] != chosen[hi] and hi - lo > 1:
            mid = round(math.sqrt(lo * hi))
            mid = min(max(mid, lo + 1), hi - 1)
            if mid not in bs:
                out.append(mid)
    return out


@dataclass(frozen=True)
class CloseCall:
    """At ``batch_size``, every k in ``ks`` is within the margin of the best k (``ks[0]``)."""

    batch_size: int
    ks: tuple[int, ...]
    edge: float  # best goodput / runner-up goodput - 1


def close_calls(profile: StepProfile, rates: Sequence[float], k_max: int, margin: float,
                options: OptimizeOptions | None = None) -> list[CloseCall]:
    """Measured batch sizes where some other k's modelled goodput is within ``margin`` of the best
    (``options`` as in ``refinement_batch_sizes``)."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    result = optimize_table(profile, rates, options or OptimizeOptions(k_max=k_max))
    measured = set(profile.batch_sizes)
    out = []
    for pred in result.predictions:
        if pred.batch_size not in measured:
            continue
        row = pred.fixed_goodput
        best = pred.best_fixed_k
        near = sorted((k for k in row if k != best and row[k] >= row[best] / (1 + margin)),
                      key=lambda k: -row[k])
        if near:
            out.append(CloseCall(pred.batch_size, (best, *near), row[best] / row[near[0]] - 1.0))
    return out


def pool(old: StepPoint, new: StepPoint, keep: Callable[[Sequence[float]], list[int]]) -> StepPoint:
    """One point from two windows' samples, filtered again by ``keep`` (indices to keep)."""
    samples = old.samples_ms + new.samples_ms
    tokens = old.scheduled_tokens + new.scheduled_tokens
    idx = keep(samples)
    full = len(tokens) == len(samples)
    return StepPoint(old.batch_size, old.k, tuple(samples[i] for i in idx),
                     tuple(tokens[i] for i in idx) if full else ())


def settle(points: list[StepPoint], calls: Sequence[CloseCall], windows: int,
           measure: Callable[[int, tuple[int, ...]], list[StepPoint]],
           keep: Callable[[Sequence[float]], list[int]]) -> list[StepPoint]:
    """Add ``windows`` fresh windows of samples to every close call's points.

    ``measure(b, ks)`` returns one window's points at batch size b for those k;
    ``keep(samples)`` is the interference filter applied to the pooled samples.
    """
    by_key = {(p.batch_size, p.k): p for p in points}
    for _ in range(windows):
        for call in calls:
            for new in measure(call.batch_size, call.ks):
                key = (new.batch_size, new.k)
                by_key[key] = pool(by_key[key], new, keep) if key in by_key else new
    return list(by_key.values())

