import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim

from tabletune.policies.gammatune import GammaTuneConfig, GammaTunePolicy, gamma_target, gamma_to_k, update_gamma


def test_target_and_update_hand_worked():
    cfg = GammaTuneConfig(k_start=4, k_max=8)
    assert gamma_target(4, 4) == 5 and gamma_target(4, 1) == 1
    assert update_gamma(4.0, 4, 4, cfg) == pytest.approx(4.5)  # full acceptance: 0.5 * 4 + 0.5 * 5
    assert update_gamma(4.0, 4, 0, cfg) == pytest.approx(3.0)  # rejection: 0.75 * 4 + 0.25 * 0
    assert update_gamma(8.0, 8, 8, cfg) == 8.0  # clamped at k_max
    assert update_gamma(1.0, 1, 0, cfg) == 1.0  # clamped at k_min
    assert gamma_to_k(4.5, cfg) == 5 and gamma_to_k(4.49, cfg) == 4


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="grow"):
        GammaTuneConfig(grow=0.0)
    with pytest.raises(ValueError, match="k_min"):
        GammaTuneConfig(k_start=9, k_max=8)


def test_per_request_gamma_grows_on_acceptance_and_shrinks_on_rejection():
    ctx = make_ctx()
    policy = GammaTunePolicy(ctx)
    state = make_state(np.zeros((2, ctx.k_max)) + 0.5, ids=[10, 11])
    for _ in range(12):
        ks = policy.decide(state).ks
        policy.observe(make_outcome(state, ks, [ks[0], 0]))  # request 10 accepts all, 11 nothing
    ks = policy.decide(state).ks
    assert ks.tolist() == [ctx.k_max, 1]
    policy.observe(make_outcome(state, ks, [0, 0], finished=[10]))
    assert set(policy.gamma.items) == {11}


def test_gammatune_runs_in_simulator_within_k_max_and_is_deterministic():
    seen = []
    result, policy = run_sim("gammatune", load=8, duration_s=2.0, seed=3, recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 1 and ks.max() <= policy.ctx.k_max
    again, _ = run_sim("gammatune", load=8, duration_s=2.0, seed=3)
    assert again.throughput_tok_s == result.throughput_tok_s > 0
