"""Measuring T(b, k) points: round-robin over k, the interference filter, and rechecks.

Per (b, k): calls of ``num_steps`` timed steps, round-robin over k so slow
drift (other load, growing context) spreads over every k alike, until the
spread (IQR / median) is at most ``target_spread`` or the point has used its
time budget.

Interference filter: on a shared machine other processes stretch some steps by
several times. As ``timeit`` argues for its minimum, the fast samples are the
engine's own cost and the slow ones are interference, so a point keeps only
samples <= (1 + ``interference_tolerance``) * its 10th percentile (the profile
stores the kept samples; the median and spread are over them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tabletune.profile import StepPoint
from tabletune.tuner.close_calls import pool
from tabletune.tuner.plan import ProgressFn, TunePlan
from tabletune.tuner.protocol import Engine


def interference_filter(samples_ms: Sequence[float], tolerance: float | None) -> list[int]:
    """Indices of samples <= (1 + tolerance) * the 10th percentile (the minimum below 10 samples)."""
    if tolerance is None or not samples_ms:
        return list(range(len(samples_ms)))
    floor = statistics.quantiles(samples_ms, n=10)[0] if len(samples_ms) >= 10 else min(samples_ms)
    return [i for i, s in enumerate(samples_ms) if s <= floor * (1 + tolerance)]


@dataclass
class _Point:
    samples_ms: list[float] = field(default_factory=list)
    scheduled_tokens: list[int] = field(default_factory=list)
    spent_s: float = 0.0

    def kept(self, plan: TunePlan) -> tuple[tuple[float, ...], tuple[int, ...]]:
        idx = interference_filter(self.samples_ms, plan.interference_tolerance)
        full = len(self.scheduled_tokens) == len(self.samples_ms)
        tokens = tuple(self.scheduled_tokens[i] for i in idx) if full else ()
        return tuple(self.samples_ms[i] for i in idx), tokens

    def to_step_point(self, b: int, k: int, plan: TunePlan) -> StepPoint:
        return StepPoint(b, k, *self.kept(plan))

    def done(self, plan: TunePlan) -> bool:
        if self.spent_s >= plan.point_budget_s and self.samples_ms:
            return True
        samples, _ = self.kept(plan)
        if len(samples) < plan.min_samples:
            return False
        return StepPoint(1, 0, samples).spread <= plan.target_spread


def measure_points(engine: Engine, batch_sizes: Sequence[int], plan: TunePlan,
                   progress: ProgressFn | None = None, clock: Callable[[], float] = time.monotonic) -> list[StepPoint]:
    """Measure every (b, k) of ``batch_sizes`` x ``plan.ks``: round-robin over k until done."""
    out: list[StepPoint] = []
    total = len(batch_sizes) * len(plan.ks)
    for bi, b in enumerate(batch_sizes):
        points = {k: _Point() for k in plan.ks}
        while True:
            pending = [k for k in plan.ks if not points[k].done(plan)]
            if not pending:
                break
            for k in pending:
                t0 = clock()
                got = engine.measure_step(b, k, plan.steps_per_call)
                points[k].spent_s += clock() - t0
                points[k].samples_ms.extend(got.samples_ms)
                points[k].scheduled_tokens.extend(got.scheduled_tokens)
                if progress:
                    done_here = sum(min(1.0, p.spent_s / plan.point_budget_s) if not p.done(plan) else 1.0
                                    for p in points.values())
                    progress(f"b={b} k={k}", (bi * len(plan.ks) + done_here) / total)
        out.extend(points[k].to_step_point(b, k, plan) for k in plan.ks)
    return out


def suspect_points(points: Sequence[StepPoint], tolerance: float) -> list[tuple[int, int]]:
    """(b, k) whose median exceeds (1 + tolerance) x that of a point doing at least as much work.

    A step with more requests and longer drafts (b' >= b, k' >= k) verifies more
    tokens; when it measured faster, the slower point most likely met interference.
    """
    bad = []
    for p in points:
        if any(q is not p and q.batch_size >= p.batch_size and q.k >= p.k
               and p.median_ms > (1 + tolerance) * q.median_ms for q in points):
            bad.append((p.batch_size, p.k))
    return bad


def recheck_points(engine: Engine, points: list[StepPoint], plan: TunePlan,
                   progress: ProgressFn | None = None) -> list[StepPoint]:
    """Add samples to suspect points (``suspect_points``) and filter again, up to ``recheck_passes`` times."""
    by_key = {(p.batch_size, p.k): p for p in points}
    for n in range(plan.recheck_passes):
        bad = suspect_points(list(by_key.values()), plan.recheck_tolerance)
        for i, (b, k) in enumerate(bad):
            if progress:
                progress(f"recheck b={b} k={k}", (n + i / len(bad)) / plan.recheck_passes)
            got = engine.measure_step(b, k, 2 * plan.steps_per_call)
            by_key[(b, k)] = pool(by_key[(b, k)], StepPoint(b, k, got.samples_ms, got.scheduled_tokens),
                                  lambda samples: interference_filter(samples, plan.interference_tolerance))
    return list(by_key.values())
