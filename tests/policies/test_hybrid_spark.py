import numpy as np
import pytest
from per_request_helpers import linear_cost, make_ctx, make_outcome, make_state, run_sim

from tabletune.policies.base import MODEL, NGRAM
from tabletune.policies.hybrid_spark import HybridSparkPolicy, buy, market, slot_slope_ms
from tabletune.policies.ngram_table import NgramTable


def test_buy_takes_the_chain_with_the_larger_surplus():
    ks, drafter, tokens = buy(np.array([[0.9, 0.5]]), np.array([[0.95, 0.9]]), price=0.6)
    # model: one slot worth it, surplus 0.3; n-gram: two, surplus 0.35 + 0.3
    assert ks.tolist() == [2] and drafter.tolist() == [NGRAM] and tokens.tolist() == pytest.approx([1.85])
    ks, drafter, _ = buy(np.array([[0.9, 0.5]]), np.array([[0.95, 0.9]]), price=0.96)
    assert ks.tolist() == [0] and drafter.tolist() == [MODEL]  # nothing is worth its price


def test_slot_slope_is_the_per_slot_cost():
    cost = linear_cost(per_k_ms=5.0)
    assert slot_slope_ms(cost, 2, 1.0) == pytest.approx(2.5)  # 5 ms per k, shared by 2 requests
    # the drafting share is paid every step (every row drafts k_max): a slot costs its verification only
    assert slot_slope_ms(linear_cost(per_k_ms=5.0, draft_share=0.4), 2, 1.0) == pytest.approx(1.5)


def test_market_prefers_ngram_copies_and_drops_worthless_slots():
    cost = linear_cost(base_ms=10.0, per_k_ms=5.0)
    surv_m = np.array([[0.6, 0.3], [0.6, 0.3]])
    surv_n = np.array([[0.99, 0.98], [0.0, 0.0]])  # request 0 sits in a copyable span
    choice = market(surv_m, surv_n, cost, rate=0.2)
    # price 0.2 * 2.5 = 0.5 per slot: request 0 buys both n-gram slots, request 1 one model slot
    assert choice.ks.tolist() == [2, 1] and choice.drafter.tolist() == [NGRAM, MODEL]


def test_hybrid_policy_uses_ngram_on_long_matches():
    ctx = make_ctx(ngram_rates=[0.0, 0.1, 0.1] + [0.95] * 30)
    policy = HybridSparkPolicy(ctx)
    top1 = np.full((2, ctx.k_max), 0.5)
    state = make_state(top1, ngram_match_len=[20, 0], ngram_num_proposed=[ctx.k_max, 0])
    decision = policy.decide(state)
    assert decision.drafter.tolist() == [NGRAM, MODEL]
    assert decision.ks[0] == ctx.k_max  # the long match is bought in full
    policy.observe(make_outcome(state, decision.ks, [decision.ks[0], 0], drafter=decision.drafter))
    assert policy.calibrator.tested.sum() == pytest.approx(1.0)  # model tokens only


def test_hybrid_spark_in_simulator_beats_model_only_fixed_on_code_edit():
    seen = []
    result, policy = run_sim("hybrid-spark", workload="code-edit", load=16, duration_s=4.0, seed=1,
                             recorder=lambda d, s: seen.append(d))
    drafters = np.concatenate([d.drafter for d in seen])
    ks = np.concatenate([d.ks for d in seen])
    assert ks.max() <= policy.ctx.k_max and (drafters == NGRAM).any() and (drafters == MODEL).any()
    again, _ = run_sim("hybrid-spark", workload="code-edit", load=16, duration_s=4.0, seed=1)
    assert again.throughput_tok_s == result.throughput_tok_s
    best_model_only = max(run_sim(f"fixed:{k}", workload="code-edit", load=16, duration_s=4.0, seed=1)[0]
                          .throughput_tok_s for k in (1, 3, 5))
    assert result.throughput_tok_s > best_model_only


def test_policy_reads_a_table_file(tmp_path):
    from tabletune.fileio import write_json

    table = NgramTable.from_length_rates([0.0, 0.1, 0.5, 0.9], k_max=2)
    path = tmp_path / "ngram.json"
    write_json(path, table.to_json())
    policy = HybridSparkPolicy(make_ctx(), ngram_table=str(path))
    np.testing.assert_allclose(policy.ngram.rates, table.rates)
