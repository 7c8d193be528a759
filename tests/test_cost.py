import numpy as np
import pytest

from tabletune.profile import StepPoint, StepProfile
from tabletune.cost import StepCost


def profile() -> StepProfile:
    # T(b, k) = 10 + b + 2k at b in {1, 4}, k in 0..3
    pts = [StepPoint(b, k, (10.0 + b + 2 * k,)) for b in (1, 4) for k in range(4)]
    return StepProfile(points=tuple(pts), context_len=0)


def test_uniform_k_is_the_profile_and_linear_in_b():
    cost = StepCost(profile())
    assert cost.step_ms(1, 2) == pytest.approx(15.0)
    assert cost.step_ms(2, 3) == pytest.approx(18.0)  # between b=1 (17) and b=4 (20)
    assert cost.mixed_ms(np.array([3, 3])) == pytest.approx(18.0)
    assert cost.step_ms(1, 1.5) == pytest.approx(14.0)  # linear between measured k


def test_mixed_lengths_hand_worked():
    # b=2, ks=(0, 2): T0=12, T(kmax=2)=16, T(kbar=1)=14; f=0.5 -> 12 + 0.5*4 + 0.5*2 = 15
    cost = StepCost(profile(), draft_share=0.5)
    assert cost.mixed_ms(np.array([0, 2])) == pytest.approx(15.0)
    assert StepCost(profile(), 0.0).mixed_ms(np.array([0, 2])) == pytest.approx(14.0)
    assert StepCost(profile(), 1.0).mixed_ms(np.array([0, 2])) == pytest.approx(16.0)


def test_budget_is_total_slots_over_batch():
    cost = StepCost(profile())
    assert cost.budget_ms(4, 8) == pytest.approx(cost.step_ms(4, 2))
    assert cost.budget_ms(4, 0) == pytest.approx(cost.step_ms(4, 0))


def test_bad_draft_share():
    with pytest.raises(ValueError):
        StepCost(profile(), draft_share=1.5)


def test_split_rule_hand_worked():
    # D(b, k) = 1.5 k: b=2, ks=(0, 2): T(kbar=1) - D(1) + D(2) = 14 - 1.5 + 3 = 15.5
    cost = StepCost.split(profile(), lambda b, k: 1.5 * k)
    assert cost.mixed_ms(np.array([0, 2])) == pytest.approx(15.5)
    assert cost.mixed_ms(np.array([2, 2])) == pytest.approx(16.0)  # uniform: the profile
    assert cost.mixed_curve_ms(2, np.array([2.0, 3.0]), np.array([1.0, 1.5])) == pytest.approx([15.5, 17.25])
    # D = 0 is f = 0 (per token); D = T - T0 is f = 1 (the longest chain)
    assert StepCost.split(profile(), lambda b, k: 0.0).mixed_ms(np.array([0, 2])) == pytest.approx(14.0)
    full = StepCost.split(profile(), lambda b, k: 2.0 * k)
    assert full.mixed_ms(np.array([0, 2])) == pytest.approx(16.0)


def test_bad_draft_grid():
    with pytest.raises(ValueError, match="draft_grid"):
        StepCost(profile(), draft_grid=((0.0,),))


def test_partial_draft_hand_worked():
    from tabletune.cost import partial_draft_ms

    p = profile()  # at b = 1: T = 11 + 2k; at b = 4: T = 14 + 2k
    # b = 1, q = 0.5: P = 0.5, k_bar = k; T_q = 0.5 * 11 + 0.5 * T(1, k)
    assert partial_draft_ms(p, 1, 3, 0.5, 1.0) == pytest.approx(0.5 * 11 + 0.5 * 17)
    assert partial_draft_ms(p, 1, 3, 0.5, 0.0) == pytest.approx(0.5 * 11 + 0.5 * 17)
    # b = 4, q = 0.5: P = 1 - 1/16, k_bar = 1.5 / P; f = 0 is linear in the drafted tokens: 14 + 2 q k
    assert partial_draft_ms(p, 4, 3, 0.5, 0.0) == pytest.approx(14 + 2 * 0.5 * 3)
    # f = 1 pays the longest draft whenever a row drafts
    assert partial_draft_ms(p, 4, 3, 0.5, 1.0) == pytest.approx(14 / 16 + (15 / 16) * 20)
    assert partial_draft_ms(p, 4, 3, 1.0, 0.3) == pytest.approx(20.0)
    assert partial_draft_ms(p, 4, 0, 0.2, 0.3) == pytest.approx(14.0)
    for bad in ((0.0, 0.5), (1.5, 0.5), (0.5, -0.1)):
        with pytest.raises(ValueError):
            partial_draft_ms(p, 4, 3, *bad)


