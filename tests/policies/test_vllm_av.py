import numpy as np
import pytest
from per_request_helpers import linear_cost, make_ctx, make_outcome, make_state

from tabletune.controller.calibration import LogitCalibration
from tabletune.policies import make_policy
from tabletune.policies.vllm_av import StartupCost, av_budget


def test_budget_hand_worked():
    # n = 2 requests; slots by survival .9, .81, .5, .25; E(B) = 2, 2.9, 3.71, 4.21, 4.46
    # cost(B) = draft_ms[2] + verify_ms[2 + B] = 2 + (10 + 2 (2 + B)) = 16, 18, 20, 22, 24
    # ratio = .125, .1611, .1855, .1914, .1858 -> B* = 3: the top-3 slots, request 0 keeps 2, request 1 keeps 1
    startup = StartupCost(np.array([0.0, 100.0]), np.array([10.0, 210.0]), np.array([1.0, 100.0]),
                          np.array([2.0, 2.0]))
    budget = av_budget(np.array([[0.9, 0.81], [0.5, 0.25]]), startup)
    assert budget.ks.tolist() == [2, 1] and budget.slots == 3
    assert budget.expected_tokens == pytest.approx(4.21)
    assert budget.step_ms == pytest.approx(22.0)


def test_startup_cost_reads_one_request_below_a_full_row():
    # f = 0: V = T = 10 + 5 k at every b; drafting D = 0. t <= k_max + 1 tokens: one request of t tokens
    cost = linear_cost(base_ms=10.0, per_k_ms=5.0, k_max=2)
    startup = StartupCost.from_cost(cost, k_max=2)
    assert startup.verify_at(np.array([1, 2, 3])).tolist() == pytest.approx([10.0, 15.0, 20.0])
    assert startup.verify_at(6.0) == pytest.approx(20.0)  # two full rows at b = 2: T(2, 2)
    assert startup.draft_at(4) == pytest.approx(0.0)


def test_full_verification_while_warming_up_then_budget():
    ctx = make_ctx()
    policy = make_policy("vllm-av:warmup_steps=3,refit_every=2", ctx)
    state = make_state(np.full((8, ctx.k_max), 0.3))
    for _ in range(3):
        assert policy.decide(state).ks.tolist() == [ctx.k_max] * 8
        policy.observe(make_outcome(state, [ctx.k_max] * 8, [0] * 8))
    assert policy.calibration.fits == 1  # refit at step 2
    ks = policy.decide(state).ks
    assert (ks < ctx.k_max).all()  # every tested token was rejected: the budget verifies less


def test_logistic_calibration_recovers_a_known_map():
    rng = np.random.default_rng(0)
    cal = LogitCalibration(k_max=2, memory=20_000)
    x = rng.normal(0, 2, 20_000)
    pos = rng.integers(0, 2, 20_000)
    truth = 1 / (1 + np.exp(-(0.5 * x + np.where(pos == 0, 1.0, -1.0))))
    cal.add(1 / (1 + np.exp(-x)), pos, (rng.random(20_000) < truth).astype(float))
    cal.refit()
    assert cal.coef == pytest.approx([0.5, 1.0, -1.0], abs=0.08)
