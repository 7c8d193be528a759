import math

import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim

from tabletune.policies.dsde import (
    DsdeConfig,
    DsdePolicy,
    capped_lengths,
    fit_kl_scale,
    ew_update,
    kl_proxy,
    stable_lengths,
    straggler_cap,
)


def test_kl_proxy_is_greedy_target_cross_entropy():
    # accepted token: -log p1; first rejected: -log p2 with p2 = p1 - margin; later ones censored (NaN)
    out = kl_proxy(np.array([[0.5, 0.25, 0.9], [0.5, 0.5, 0.5]]), np.array([[0.3, 0.05, 0.8], [0.1, 0.1, 0.1]]),
                   ks=np.array([3, 2]), accepted=np.array([1, 2]))
    np.testing.assert_allclose(out, [[-math.log(0.5), -math.log(0.2), np.nan], [math.log(2), math.log(2), np.nan]])


def test_ew_statistics_hand_worked():
    cfg = DsdeConfig(window=3)  # alpha = 0.5
    mean, var, count = np.zeros(2), np.zeros(2), np.zeros(2, np.int64)
    for x in ([1.0, np.nan], [3.0, 2.0]):
        mean, var, count = ew_update(mean, var, count, np.array(x), cfg.alpha)
    # row 0: first value sets mu = 1; then d = 2: mu = 2, var = 0.5 * (0 + 0.5 * 4) = 1
    assert mean.tolist() == [2.0, 2.0] and var.tolist() == [1.0, 0.0] and count.tolist() == [2, 1]


def test_stable_length_hand_worked():
    cfg = DsdeConfig(k_max=8, k_start=3)
    z = np.array([np.nan, 0.1, 0.2, 0.0, 50.0])
    # floor(ln 2 / 0.1) = 6, floor(ln 2 / 0.2) = 3, z = 0: k_max, huge z: k_min; NaN: k_start
    assert stable_lengths(z, cfg).tolist() == [3, 6, 3, 8, 1]
    assert stable_lengths(np.array([0.1]), cfg, scale=3.0).tolist() == [2]  # floor(ln 2 / 0.3)


def test_spiky_history_scores_worse_than_calm_of_equal_mean():
    policy = DsdePolicy(make_ctx(), window=3)
    state = make_state(np.full((2, policy.ctx.k_max), 0.8), ids=[0, 1])
    policy.decide(state)
    kl = np.full((2, policy.ctx.k_max), np.nan)
    kl[0, :4] = [0.1, 0.1, 0.1, 0.1]
    kl[1, :4] = [0.0, 0.2, 0.0, 0.2]
    policy.observe(make_outcome(state, [4, 4], [4, 4], kl=kl))
    z = policy.scores(np.array([0, 1]))
    assert z[0] == pytest.approx(0.1) and z[1] > 0.15


def test_fit_kl_scale_matches_the_acceptance_rate():
    z = np.full(100, 0.2)
    accepted = np.r_[np.ones(45), np.zeros(55)]  # rate 0.45 = exp(-c 0.2) -> c = -ln(0.45) / 0.2
    assert fit_kl_scale(z, accepted) == pytest.approx(-math.log(0.45) / 0.2, rel=1e-4)


def test_straggler_cap():
    # mean 2.75, sd 3.03 -> cap ceil(5.78) = 6
    assert straggler_cap([1, 1, 1, 8]) == 6
    assert capped_lengths([1, 1, 1, 8]).tolist() == [1, 1, 1, 6]
    assert capped_lengths([4, 4]).tolist() == [4, 4]


def _feed(policy, kl_value, steps, ids=(0, 1)):
    k_max = policy.ctx.k_max
    for step in range(steps):
        state = make_state(np.full((len(ids), k_max), 0.8), ids=ids, step=step)
        ks = policy.decide(state).ks
        kl = np.full((len(ids), k_max), kl_value)
        kl[np.arange(k_max)[None, :] >= ks[:, None]] = np.nan
        policy.observe(make_outcome(state, ks, np.maximum(ks - 1, 0), kl=kl))
    return policy.decide(make_state(np.full((len(ids), k_max), 0.8), ids=ids)).ks


def test_calm_sequences_draft_long_and_turbulent_ones_short():
    ctx = make_ctx()
    calm = _feed(DsdePolicy(ctx), 0.01, 20)
    rough = _feed(DsdePolicy(ctx), 3.0, 20)
    assert calm.min() > rough.max()
    assert calm.max() <= ctx.k_max and rough.min() >= 1


def test_finished_requests_are_forgotten():
    policy = DsdePolicy(make_ctx())
    state = make_state(np.full((2, policy.ctx.k_max), 0.8), ids=[7, 8])
    ks = policy.decide(state).ks
    policy.observe(make_outcome(state, ks, [0, 0], kl=np.zeros((2, policy.ctx.k_max)), finished=[7]))
    assert set(policy.rows) == {8} and len(policy.free) == len(policy.mean) - 1


def test_without_engine_kl_the_proxy_is_used():
    policy = DsdePolicy(make_ctx())
    state = make_state(np.full((1, policy.ctx.k_max), 0.5))
    policy.decide(state)
    policy.observe(make_outcome(state, [3], [3]))
    row = policy.rows[0]
    assert policy.count[row] == 3 and policy.mean[row] == pytest.approx(math.log(2)) and policy.var[row] < 1e-12


def test_dsde_runs_in_simulator_within_k_max_and_is_deterministic():
    seen = []
    result, policy = run_sim("dsde", load=16, duration_s=2.0, seed=4, recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 1 and ks.max() <= policy.ctx.k_max and len(set(ks.tolist())) > 1
    assert policy.scale != 1.0  # calibrated against the simulator's KL signal
    again, _ = run_sim("dsde", load=16, duration_s=2.0, seed=4)
    assert again.throughput_tok_s == result.throughput_tok_s > 0