def test_fit_draft_share_recovers_f():
    from tabletune.cost import MixedStep, fit_draft_share

    p = profile()
    cost = StepCost(p, draft_share=0.7)
    steps = [MixedStep(len(ks), int(max(ks)), sum(ks) / len(ks), cost.mixed_ms(np.array(ks)))
             for ks in ([0, 3], [1, 3, 0, 0], [2, 2, 2, 2], [0, 0, 0, 1])]
    assert fit_draft_share(p, steps) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="no mixed step"):
        fit_draft_share(p, [MixedStep(2, 2, 2.0, 15.0)])


def test_fit_share_and_level_recovers_both_through_outliers():
    from tabletune.cost import MixedStep, fit_share_and_level

    p = profile()
    cost = StepCost(p, draft_share=0.4)
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(200):
        b = int(rng.integers(2, 5))
        ks = rng.integers(0, 4, size=b)
        slow = 3.0 if rng.random() < 0.05 else 1.0  # another process took the CPU
        steps.append(MixedStep(b, int(ks.max()), float(ks.mean()), 0.8 * slow * cost.mixed_ms(ks)))
    share, level = fit_share_and_level(p, steps)
    assert share == pytest.approx(0.4, abs=0.02) and level == pytest.approx(0.8, abs=0.01)
    # steps with all rows alike fix the level only
    with pytest.raises(ValueError, match="no mixed step"):
        fit_share_and_level(p, [MixedStep(2, 2, 2.0, 15.0), MixedStep(3, 0, 0.0, 9.0)])


def stop_profile() -> StepProfile:
    # T(b, k) = 10 + b + 4k at b in {1, 4}, k in 0..3 (the module docstring's worked example)
    pts = [StepPoint(b, k, (10.0 + b + 4 * k,)) for b in (1, 4) for k in range(4)]
    return StepProfile(points=tuple(pts), context_len=0)


def test_drafting_by_active_rows_and_verification_by_tokens_hand_worked():
    # D(b, k) = b k: D(2, k) = 2k by interpolation, V~(2, 2) = T(2, 2) - D(2, 2) = 20 - 4 = 16
    cost = StepCost.split(stop_profile(), lambda b, k: b * k)
    # d = (3, 1): a = (2, 1, 1): drafting 2 + 1 + 1 = 4; k = (3, 1): k_bar = 2
    assert cost.mixed_ms(np.array([3, 1])) == pytest.approx(20.0)
    assert cost.mixed_ms(np.array([3, 1]), drafted=np.array([3, 3])) == pytest.approx(22.0)  # a = (2, 2, 2)
    assert cost.mixed_ms(np.array([1, 1]), drafted=np.array([3, 1])) == pytest.approx(18.0)  # V~(2, 1) = 14
    assert cost.mixed_ms(np.array([3, 3])) == pytest.approx(24.0)  # uniform: the profile
    assert cost.rows_ms(2, np.array([2, 1, 1]), 2.0) == pytest.approx(20.0)
    padded = StepCost.split(stop_profile(), lambda b, k: b * k, draft_rows="batch")
    assert padded.mixed_ms(np.array([3, 1])) == pytest.approx(22.0)  # 16 + D(2, 3)
    assert cost.mixed_curve_ms(2, np.array([3.0]), np.array([2.0])) == pytest.approx([22.0])
    # without a drafting profile D = f (T - T0): f = 0 charges verified tokens only
    assert StepCost(stop_profile(), 0.0).mixed_ms(np.array([3, 1]), drafted=np.array([3, 3])) == pytest.approx(20.0)


def test_stopped_rows_uniform_stop_is_the_profile_and_bad_rows_are_refused():
    cost = StepCost.split(stop_profile(), lambda b, k: b * k)
    # every row stops at j = 2 and is verified on its 2 tokens: T(b, 2)
    assert cost.mixed_ms(np.array([2, 2, 2]), drafted=np.array([2, 2, 2])) == pytest.approx(cost.step_ms(3, 2))
    assert cost.rows_ms(3, np.array([3, 3]), 2.0) == pytest.approx(cost.step_ms(3, 2))
    with pytest.raises(ValueError, match="verifies more"):
        cost.mixed_ms(np.array([2, 1]), drafted=np.array([1, 1]))
    with pytest.raises(ValueError, match="draft_rows"):
        StepCost(stop_profile(), draft_rows="padded")


def test_free_rows_verify_without_model_drafting():
    # T(b, k) = 10 + b + 4k, D(b, k) = b k; row 1 verifies 3 n-gram tokens with no model drafting:
    # V~(2, 3) = 24 - 6 = 18, a = (1, 1, 1): drafting D(1, 3) = 3, T = 21 (both drafting: T(2, 3) = 24)
    cost = StepCost.split(stop_profile(), lambda b, k: b * k)
    free = np.array([False, True])
    assert cost.mixed_ms(np.array([3, 3]), np.array([3, 0]), free) == pytest.approx(21.0)
    # equal ks is not the uniform step when a row did not draft: V~(2, 2) = 16 + D(1, 2) = 2 -> 18, not T(2, 2) = 20
    assert cost.mixed_ms(np.array([2, 2]), np.array([2, 0]), free) == pytest.approx(18.0)
    with pytest.raises(ValueError, match="verifies more"):
        cost.mixed_ms(np.array([3, 3]), np.array([0, 0]), free)  # row 0 is not free


