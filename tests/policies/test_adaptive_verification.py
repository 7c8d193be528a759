import numpy as np
import pytest
from per_request_helpers import linear_cost, make_ctx, make_outcome, make_state, run_sim

from tabletune.policies.adaptive_verification import (
    AdaptiveVerificationPolicy,
    ConfidenceCalibrator,
    allocate_budget,
)


def test_budget_hand_worked():
    # slots by survival .9, .81, .5, .25; E(B) = 2, 2.9, 3.71, 4.21, 4.46; T(B) = 10 + 2.5 B
    # Theta = .2, .232, .2473, .2406, .223 -> admit 2 slots, both to request 0
    survival = np.array([[0.9, 0.81], [0.5, 0.25]])
    budget = allocate_budget(survival, linear_cost())
    assert budget.ks.tolist() == [2, 0] and budget.slots == 2
    assert budget.expected_tokens == pytest.approx(3.71)
    assert budget.step_ms == pytest.approx(15.0)
    assert budget.theta == pytest.approx(3.71 / 15.0)


def test_budget_extremes():
    survival = np.array([[0.99, 0.98], [0.97, 0.96]])
    assert allocate_budget(survival, linear_cost(per_k_ms=0.01)).ks.tolist() == [2, 2]  # slots nearly free
    assert allocate_budget(survival, linear_cost(per_k_ms=100.0)).ks.tolist() == [0, 0]  # slots too dear


def test_longest_draft_sets_drafting_time():
    # draft_share 1: the step costs T(b, k_top). One long draft makes everyone pay for it, so a
    # cap of 1 (two slots, k_top 1) beats admitting request 0's second slot (k_top 2).
    survival = np.array([[0.9, 0.6], [0.8, 0.3]])
    budget = allocate_budget(survival, linear_cost(base_ms=10, per_k_ms=10, draft_share=1.0))
    # cap 1: (2 + 1.7) / 20 = 0.185; cap 2 all four: (2 + 2.6) / 30 = 0.153; no speculation: 0.2?
    # 2 / 10 = 0.2 is best here: speculation off
    assert budget.ks.tolist() == [0, 0]
    budget = allocate_budget(survival, linear_cost(base_ms=20, per_k_ms=10, draft_share=1.0))
    # off 2/20 = .1; cap 1: 3.7 / 30 = .123; cap 2: 4.6 / 40 = .115 -> cap 1
    assert budget.ks.tolist() == [1, 1]


def test_sunk_drafting_prices_verification_only():
    # every row drafts k_max = 2 anyway: T(B) = V(b, B / b) + D(b, 2). draft_share 1: V = T0 = 10 + ... flat,
    # so every slot is worth admitting: (2 + 2.6) / (10 + 20) beats (2 + 1.7) / 30 and 2 / 30
    survival = np.array([[0.9, 0.6], [0.8, 0.3]])
    budget = allocate_budget(survival, linear_cost(base_ms=10, per_k_ms=10, draft_share=1.0), sunk_draft=True)
    assert budget.ks.tolist() == [2, 2] and budget.step_ms == pytest.approx(30.0)
    # draft_share 0: nothing is sunk, T(B) = T(b, B / b) as without it
    free = linear_cost(base_ms=10, per_k_ms=10, draft_share=0.0)
    assert allocate_budget(survival, free, sunk_draft=True).ks.tolist() == allocate_budget(survival, free).ks.tolist()


def test_calibrator_prior_then_data():
    cal = ConfidenceCalibrator(prior_rate=0.6, num_bins=10, prior_weight=5.0, decay=1.0)
    assert cal(np.array([0.05, 0.95])).tolist() == pytest.approx([0.6, 0.6])
    cal.update(np.full(15, 0.95), np.ones(15))
    cal.update(np.full(15, 0.05), np.zeros(15))
    # (15 + 5 * .6) / 20 = .9 and (0 + 3) / 20 = .15
    assert cal(np.array([0.05, 0.95])).tolist() == pytest.approx([0.15, 0.9])


def test_policy_learns_only_from_tested_tokens():
    ctx = make_ctx()
    policy = AdaptiveVerificationPolicy(ctx)
    state = make_state(np.full((1, ctx.k_max), 0.95))
    policy.decide(state)
    policy.observe(make_outcome(state, [5], [2]))  # positions 1, 2 accepted, 3 rejected, 4-5 untested
    assert policy.calibrator.tested.sum() == pytest.approx(3.0)
    assert policy.calibrator.accepted.sum() == pytest.approx(2.0)


def test_confident_requests_get_the_slots():
    ctx = make_ctx()
    policy = AdaptiveVerificationPolicy(ctx)
    top1 = np.full((64, ctx.k_max), 0.97)
    top1[32:] = 0.03
    for _ in range(30):  # teach the calibrator: confident tokens pass, unconfident ones fail
        state = make_state(top1)
        ks = policy.decide(state).ks
        policy.observe(make_outcome(state, ks, np.where(top1[:, 0] > 0.5, ks, 0)))
    ks = policy.decide(make_state(top1)).ks
    assert ks[:32].min() > ks[32:].max()
    assert ks.max() <= ctx.k_max


def test_adaptive_verification_in_simulator_is_deterministic_and_near_best_fixed():
    seen = []
    result, policy = run_sim("adaptive-verification", load=32, duration_s=2.0, seed=1,
                             recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 0 and ks.max() <= policy.ctx.k_max
    again, _ = run_sim("adaptive-verification", load=32, duration_s=2.0, seed=1)
    assert again.throughput_tok_s == result.throughput_tok_s
    best_fixed = max(run_sim(f"fixed:{k}", load=32, duration_s=2.0, seed=1)[0].throughput_tok_s for k in (1, 3, 5))
    assert result.throughput_tok_s >= 0.9 * best_fixed


@pytest.mark.parametrize("spec", ["disco", "tapout", "dsde", "gammatune", "adaptive-verification", "hybrid-spark"])
def test_every_per_request_policy_handles_k_max_1_and_an_empty_batch(spec):
    from tabletune.policies import make_policy

    ctx = make_ctx(prior=(0.8,))
    ctx = type(ctx)(cost=ctx.cost, prior_rates=(0.8,), ks=(0, 1))
    policy = make_policy(spec, ctx)
    state = make_state(np.full((3, 1), 0.9))
    ks = policy.decide(state).ks_for(3)
    assert ((ks >= 0) & (ks <= 1)).all()
    policy.observe(make_outcome(state, ks, np.minimum(ks, 1)))
    empty = make_state(np.zeros((0, 1)))
    assert len(policy.decide(empty).ks_for(0)) == 0
