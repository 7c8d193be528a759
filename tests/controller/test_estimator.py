"""Estimator: censored counts from drafts, decay, prior shrinkage, counter windows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.acceptance import AcceptanceCounts
from tabletune.controller.estimator import CumulativeCounters, DecayedAcceptance, StepObservation


def test_from_drafts_hand_worked():
    # (k=3, m=0): reached 1;  (k=3, m=2): reached 1,2,3 accepted 1,2;  (k=2, m=2): reached 1,2 accepted 1,2
    obs = StepObservation.from_drafts(3, 3, [(3, 0), (3, 2), (2, 2)])
    assert obs.num_drafts == 3
    assert obs.drafted == (3, 3, 2)
    assert obs.reached == (3, 2, 1)
    assert obs.accepted == (2, 2, 0)


def test_from_drafts_skips_empty_drafts_and_caps_k_max():
    obs = StepObservation.from_drafts(2, 5, [(0, 0), (5, 5)], k_max=3)
    assert obs.num_drafts == 1
    assert obs.reached == (1, 1, 1) and obs.accepted == (1, 1, 1) and obs.drafted == (1, 1, 1)


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), max_size=40))
def test_from_drafts_matches_acceptance_counts(pairs):
    counts = AcceptanceCounts(k_max=6)
    for d, a in pairs:
        counts.observe_draft(d, min(a, d))
    obs = StepObservation.from_drafts(len(pairs), 6, [(d, min(a, d)) for d, a in pairs], k_max=6)
    assert list(obs.reached) == counts.reached
    assert list(obs.accepted) == counts.accepted
    assert list(obs.drafted) == counts.drafted
    assert obs.problem() is None


def test_from_vllm_counts_exact_with_one_length():
    # 4 drafts of length 3 with m = 0, 1, 3, 3: drafted 4,4,4; accepted 3,2,2; reached 4,3,2
    obs = StepObservation.from_vllm_counts(4, 3, 4, [4, 4, 4], [3, 2, 2])
    assert obs.reached == (4.0, 3.0, 2.0)


@pytest.mark.parametrize("obs,problem", [
    (StepObservation(1, 1, 1, (1.0,), (math.nan,), (1.0,)), "nan"),
    (StepObservation(1, 1, 1, (1.0,), (-1.0,), (1.0,)), "negative"),
    (StepObservation(1, 1, 1, (1.0,), (2.0,), (1.0,)), "inconsistent"),
    (StepObservation(1, 1, 1, (1.0, 1.0), (1.0,), (1.0,)), "length_mismatch"),
    (StepObservation(1, 1, 1, (1.0,), (1.0,), (1.0,), time_s=math.inf), "nan"),
])
def test_problem(obs, problem):
    assert obs.problem() == problem


def test_prior_only_then_shrinkage():
    est = DecayedAcceptance([0.5, 0.5], prior_weight=10, half_life_tokens=1e12)
    assert est.rates() == [0.5, 0.5]
    # 10 drafts reach position 1, all accepted; position 2 reached 10 times, none accepted
    est.update(StepObservation(10, 2, 10, (10, 10), (10, 0), (10, 10)))
    # chained prior mean at 2: 0.5 * a_1 / 0.5 = 0.75
    assert est.rates() == pytest.approx([(10 + 5) / 20, (0 + 10 * 0.75) / 20])


def test_decay_halves_evidence_per_half_life_tokens():
    est = DecayedAcceptance([0.5], prior_weight=0, half_life_tokens=100)
    est.update(StepObservation(100, 1, 100, (100,), (60,), (100,)))
    est.update(StepObservation(100, 1, 100, (100,), (40,), (100,)))  # decays the first by 0.5 ** (100/100)
    assert est.reached == pytest.approx([150.0])
    assert est.rates() == pytest.approx([70 / 150])
    assert est.shifts == 0


def test_decay_in_seconds():
    est = DecayedAcceptance([0.5], prior_weight=0, half_life_s=2.0)
    est.update(StepObservation(1, 1, 4, (4,), (4,), (4,), time_s=10.0))
    est.update(StepObservation(1, 1, 0, (0,), (0,), (0,), time_s=14.0))  # two half-lives
    assert est.reached == pytest.approx([1.0])
    with pytest.raises(ValueError):
        est.update(StepObservation(1, 1, 0, (0,), (0,), (0,)))


def test_shift_detection_forgets_stale_deep_positions():
    est = DecayedAcceptance([0.5, 0.5], prior_weight=10, half_life_tokens=2000)
    for _ in range(20):  # old workload: 0.9 at both positions, 100 drafts of length 2 per step
        est.update(StepObservation(100, 2, 100, (100, 90), (90, 81), (100, 100)))
    assert est.shifts == 0 and est.rates()[1] == pytest.approx(0.9, abs=0.01)
    for _ in range(3):  # new workload: 0.3 at position 1, position 2 never reached (k=1)
        est.update(StepObservation(100, 1, 100, (100, 0), (30, 0), (100, 0)))
    assert est.shifts == 1
    a1, a2 = est.rates()
    assert a1 < 0.65  # without the shift the slow counts would still say ~0.85
    assert est.reached[1] == 0  # the stale evidence at position 2 is dropped ...
    assert a2 == pytest.approx(a1)  # ... and the chained prior (p2 / p1 = 1) follows a1


def test_rates_are_clamped():
    est = DecayedAcceptance([0.5], prior_weight=0, half_life_tokens=10)
    est.update(StepObservation(5, 1, 5, (5,), (0,), (5,)))
    assert est.rates(floor=1e-3) == [1e-3]


def test_cumulative_counters_reset_and_nan():
    c = CumulativeCounters()
    assert c.delta([10, 5]) is None  # first window sets the baseline
    assert c.delta([15, 7]) == (5.0, 2.0)
    assert c.delta([3, 1]) is None  # went backwards: engine restarted
    assert c.ignored == 1
    assert c.delta([4, 2]) == (1.0, 1.0)  # the reset totals are the new baseline
    assert c.delta([math.nan, 2]) is None
    assert c.delta([6, 3]) is None  # after NaN: baseline again
    assert c.delta([7, 3]) == (1.0, 0.0)
    assert c.ignored == 2


def test_draft_rate_prior_counts_and_decay():
    from tabletune.controller.estimator import DecayedDraftRate

    q = DecayedDraftRate(prior=0.5, prior_weight=10, half_life=1e12)
    assert q.rate == 0.5
    q.update(drafts=30, undrafted=10)
    assert q.rate == pytest.approx((30 + 10 * 0.5) / (40 + 10))
    fast = DecayedDraftRate(prior=1.0, prior_weight=0, half_life=100)
    fast.update(100, 0)
    fast.update(0, 100)  # 100 request-steps = one half-life: the first 100 drafts count 50
    assert fast.rate == pytest.approx(50 / 150)
    timed = DecayedDraftRate(prior=1.0, prior_weight=0, half_life_s=1.0)
    timed.update(10, 0, time_s=0.0)
    timed.update(0, 10, time_s=1.0)  # one half-life later
    assert timed.rate == pytest.approx(5 / 15)
    with pytest.raises(ValueError):
        DecayedDraftRate(prior=0.0, prior_weight=1)
    assert StepObservation(1, 1, 1, (1.0,), (0.0,), (1.0,), undrafted=math.nan).problem() == "nan"
    assert StepObservation(1, 1, 1, (1.0,), (0.0,), (1.0,), undrafted=-1).problem() == "negative"
