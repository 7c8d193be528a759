"""Close calls: found where two k are within the margin, re-measured, and the pooled samples decide."""

from __future__ import annotations

import pytest

from tabletune.acceptance import AcceptanceCounts
from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.profile import StepPoint, StepProfile
from tabletune.tuner import TunePlan, run_plan
from tabletune.tuner.close_calls import CloseCall, close_calls, pool, refinement_batch_sizes, settle
from tabletune.tuner.measure import interference_filter

from tuner_fakes import FakeEngine, profile_from
from tuner_fakes import RATES as FAKE_RATES
from tuner_fakes import step_ms as fake_step_ms

RATES = (0.8, 0.7, 0.6)  # E[tokens | k] = 1, 1.8, 2.36, 2.696
TRUE_16 = {0: 17.0, 1: 23.4, 2: 28.0, 3: 33.4}  # k=2 ahead of k=3 by 4.4%
OUTLIER_16_3 = 31.3  # one fast window: k=3 then looks 2.2% ahead


def step_ms(b: int, k: int) -> float:
    return TRUE_16[k] if b == 16 else 10.0 + 0.5 * b * (k + 1)


def profile(first_window: bool) -> StepProfile:
    points = [StepPoint(b, k, (OUTLIER_16_3 if first_window and (b, k) == (16, 3) else step_ms(b, k),) * 4)
              for b in (1, 16) for k in range(4)]
    return StepProfile(points=tuple(points), context_len=0)


def test_close_call_found_with_edge_and_order():
    calls = {c.batch_size: c for c in close_calls(profile(True), RATES, 3, margin=0.05)}
    call = calls[16]
    assert call.ks == (3, 2)  # best first: the outlier makes k=3 look best
    g3, g2 = 16 * 2.696 / OUTLIER_16_3, 16 * 2.36 / 28.0
    assert call.edge == pytest.approx(g3 / g2 - 1)
    assert 16 not in {c.batch_size for c in close_calls(profile(True), RATES, 3, margin=0.01)}
    with pytest.raises(ValueError):
        close_calls(profile(True), RATES, 3, margin=-0.1)


def test_settle_pools_windows_and_flips_the_choice():
    windows = []

    def measure(b, ks):
        windows.append((b, ks))
        return [StepPoint(b, k, (step_ms(b, k),) * 4) for k in ks]

    points = settle(list(profile(True).points), [CloseCall(16, (3, 2), 0.02)], 2, measure,
                    lambda s: list(range(len(s))))
    assert windows == [(16, (3, 2))] * 2
    by_key = {(p.batch_size, p.k): p for p in points}
    assert len(by_key[(16, 3)].samples_ms) == 12 and by_key[(16, 3)].median_ms == TRUE_16[3]
    assert by_key[(16, 0)].samples_ms == (17.0,) * 4  # points outside the call are untouched
    settled = StepProfile(points=tuple(points), context_len=0)
    assert [c.ks for c in close_calls(settled, RATES, 3, 0.05) if c.batch_size == 16] == [(2, 3)]


def test_pool_filters_again_and_keeps_tokens():
    old = StepPoint(4, 1, (10.0, 10.0), (8, 8))
    new = StepPoint(4, 1, (10.0, 50.0), (8, 8))
    got = pool(old, new, lambda s: interference_filter(s, 0.3))
    assert got.samples_ms == (10.0, 10.0, 10.0) and got.scheduled_tokens == (8, 8, 8)


class OutlierEngine(FakeEngine):
    """The first window of (16, 3) is 6% fast; every later call measures the true time."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_16_3 = 0

    def measure_step(self, batch_size, k, num_steps):
        got = super().measure_step(batch_size, k, num_steps)
        if batch_size != 16:
            return got
        first = (batch_size, k) == (16, 3) and self.seen_16_3 == 0
        self.seen_16_3 += (batch_size, k) == (16, 3)
        ms = OUTLIER_16_3 if first else TRUE_16[k]
        return type(got)((ms,) * num_steps, got.scheduled_tokens)

    def measure_acceptance(self, prompts, k, max_tokens):
        counts = AcceptanceCounts(k_max=k)
        for m, n in ((0, 20), (1, 24), (2, 22), (3, 34)):  # reached 100, 80, 56; accepted 80, 56, 34
            for _ in range(n):
                counts.observe_draft(k, m)
        return counts


@pytest.mark.parametrize("windows,k_at_16", [(0, 3), (2, 2)])
def test_run_plan_settles_close_calls(windows, k_at_16):
    plan = TunePlan(batch_sizes=(1, 16), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2, refine=False,
                    close_call_windows=windows)
    outcome = run_plan(OutlierEngine(), plan, ["p"])
    table = optimize_table(outcome.profile, outcome.rates, OptimizeOptions(k_max=3)).table
    assert table.k_for(16) == k_at_16
    assert (16 in {c.batch_size for c in outcome.close_calls}) == bool(windows)


def test_refinement_adds_midpoints_where_k_changes():
    profile = profile_from(fake_step_ms)
    # the chosen k: 3 at b=1..8, 2 at b=16, 1 at b=32 and 64 (T = 10 + 0.5 b (k + 1), rates 0.9, 0.8, 0.7)
    chosen = {p.batch_size: p.k for p in optimize_table(profile, FAKE_RATES, OptimizeOptions(k_max=3)).predictions}
    assert [chosen[b] for b in (1, 2, 4, 8, 16, 32, 64)] == [3, 3, 3, 3, 2, 1, 1]
    # so the switches lie in (8, 16) and (16, 32): midpoints round(sqrt(8 * 16)) = 11, round(sqrt(16 * 32)) = 23
    assert refinement_batch_sizes(profile, FAKE_RATES, 3) == [11, 23]
    flat = profile_from(lambda b, k: 10.0)  # flat cost: k=3 everywhere, nothing to refine
    assert refinement_batch_sizes(flat, FAKE_RATES, 3) == []
