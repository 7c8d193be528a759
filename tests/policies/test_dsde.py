import math

import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim

from tabletune.policies.dsde import (DsdePolicy, dsl_length, dynamic_bounds, intensity_ratio, kl_proxy,
                                     straggler_cap, weighted_variance)


def test_kl_proxy_is_greedy_target_cross_entropy():
    # accepted token: -log p1; first rejected: -log p2 with p2 = p1 - margin; later ones censored (NaN)
    out = kl_proxy(np.array([[0.5, 0.25, 0.9], [0.5, 0.5, 0.5]]), np.array([[0.3, 0.05, 0.8], [0.1, 0.1, 0.1]]),
                   ks=np.array([3, 2]), accepted=np.array([1, 2]))
    np.testing.assert_allclose(out, [[-math.log(0.5), -math.log(0.2), np.nan], [math.log(2), math.log(2), np.nan]])


def test_weighted_variance_and_intensity_ratio_by_hand():
    # values 0, 2 with weights 1, 1: mean 1, variance 1
    assert weighted_variance(np.array([0.0, 2.0]), np.array([1.0, 1.0])) == pytest.approx(1.0)
    assert intensity_ratio([1.0]) == 0.0
    assert intensity_ratio([0.5, 0.5, 0.5]) == 20.0  # flat history: long-window variance below 1e-6
    # 0, 0, 3: short window (n // 3 = 1 value) has variance 0; the ratio is 0
    assert intensity_ratio([0.0, 0.0, 3.0]) == 0.0
    # 0, 0, 0, 0, 3, 3 (short = last 2: variance 0)... and a spike at the end of 0, 1, 0, 1, 0, 4:
    # short = (0, 4), weights (0.9, 1): mean 4/1.9, variance 0.9*1.9^-2*16 ... computed directly
    x = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 4.0])
    w6 = 0.9 ** np.arange(5, -1, -1)
    want = weighted_variance(x[-2:], np.array([0.9, 1.0])) / weighted_variance(x, w6)
    assert intensity_ratio(x) == pytest.approx(want) and want > 1.0  # a recent spike: unstable


def test_dsl_length_by_hand():
    # risk = WVIR * (exp(2 kl) - 1) = 0.5 * (e^1 - 1) = 0.859: SL = ceil(6 * 0.141 + 1) = 2
    assert dsl_length(0.5, 0.5, 1, 7) == 2
    assert dsl_length(0.0, 3.0, 1, 7) == 7  # calm history: the upper bound
    assert dsl_length(2.0, 0.5, 1, 7) == 1  # risk > 1: the lower bound
    assert dsl_length(1.0, 0.1, 2, 6) == math.ceil(4 * (1 - (math.exp(0.2) - 1)) + 2)


def test_dynamic_bounds_by_hand():
    # max m = 4, mean KL 0.5, max KL 1: k_hi = round(4 * 1.25) = 5; k_lo = ceil(0.5) = 1
    assert dynamic_bounds([1, 4, 2], [0.0, 1.0, 0.5, 0.5], 1, 7) == (1, 5)
    assert dynamic_bounds([7, 7], [1.0], 1, 7) == (1, 7)  # capped at k_max
    assert dynamic_bounds([], [], 1, 7) == (1, 7)


def test_straggler_cap_is_ceil_of_the_mean():
    assert straggler_cap([1, 2, 7]) == 4 and straggler_cap([3, 3]) == 3 and straggler_cap([]) == 0


