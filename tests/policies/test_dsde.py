import math

import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim

from tabletune.policies.dsde import (
    DsdeConfig,
    DsdePolicy,
    capped_lengths,
    fit_kl_scale,
    kl_proxy,
    stability_score,
    stable_length,
    straggler_cap,
)


def test_kl_proxy_is_greedy_target_cross_entropy():
    # accepted token: -log p1; first rejected: -log p2 with p2 = p1 - margin; later ones censored
    out = kl_proxy([0.5, 0.25, 0.9], [0.3, 0.05, 0.8], num_accepted=1)
    assert out == pytest.approx([-math.log(0.5), -math.log(0.2)])
    assert kl_proxy([0.5, 0.5], [0.1, 0.1], num_accepted=2) == pytest.approx([math.log(2)] * 2)


def test_stable_length_hand_worked():
    cfg = DsdeConfig(k_max=8, k_start=3, min_history=4)
    assert stability_score([0.1] * 3, cfg) is None
    assert stable_length(None, cfg) == 3
    z = stability_score([0.1] * 4, cfg)
    assert z == pytest.approx(0.1)  # mean 0.1, sd 0
    assert stable_length(z, cfg) == 6  # floor(ln 2 / 0.1) = 6
    assert stable_length(z, cfg, scale=3.0) == 2  # floor(ln 2 / 0.3) = 2
    # same mean, but spiky: sd 0.1 adds to the score and shortens the draft
    spiky = stability_score([0.0, 0.2, 0.0, 0.2], cfg)
    assert spiky == pytest.approx(0.2) and stable_length(spiky, cfg) == 3
    assert stable_length(0.0, cfg) == 8 and stable_length(50.0, cfg) == 1


def test_fit_kl_scale_matches_the_acceptance_rate():
    z = np.full(100, 0.2)
    accepted = np.r_[np.ones(45), np.zeros(55)]  # rate 0.45 = exp(-c 0.2) -> c = -ln(0.45) / 0.2
    assert fit_kl_scale(z, accepted) == pytest.approx(-math.log(0.45) / 0.2, rel=1e-4)


def test_straggler_cap():
    # mean 2.75, sd 3.03 -> cap ceil(5.78) = 6
    assert straggler_cap([1, 1, 1, 8]) == 6
    assert capped_lengths([1, 1, 1, 8]) == [1, 1, 1, 6]
    assert capped_lengths([4, 4]) == [4, 4]


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
    assert set(policy.history.items) == {8}


def test_without_engine_kl_the_proxy_is_used():
    policy = DsdePolicy(make_ctx())
    state = make_state(np.full((1, policy.ctx.k_max), 0.5))
    policy.decide(state)
    policy.observe(make_outcome(state, [3], [3]))
    assert list(policy.history.get(0)) == pytest.approx([math.log(2)] * 3)


def test_dsde_runs_in_simulator_within_k_max_and_is_deterministic():
    seen = []
    result, policy = run_sim("dsde", load=16, duration_s=2.0, seed=4, recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 1 and ks.max() <= policy.ctx.k_max and len(set(ks.tolist())) > 1
    assert policy.scale != 1.0  # calibrated against the simulator's KL signal
    again, _ = run_sim("dsde", load=16, duration_s=2.0, seed=4)
    assert again.throughput_tok_s == result.throughput_tok_s > 0
