import numpy as np
import pytest

from helpers_batch import ctx, linear_profile, outcome, state
from per_request_helpers import run_sim
from tabletune.policies import make_policy
from tabletune.policies.sglang import (DEFAULT_BUCKETS, best_k_with_margin, bucket_index, ema_update,
                                       expected_tokens, hysteresis_step, survival_by_position)

RATES7 = (0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)


def ctx7():
    return ctx(RATES7, linear_profile(bs=(1, 8, 64, 128, 256), ks=range(8)))


def test_ema_update_by_hand():
    # 0.8 * 2.0 + 0.2 * mean(1, 2, 3, 6) = 1.6 + 0.2 * 3 = 2.2
    assert ema_update(2.0, np.array([1, 2, 3, 6]), 0.2) == pytest.approx(2.2)
    assert ema_update(2.0, np.array([0, 0]), 1.0) == 0.0


def test_hysteresis_holds_inside_the_margin_and_switches_beyond_it():
    ks, up, down = (1, 3, 7), 0.0, -0.25
    # at k=3: down to 1 needs ema <= 1 - 0.5 - 0.25 = 0.25; up to 7 needs ema > 3 - 0.5 = 2.5
    assert hysteresis_step(0.30, 3, ks, up, down) == 3
    assert hysteresis_step(0.25, 3, ks, up, down) == 1
    assert hysteresis_step(2.50, 3, ks, up, down) == 3
    assert hysteresis_step(2.51, 3, ks, up, down) == 7
    # at k=7: down to 3 needs ema <= 3 - 0.75 = 2.25, so 2.4 stays (the 0.25-token band)
    assert hysteresis_step(2.40, 7, ks, up, down) == 7
    assert hysteresis_step(2.20, 7, ks, up, down) == 3
    assert hysteresis_step(0.20, 7, ks, up, down) == 1  # repeated steps down
    # at k=1: up needs ema > 0.5, then > 2.5 for a second step
    assert hysteresis_step(0.50, 1, ks, up, down) == 1
    assert hysteresis_step(0.60, 1, ks, up, down) == 3
    assert hysteresis_step(2.60, 1, ks, up, down) == 7


def test_no_step_up_right_after_a_step_down():
    # bucket [128, inf): up -0.1, down +0.25. At k=2 (ks 1, 2, 6), ema 0.7 <= 1 - 0.5 + 0.25 steps down to 1;
    # the rise test at k=1 (0.7 > 0.4) would bounce it back, and must not run
    assert hysteresis_step(0.7, 2, (1, 2, 6), -0.1, 0.25) == 1


def test_buckets_by_lower_bound_after_padding():
    bounds = tuple(b.lower_bs for b in DEFAULT_BUCKETS)  # (1, 64, 128)
    assert [bucket_index(b, bounds) for b in (1, 63, 64, 127, 128, 500)] == [0, 0, 1, 1, 2, 2]
    assert bucket_index(40, bounds, (1, 8, 32, 64, 128)) == 1  # 40 pads to 64
    assert bucket_index(300, bounds, (1, 64, 128)) == 2  # beyond the largest size: not padded


def test_buckets_keep_separate_state():
    p = make_policy("sglang", ctx7())
    assert [s.k for s in p.slots] == [3, 2, 2]  # k_start 3, else the middle candidate
    for _ in range(15):  # small batches accept everything: bucket [1, 64) climbs
        st = state(4)
        k = p.decide(st).k
        p.observe(outcome(st, [k] * 4, [k] * 4))
    assert p.slots[0].k == 7
    assert p.slots[1].k == 2 and p.slots[1].ema == 1.0 and p.slots[1].steps == 0
    for _ in range(15):  # large batches reject everything: bucket [128, inf) drops
        st = state(130)
        k = p.decide(st).k
        p.observe(outcome(st, [k] * 130, [0] * 130))
    assert p.slots[2].k == 1 and p.slots[0].k == 7
    assert p.decide(state(4)).k == 7 and p.decide(state(130)).k == 1


def test_warmup_and_interval():
    p = make_policy("sglang", ctx7())
    seen = []
    for _ in range(16):
        st = state(2)
        k = p.decide(st).k
        seen.append(k)
        p.observe(outcome(st, [k] * 2, [k] * 2))
    # ema from 2.0: 2.6, 3.08, ... > 2.5 after step 1, but no decision before step 10 + 5 = 15
    assert seen[:15] == [3] * 15 and seen[15] == 7


def test_survival_and_expected_tokens_by_hand():
    assert survival_by_position(np.array([0, 1, 3, 3]), 3).tolist() == [0.75, 0.5, 0.5]
    assert expected_tokens([0.75, 0.5, 0.5], 3) == pytest.approx(2.75)
    # two known rates 0.8, 0.4: a = 0.5, missing p_2 = min(0.4, 0.2) = 0.2
    assert expected_tokens([0.8, 0.4, None], 3) == pytest.approx(2.4)
    assert expected_tokens([0.6, None], 2) == pytest.approx(2.2)
    assert expected_tokens([None], 1) is None


def test_best_k_with_margin():
    assert best_k_with_margin({1: 1.0, 3: 1.09}, 1, 0.1) == 1  # within 10%: keep
    assert best_k_with_margin({1: 1.0, 3: 1.11}, 1, 0.1) == 3
    assert best_k_with_margin({1: None, 3: 0.5}, 1, 0.1) == 3  # current unscored: take the best
    assert best_k_with_margin({1: None, 3: None}, 1, 0.1) == 1


def test_throughput_strategy_picks_the_cheaper_k_when_acceptance_is_low():
    p = make_policy("sglang:strategy=throughput", ctx7())
    seen = []
    for _ in range(60):
        st = state(4)
        k = p.decide(st).k
        seen.append(k)
        p.observe(outcome(st, [k] * 4, [0, 0, 0, 0]))
    # the first decision waits for 20 full windows of positions < 3, then E = 1 at every k: the cheapest wins
    assert seen[:20] == [3] * 20 and seen[20:] == [1] * 40


def test_end_to_end_in_the_simulator():
    result, policy = run_sim("sglang", workload="code", load=8, duration_s=3.0)
    assert result.throughput_tok_s > 0
    assert policy.slots[0].steps > 100
    # code accepts well (a_j ~0.9 to 0.76): the EMA passes 2.5 and the small-batch bucket runs k = 7
    assert policy.slots[0].k == 7
    assert 5.0 < result.mean_k <= 7.0


def test_a_step_down_drops_the_windows_above_the_new_k():
    """After k 3 -> 1 the positions above 1 get no new evidence; kept, their stale zeros would pin k at 1
    after acceptance recovers. Dropped, they are extrapolated from p_0 and k steps back up."""
    p = make_policy("sglang:strategy=throughput", ctx7())
    seen = []
    for step in range(80):
        st = state(4)
        k = p.decide(st).k
        seen.append(k)
        good = step >= 20
        p.observe(outcome(st, [k] * 4, [k if good else 0] * 4))
        if step == 20:
            assert seen[-1] == 1 and [len(w) for w in p.windows[:3]] == [20, 0, 0]
    assert seen[:20] == [3] * 20 and seen[20] == 1
    assert max(seen[21:]) > 1  # acceptance recovered: a longer k again