def test_warmup_doubles_on_full_acceptance_then_bounds_and_cap_apply():
    policy = DsdePolicy(make_ctx(), window=6)
    k_max = policy.ctx.k_max
    state = make_state(np.full((2, k_max), 0.9), ids=[1, 2])
    assert policy.decide(state).ks.tolist() == [3, 3]
    kl = np.full((2, k_max), 0.05)
    policy.observe(make_outcome(state, [3, 3], [3, 1], kl=kl))  # request 1 accepted all: 3 -> 6
    assert [policy.seq(1).k, policy.seq(2).k] == [6, 3]
    assert all(policy.seq(i).bounds is None for i in (1, 2))
    policy.observe(make_outcome(state, [6, 3], [2, 0], kl=kl))  # 9 and 6 values: both warm
    assert policy.seq(1).bounds == dynamic_bounds([3, 2], [0.05] * 9, 1, k_max)
    ks = policy.decide(state).ks
    sl = [policy.length(policy.seq(i)) for i in (1, 2)]
    assert ks.tolist() == [min(x, straggler_cap(sl)) for x in sl]


def test_finished_requests_are_forgotten_and_zero_drafts_skipped():
    policy = DsdePolicy(make_ctx())
    state = make_state(np.full((2, policy.ctx.k_max), 0.8), ids=[7, 8])
    policy.decide(state)
    policy.observe(make_outcome(state, [0, 2], [0, 1], kl=np.zeros((2, policy.ctx.k_max)), finished=[7]))
    assert policy.request_ids() == {8} and len(policy.seq(8).history) == 2


def test_without_engine_kl_the_proxy_is_used():
    policy = DsdePolicy(make_ctx())
    state = make_state(np.full((1, policy.ctx.k_max), 0.5))
    policy.decide(state)
    policy.observe(make_outcome(state, [3], [3]))
    assert list(policy.seq(0).history) == pytest.approx([math.log(2)] * 3)


def test_dsde_runs_in_simulator_within_k_max_and_is_deterministic():
    seen = []
    result, policy = run_sim("dsde", load=16, duration_s=2.0, seed=4, recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 1 and ks.max() <= policy.ctx.k_max and len(set(ks.tolist())) > 1
    again, _ = run_sim("dsde", load=16, duration_s=2.0, seed=4)
    assert again.throughput_tok_s == result.throughput_tok_s > 0


def test_batch_arrays_follow_the_per_sequence_rule():
    """Over random steps, decide's lengths are the per-sequence rule on each sequence's own history."""
    policy = DsdePolicy(make_ctx(), window=8)
    k_max, b = policy.ctx.k_max, 12
    rng = np.random.default_rng(3)
    next_id, ids, warm_seen = b, np.arange(b), 0
    for step in range(40):
        state = make_state(rng.uniform(0.1, 0.99, (b, k_max)), ids=ids)
        ks = policy.decide(state).ks
        snaps = [policy.seq(int(i)) for i in ids]
        sl = np.array([policy.length(s) for s in snaps])
        warm = np.array([s.bounds is not None for s in snaps])
        expected = np.where(warm, np.minimum(sl, straggler_cap(sl[warm])) if warm.any() else sl, sl)
        assert ks.tolist() == expected.tolist(), step
        warm_seen += int(warm.sum())
        accepted = np.minimum(ks, rng.integers(0, k_max + 1, b))
        kl = rng.exponential(0.3, (b, k_max)) * rng.choice([0.2, 1.0, 5.0], (b, 1))
        finished = ids[rng.random(b) < 0.1]
        policy.observe(make_outcome(state, ks, accepted, kl=kl, finished=finished))
        for i in np.flatnonzero(np.isin(ids, finished)):
            ids[i], next_id = next_id, next_id + 1
    assert warm_seen > 100


def test_history_keeps_the_last_window_values_in_order():
    policy = DsdePolicy(make_ctx(), window=5)
    k_max = policy.ctx.k_max
    state = make_state(np.full((1, k_max), 0.9), ids=[4])
    for step, k in enumerate((3, 3)):
        policy.decide(state)
        kl = np.arange(k_max, dtype=float)[None, :] + 10 * step
        policy.observe(make_outcome(state, [k], [k - 1], kl=kl))
    assert policy.seq(4).history == [1.0, 2.0, 10.0, 11.0, 12.0]