def test_a_split_step_pays_its_measured_extra_hand_worked():
    """T(b, k) = 10 + b + 4k, D(b, k) = b k, a split step costing 0.5 ms more at b = 1 and 2.0 at b = 4 (1.0 at b = 2,
    2.0 beyond 4). Row 0 drafts and verifies 2, the free row 1 verifies 3: it outruns the model row, the step splits:
    V~(2, 2.5) = 22 - 5 = 17, drafting D(1, 2) = 2, + 1.0 = 20. Row 1 verifying 2 does not outrun it: V~(2, 2) = 16 +
    2 = 18, no extra; nor does a step without free rows."""
    cost = StepCost.split(stop_profile(), lambda b, k: b * k)
    cost = StepCost(cost.profile, draft_grid=cost.draft_grid, split_extra=((1, 0.5), (4, 2.0)))
    assert cost.split_ms(2) == pytest.approx(1.0) and cost.split_ms(8) == pytest.approx(2.0)
    free = np.array([False, True])
    assert cost.mixed_ms(np.array([2, 3]), np.array([2, 0]), free) == pytest.approx(20.0)
    assert cost.mixed_ms(np.array([2, 2]), np.array([2, 0]), free) == pytest.approx(18.0)
    assert cost.mixed_ms(np.array([2, 3])) == StepCost(cost.profile, draft_grid=cost.draft_grid).mixed_ms(
        np.array([2, 3]))
    with pytest.raises(ValueError, match="split_extra"):
        StepCost(cost.profile, split_extra=((4, 1.0), (1, 0.5)))


def test_reads_cost_their_measured_extras_per_batch_size():
    """(b, ms) pairs, linear in b between them and flat beyond, 0 without any; each list checked as split_extra."""
    cost = StepCost(stop_profile(), read_extra=((1, 0.2), (4, 0.8)), position_read_extra=((2, 0.05),))
    assert cost.read_ms(2) == pytest.approx(0.4) and cost.read_ms(64) == pytest.approx(0.8)
    assert cost.position_read_ms(1) == pytest.approx(0.05) and StepCost(stop_profile()).read_ms(4) == 0.0
    with pytest.raises(ValueError, match="read_extra"):
        StepCost(stop_profile(), read_extra=((1, -0.1),))
    with pytest.raises(ValueError, match="position_read_extra"):
        StepCost(stop_profile(), position_read_extra=((4, 0.1), (4, 0.2)))


def test_fit_active_share_recovers_f_of_the_active_rows_rule():
    from tabletune.cost import fit_active_share

    # T(b, k) = 10 + b + (2 + b) k: the per-k cost grows with b, so drafting by active rows is cheaper
    p = StepProfile(points=tuple(StepPoint(b, k, (10.0 + b + (2 + b) * k,)) for b in (1, 4) for k in range(4)),
                    context_len=0)
    cost = StepCost(p, draft_share=0.35)
    steps = [(np.array(ks), cost.mixed_ms(np.array(ks))) for ks in ([3, 0], [2, 1, 0], [3, 3, 1, 0], [1, 2])]
    assert fit_active_share(p, steps) == pytest.approx(0.35)
    # f = 1, ks (3, 0): V = T(2, 0) = 12; active rows: 3 x D(1, .) steps of 3 = 9; padded: D(2, 3) = 12
    assert StepCost(p, 1.0).mixed_ms(np.array([3, 0])) == pytest.approx(21.0)
    assert StepCost(p, 1.0, draft_rows="batch").mixed_ms(np.array([3, 0])) == pytest.approx(24.0)
    with pytest.raises(ValueError, match="mixed"):
        fit_active_share(p, [(np.array([2, 2]), 20.0)])


@pytest.mark.parametrize("draft_rows", ["active", "batch"])
def test_rows_ms_tables_are_rows_ms_read_from_lookups(draft_rows):
    cost = StepCost(stop_profile(), draft_share=0.4, draft_rows=draft_rows)
    rng = np.random.default_rng(1)
    for b in (1, 3, 8, 13):
        verify, drafting = cost.rows_ms_tables(b, 3)
        assert verify.shape == (3 * b + 1,) and drafting.shape == (3, b + 1) and (drafting[:, 0] == 0).all()
        for _ in range(20):
            active = np.sort(rng.integers(0, b + 1, 3))[::-1]  # rows drafting positions 1..3, non-increasing
            total = int(rng.integers(0, 3 * b + 1))
            want = float(cost.rows_ms(b, active, total / b))
            assert verify[total] + drafting[np.arange(3), active].sum() == pytest.approx(want, rel=1e-12)
