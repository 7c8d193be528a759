"""Measuring points: round-robin over k, the interference filter, rechecks of suspect points."""

from tabletune.tuner import StepSamples, TunePlan
from tabletune.tuner.measure import interference_filter, measure_points, recheck_points, suspect_points

from tuner_fakes import FakeEngine, step_ms


def test_interference_filter_keeps_fast_samples():
    samples = [10.0, 10.5, 11.0, 50.0, 12.9, 13.1]
    assert interference_filter(samples, 0.3) == [0, 1, 2, 4]  # floor 10 -> keep <= 13
    assert interference_filter(samples, None) == list(range(6))


def test_measure_points_round_robin_and_stops_when_spread_small():
    engine = FakeEngine()
    plan = TunePlan(batch_sizes=(1, 4), ks=(0, 1, 2), steps_per_call=4, min_samples=8)
    points = measure_points(engine, plan.batch_sizes, plan)
    # constant times: spread 0, so exactly min_samples = 2 calls per point, k round-robin per b
    assert engine.calls == [(1, 0, 4), (1, 1, 4), (1, 2, 4)] * 2 + [(4, 0, 4), (4, 1, 4), (4, 2, 4)] * 2
    by_key = {(p.batch_size, p.k): p for p in points}
    assert by_key[(4, 2)].median_ms == step_ms(4, 2) == 16.0
    assert by_key[(4, 2)].scheduled_tokens == (12,) * 8


def test_measure_points_drops_interference_and_respects_budget():
    engine = FakeEngine(slow_every=3)
    now = [0.0]

    def clock() -> float:
        now[0] += 0.5  # each call "takes" 0.5 s between its two clock reads
        return now[0]

    plan = TunePlan(batch_sizes=(2,), ks=(0,), steps_per_call=3, min_samples=100, point_budget_s=1.0)
    (point,) = measure_points(engine, plan.batch_sizes, plan, clock=clock)
    assert len(engine.calls) == 2  # budget 1 s reached after two 0.5 s calls, min_samples never
    assert point.samples_ms == (step_ms(2, 0),) * 4  # the two 5x samples were dropped


def test_suspect_points_are_rechecked():
    class Contended(FakeEngine):
        def measure_step(self, batch_size, k, num_steps):
            got = super().measure_step(batch_size, k, num_steps)
            hit = (batch_size, k) == (1, 2) and len(self.calls) == 1  # only the first call is slowed
            return StepSamples(tuple(s * 40 for s in got.samples_ms) if hit else got.samples_ms, got.scheduled_tokens)

    engine = Contended()
    plan = TunePlan(batch_sizes=(1, 4), ks=(2, 3), steps_per_call=2, min_samples=2)
    points = measure_points(engine, (1,), TunePlan(batch_sizes=(1,), ks=(2,), steps_per_call=2, min_samples=2))
    points += measure_points(engine, (1, 4), TunePlan(batch_sizes=(1, 4), ks=(3,), steps_per_call=2, min_samples=2))
    assert points[0].median_ms == 40 * step_ms(1, 2)
    assert suspect_points(points, 0.15) == [(1, 2)]  # slower than (1, 3) and (4, 3), which do more work
    fixed = {(p.batch_size, p.k): p for p in recheck_points(engine, points, plan)}
    assert fixed[(1, 2)].median_ms == step_ms(1, 2)  # fresh samples; the 40x ones fail the filter
    assert suspect_points(list(fixed.values()), 0.15) == []
