import pytest

from helpers_batch import ctx, linear_profile, outcome, state
from tabletune.policies import make_policy
from tabletune.policies.turbospec import geometric_tokens


def test_geometric_tokens_hand_worked():
    import numpy as np

    assert geometric_tokens(0.5, np.array([0, 1, 2])).tolist() == pytest.approx([1.0, 1.5, 1.75])
    assert geometric_tokens(1.0, np.array([3])).tolist() == [4.0]


def test_alpha_tracks_censored_acceptance_and_k_follows():
    c = ctx()
    p = make_policy("turbospec", c)
    assert p.alpha == pytest.approx(0.7)  # mean of the prior rates
    high_k = p.decide(state(1)).k
    for _ in range(200):  # every draft of 5 rejected at position 1: reached 1, accepted 0 -> alpha -> 0
        st = state(4)
        p.observe(outcome(st, [5] * 4, [0] * 4))
    assert p.alpha < 0.05
    assert p.decide(state(1)).k < high_k
    assert p.decide(state(1)).k == 0


def test_reached_counts_are_censored():
    p = make_policy("turbospec:ema=1", ctx())
    # drafts of 4: accepted 2 (reached 3) and 4 (reached 4): alpha = 6 / 7
    p.observe(outcome(state(2), [4, 4], [2, 4]))
    assert p.alpha == pytest.approx(6 / 7)


def test_argmax_at_an_intermediate_acceptance():
    # T(b, k) = 10 + k ms at every b; alpha = 0.5 (the prior's mean), E = (1 - 0.5^(k+1)) / 0.5 = 2 - 0.5^k
    # k:      0      1       2       3       4       5
    # E:      1      1.5     1.75    1.875   1.9375  1.96875
    # E / T:  0.1    0.1364  0.1458  0.1442  0.1384  0.1313   -> k = 2, strictly inside 0..5
    c = ctx(rates=(0.5,) * 5, profile=linear_profile(per_b=0.0, per_k=1.0, per_bk=0.0))
    assert c.ks == (0, 1, 2, 3, 4, 5)
    p = make_policy("turbospec:ema=1", c)
    assert p.alpha == pytest.approx(0.5)
    assert p.decide(state(1)).k == 2 and p.decide(state(64)).k == 2
    # the extremes on the same profile: alpha = 1 gives E / T = (k+1) / (10+k), rising -> k = 5;
    # alpha -> 0 gives E = 1 at every k -> k = 0
    p.observe(outcome(state(2), [5, 5], [5, 5]))  # ema=1: alpha = 10 accepted / 10 reached
    assert p.alpha == pytest.approx(1.0) and p.decide(state(1)).k == 5
    p.observe(outcome(state(2), [5, 5], [0, 0]))  # alpha = 0 / 2 reached, floored at 1e-3
    assert p.decide(state(1)).k == 0
