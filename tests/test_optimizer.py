import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.goodput import expected_tokens
from tabletune.optimizer import OptimizeOptions, evaluate_table, optimize_table
from tabletune.profile import StepPoint, StepProfile, step_profile_from_csv
from tabletune.table import VLLM_DOCUMENTED_RANGES, DraftTable


def profile_from(rows):
    return StepProfile(tuple(StepPoint(b, k, (ms,)) for b, k, ms in rows), 0)


# memory-bound at b=1 (k costs almost nothing), compute-bound at b=8 (k costs linearly)
HAND = profile_from([(1, 0, 10.0), (1, 1, 10.5), (1, 2, 11.0),
                     (8, 0, 20.0), (8, 1, 36.0), (8, 2, 52.0)])


def test_hand_worked_table():
    rates = [0.8, 0.5]
    # b=1: E = 1, 1.8, 2.2 ; goodput/1000 = 1/10, 1.8/10.5, 2.2/11 -> k=2 (0.2 > 0.1714)
    # b=8: 8/20=0.4, 8*1.8/36=0.4, 8*2.2/52=0.338 -> tie between k=0 and k=1 -> smaller k wins
    r = optimize_table(HAND, rates)
    dense = r.table.dense(8)
    assert dense[1] == 2 and dense[8] == 0
    assert r.predictions[0].goodput == pytest.approx(1000 * 2.2 / 11.0)
    assert r.predictions[7].fixed_goodput[1] == pytest.approx(r.predictions[7].fixed_goodput[0])
    # b=4: T interpolated: k0 = 10+3/7*10, k2 = 11+3/7*41
    t0, t2 = 10 + 30 / 7, 11 + 3 * 41 / 7
    assert r.predictions[3].fixed_goodput[0] == pytest.approx(4000 / t0)
    assert r.predictions[3].fixed_goodput[2] == pytest.approx(4000 * 2.2 / t2)


def test_ks_and_k_max_restrict_choices():
    rates = [0.8, 0.5]
    assert optimize_table(HAND, rates, OptimizeOptions(ks=(0, 1))).ks == (0, 1)
    assert optimize_table(HAND, rates, OptimizeOptions(k_max=1)).table.k_max <= 1
    with pytest.raises(ValueError, match="lengths \\[3\\]"):
        optimize_table(HAND, rates, OptimizeOptions(ks=(0, 3)))


def test_min_gain_merges_ranges():
    # T(b, k) = 10 + 0.1 b (1 + 0.9 k) ms, a = 0.7 at every position: E[tokens | 3] = 2.533, E[tokens | 4] = 2.773.
    # At b = 18: T(18, 3) = 16.66, T(18, 4) = 18.28 and 2.533 / 16.66 = 0.1520 > 2.773 / 18.28 = 0.1517,
    # so the optimal table leaves k = 4 at b = 18, by less than 1 %.
    p = profile_from([(b, k, 10.0 + b * (1 + 0.9 * k) * 0.1) for b in (1, 2, 4, 8, 16, 32, 64) for k in range(5)])
    rates = [0.7] * 4
    fine = optimize_table(p, rates)
    assert fine.table.as_lists() == [[1, 17, 4], [18, 33, 3], [34, 64, 2]]
    coarse = optimize_table(p, rates, OptimizeOptions(min_gain=0.05))
    assert len(coarse.table.ranges) < len(fine.table.ranges)
    # The bound: k changes only when the new best k beats the kept one by min_gain, so at every b
    # G(table) >= G(best fixed k) / (1 + min_gain): a loss of at most 1 - 1 / 1.05 = 0.05 / 1.05 = 0.0476.
    bound = 0.05 / 1.05
    losses = [pc.loss_vs_best_fixed for pc in coarse.predictions]
    assert max(losses) <= bound
    assert max(losses) > 0.01  # and merging did cost something: min_gain acted
    for pc, pf in zip(coarse.predictions, fine.predictions):
        assert pc.goodput <= pf.goodput + 1e-9


@st.composite
def profiles_and_rates(draw):
    bs = sorted(draw(st.sets(st.integers(1, 64), min_size=1, max_size=6)))
    ks = sorted(draw(st.sets(st.integers(0, 6), min_size=1, max_size=5)))
    rows = [(b, k, draw(st.floats(0.5, 100.0))) for b in bs for k in ks]
    rates = draw(st.lists(st.floats(0.01, 1.0), min_size=max(ks) or 1, max_size=7))
    return profile_from(rows), rates


@settings(max_examples=150, deadline=None)
@given(profiles_and_rates())
def test_table_never_worse_than_any_fixed_k(data):
    profile, rates = data
    r = optimize_table(profile, rates)
    for pred in r.predictions:
        for k, g in pred.fixed_goodput.items():
            assert pred.goodput >= g * (1 - 1e-12), (pred.batch_size, k)
        assert pred.goodput == pred.optimum
        # ties go to the smaller k
        assert pred.k == min(k for k, g in pred.fixed_goodput.items() if g == pred.optimum)


