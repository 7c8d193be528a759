import pytest

from helpers_batch import ctx, outcome, state
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
