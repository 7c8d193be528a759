import math

import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim

from tabletune.errors import InputError
from tabletune.policies.tapout import ARMS, RULES, TapOutPolicy, Ucb1, round_reward, svip_bound


def test_rules_hand_worked():
    # (p1, margin, entropy, lambda)
    assert RULES["max-confidence"](0.5, 0.0, 9.0, 0.0) and not RULES["max-confidence"](0.49, 0.4, 0.0, 0.0)
    assert svip_bound(0.5) == 0.5  # 1 - sqrt(0.5 / 2)
    assert RULES["svip"](0.9, 0.9, 0.5, 0.0) and not RULES["svip"](0.9, 0.9, 0.51, 0.0)
    # AdaEDL: bound 1 - sqrt(0.18 / 2) = 0.7 against lambda
    assert RULES["adaedl"](0.9, 0.9, 0.18, 0.69) and not RULES["adaedl"](0.9, 0.9, 0.18, 0.71)
    # logit margin: p1 - p2 >= 1 - p1
    assert RULES["logit-margin"](0.7, 0.31, 0.0, 0.0) and not RULES["logit-margin"](0.7, 0.29, 0.0, 0.0)


def test_round_reward_blends_length_and_rate():
    assert round_reward(4, 2, 8) == pytest.approx(0.5 * 2 / 8 + 0.5 * 2 / 4)
    assert round_reward(8, 8, 8) == 1.0
    assert round_reward(0, 0, 8) == 0.0


def test_ucb1_plays_every_arm_then_the_best_bound():
    bandit = Ucb1(3)
    assert [bandit.pick() for _ in range(3)] == [0, 1, 2]
    for arm, r in enumerate([0.2, 0.9, 0.5]):
        bandit.reward(arm, r)
    # scores r + sqrt(2 ln 3 / 1): arm 1 has the highest mean
    assert bandit.score(1) == pytest.approx(0.9 + math.sqrt(2 * math.log(3)))
    assert bandit.pick() == 1


def test_unknown_arm_is_an_input_error():
    with pytest.raises(InputError, match="tapout.arms"):
        TapOutPolicy(make_ctx(), arms=("psychic",))


def test_each_arm_stops_early_on_a_low_confidence_token():
    ctx = make_ctx()
    k_max = ctx.k_max
    top1 = np.full((1, k_max), 0.97)
    top1[0, 1] = 0.2  # position 2 is a coin toss: every arm stops there
    state = make_state(top1, entropy=np.where(top1 > 0.5, 0.05, 2.0), margin=np.where(top1 > 0.5, 0.95, 0.05))
    for arm in ARMS:
        policy = TapOutPolicy(ctx, arms=(arm,))
        assert policy.decide(state).ks.tolist() == [2], arm


def test_bandit_moves_to_the_arm_that_earns_more():
    ctx = make_ctx()
    policy = TapOutPolicy(ctx, arms=("max-confidence", "svip"))
    k_max = ctx.k_max
    # max-confidence drafts all k_max tokens (p1 high), svip stops at 1 (entropy high);
    # every drafted token is accepted, so max-confidence earns reward 1 and svip about 0.56
    top1 = np.full((4, k_max), 0.9)
    state = make_state(top1, entropy=np.full((4, k_max), 1.5))
    for _ in range(50):
        ks = policy.decide(state).ks
        policy.observe(make_outcome(state, ks, ks))
    assert policy.bandit.pulls[0] > 3 * policy.bandit.pulls[1]


def test_adaedl_threshold_follows_acceptance():
    ctx = make_ctx()
    policy = TapOutPolicy(ctx)
    state = make_state(np.full((4, ctx.k_max), 0.9))
    for _ in range(30):
        ks = policy.decide(state).ks
        policy.observe(make_outcome(state, ks, ks))  # everything accepted
    assert policy.adaedl_lambda < 0.1


def test_tapout_runs_in_simulator_within_k_max_and_is_deterministic():
    seen = []
    result, policy = run_sim("tapout", load=8, duration_s=2.0, seed=2, recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 1 and ks.max() <= policy.ctx.k_max
    assert sum(policy.bandit.pulls) == len(ks)
    again, _ = run_sim("tapout", load=8, duration_s=2.0, seed=2)
    assert again.throughput_tok_s == result.throughput_tok_s > 0