CURVES = {
    "eagle-like": [0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5],
    "flat-high": [0.9] * 7,
    "weak": [0.4, 0.3, 0.3, 0.2, 0.2, 0.1, 0.1],
    "ngram-code": [0.6, 0.8, 0.85, 0.9, 0.9, 0.9, 0.9],
}


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("name", ["starter_8b", "starter_32b"])
def test_measured_surface_within_half_percent(name, curve, request):
    profile = step_profile_from_csv(request.getfixturevalue(name))
    rates = CURVES[curve]
    r = optimize_table(profile, rates, OptimizeOptions(max_batch=256))
    DraftTable.from_ranges(r.table.as_lists(), num_speculative_tokens=max(r.ks))
    for pred in r.predictions:
        assert pred.goodput >= 0.995 * pred.optimum
        # independent recomputation from the raw surface
        manual = max(pred.batch_size * expected_tokens(rates, k) * 1000 / profile.step_ms(pred.batch_size, k)
                     for k in profile.ks)
        assert pred.goodput == pytest.approx(manual, rel=1e-12)


def test_documented_table_is_worse_under_weak_acceptance(starter_8b):
    profile = step_profile_from_csv(starter_8b)
    rates = CURVES["weak"]
    tuned = optimize_table(profile, rates)
    documented = evaluate_table(profile, rates, DraftTable(VLLM_DOCUMENTED_RANGES), 256)
    assert sum(p.goodput for p in tuned.predictions) > sum(p.goodput for p in documented)


def test_draft_rate_hand_worked():
    """q = 0.5: E_q = 1 + q (E - 1), T_q = T(b,0) + q (T(b,k) - T(b,0))."""
    rates = [0.8, 0.5]
    q = 0.5
    r = optimize_table(HAND, rates, OptimizeOptions(draft_rate=q))
    row = r.predictions[0].fixed_goodput  # b=1
    assert row[0] == pytest.approx(1000 * 1 / 10.0)
    assert row[1] == pytest.approx(1000 * (1 + q * 0.8) / (10 + q * 0.5))
    assert row[2] == pytest.approx(1000 * (1 + q * 1.2) / (10 + q * 1.0))
    row8 = r.predictions[7].fixed_goodput  # b=8
    assert row8[2] == pytest.approx(8000 * (1 + q * 1.2) / (20 + q * 32))
    assert evaluate_table(HAND, rates, r.table, 8, draft_rate=q)[7].fixed_goodput == row8
    with pytest.raises(ValueError, match="draft_rate"):
        OptimizeOptions(draft_rate=0.0)
    no_k0 = profile_from([(1, 1, 10.0), (1, 2, 11.0)])
    with pytest.raises(ValueError, match="T\\(b, 0\\)"):
        optimize_table(no_k0, rates, OptimizeOptions(draft_rate=q))
    assert optimize_table(no_k0, rates).table.k_for(1) == 2  # q = 1 needs no k = 0


def test_partial_draft_grid_at_f0_is_the_linear_model_and_f1_picks_shorter_drafts():
    from tabletune.optimizer import goodput_grid, partial_goodput_grid
    from tabletune.profile import StepPoint, StepProfile

    # T(b, k) = 10 + b + 2k (linear in k), b in {1, 64}
    prof = StepProfile(points=tuple(StepPoint(b, k, (10.0 + b + 2 * k,)) for b in (1, 64) for k in range(5)),
                       context_len=0)
    rates = [0.9, 0.9, 0.9, 0.9]
    linear = goodput_grid(prof, rates, [0, 1, 2, 3, 4], 64, draft_rate=0.3)
    f0 = partial_goodput_grid(prof, rates, [0, 1, 2, 3, 4], 64, 0.3, 0.0)
    for lin_row, row in zip(linear, f0):
        assert row == pytest.approx(lin_row)
    f1 = partial_goodput_grid(prof, rates, [0, 1, 2, 3, 4], 64, 0.3, 1.0)
    # f = 1 charges the full draft whenever some row drafts: never cheaper than f = 0
    assert all(f1[b][k] <= f0[b][k] + 1e-9 for b in range(64) for k in range(5))
    # at b = 64 with q = 0.3: E_q(4) = 1 + 0.3 * 3.0951 = 1.9285, T_q ~ T(64, 4) = 82; k = 0: 1 / 74
    assert f1[63][4] == pytest.approx(64 * 1.92853 * 1000 / (74 * (0.7 ** 64) + 82 * (1 - 0.7 ** 64)), rel=1e-4)
    opts = OptimizeOptions(draft_rate=0.3, draft_share=1.0)
    assert optimize_table(prof, rates, opts).predictions[63].fixed_goodput == pytest.approx(f1[63])
    with pytest.raises(ValueError, match="draft_share"):
        OptimizeOptions(draft_rate=0.3, draft_share=1.5)
