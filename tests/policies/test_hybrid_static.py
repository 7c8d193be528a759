import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, run_sim

from tabletune.errors import InputError
from tabletune.policies import PER_REQUEST_POLICIES, make_policy
from tabletune.policies.base import ALWAYS_DRAFT, MODEL, NGRAM, BatchState, draft_stop_of
from tabletune.policies.hybrid_static import HybridStaticPolicy, choose_m, split_rows
from tabletune.policies.tuned_table import TunedTable


def lookup_state(match_len, num_proposed) -> BatchState:
    """The state a stop rule decides on: no model signal, the n-gram lookup only."""
    b = len(match_len)
    return BatchState(step=0, time_s=0.0, request_ids=np.arange(b, dtype=np.int64),
                      num_generated=np.zeros(b, np.int64), features=None,
                      ngram_match_len=np.asarray(match_len, np.int64),
                      ngram_num_proposed=np.asarray(num_proposed, np.int64))


def test_hand_worked_lookup_gives_exact_ks_and_drafters():
    """m = 3, k_max = 7, the tuned table's k at b = 4 is 5 (starter 8B profile, prior 0.8 .. 0.5).
    Row 0: match 5 >= 3, 9 proposed: n-gram, min(9, 7) = 7. Row 1: match 3 >= 3 (the boundary), 2 proposed: n-gram, 2.
    Row 2: match 2 < 3: model at the table's 5. Row 3: no match: model at 5."""
    ctx = make_ctx()
    policy = make_policy("hybrid-static:m=3", ctx)
    state = lookup_state([5, 3, 2, 0], [9, 2, 4, 0])
    assert TunedTable(ctx).k_for(state) == 5 and ctx.k_max == 7
    decision = policy.decide(state)
    assert decision.ks.tolist() == [7, 2, 5, 5]
    assert decision.drafter.tolist() == [NGRAM, NGRAM, MODEL, MODEL]


def test_a_match_with_nothing_to_propose_stays_on_the_model():
    rows = split_rows(np.array([4, 4]), np.array([0, 1]), m=2, k_model=3, k_max=7)
    assert rows.ks.tolist() == [3, 1] and rows.drafter.tolist() == [MODEL, NGRAM]


def test_without_a_lookup_it_is_the_tuned_table():
    ctx = make_ctx()
    state = BatchState(0, 0.0, np.arange(4, dtype=np.int64), np.zeros(4, np.int64))
    decision = make_policy("hybrid-static", ctx).decide(state)
    assert decision.ks is None and decision.k == TunedTable(ctx).k_for(state)


def test_m_option_default_and_bad_values():
    ctx = make_ctx()
    assert make_policy("hybrid-static", ctx).m == 1
    policy = make_policy("hybrid-static:m=3", ctx)
    assert isinstance(policy, HybridStaticPolicy) and policy.m == 3 and policy.label == "hybrid-static:m=3"
    for bad in ("m=0", "m=2.5"):
        with pytest.raises(InputError, match="m"):
            make_policy(f"hybrid-static:{bad}", ctx)
    assert "hybrid-static" in PER_REQUEST_POLICIES


def test_it_plans_before_drafting_and_never_ends_a_draft_early():
    ctx = make_ctx()
    policy = make_policy("hybrid-static", ctx)
    # no stop rule: it plans before drafting because it reads the lookup (``uses_lookup``)
    assert draft_stop_of(policy) is ALWAYS_DRAFT and not policy.uses_features and policy.uses_lookup
    state = lookup_state([2], [1])
    policy.observe(make_outcome(state, [1], [1], drafter=[NGRAM]))  # learns nothing: the same decision after
    assert policy.decide(state).ks.tolist() == [1]


def test_choose_m_hand_worked():
    """Loads 1 and 128: m = 1 gets 100 and 50 tok/s, m = 2 110 and 40, m = 3 90 and 55. Shares of each load's best:
    m = 1: (100/110 + 50/55) / 2 = 0.909; m = 2: (1 + 40/55) / 2 = 0.864; m = 3: (90/110 + 1) / 2 = 0.909.
    m = 1 and 3 tie: the smaller m."""
    choice = choose_m((1, 2, 3), np.array([[100.0, 50.0], [110.0, 40.0], [90.0, 55.0]]))
    assert choice.m == 1 and choice.mean_share == pytest.approx((0.9091, 0.8636, 0.9091), abs=1e-4)
    assert choose_m((1, 2, 3), np.array([[100.0, 50.0], [110.0, 40.0], [90.0, 56.0]])).m == 3
    with pytest.raises(ValueError, match="shape"):
        choose_m((1, 2), np.array([[100.0, 50.0]]))
    with pytest.raises(ValueError, match="ascending"):
        choose_m((2, 1), np.ones((2, 1)))


def test_in_the_simulator_rows_follow_the_lookup_without_model_signals():
    seen = []
    result, _ = run_sim("hybrid-static:m=3", load=8, duration_s=2.0, recorder=lambda d, s: seen.append((d, s)))
    assert result.throughput_tok_s > 0 and seen
    on_ngram = 0
    for decision, state in seen:
        assert state.features is None and state.ngram_match_len is not None  # no peeking; the lookup is there
        want = (state.ngram_match_len >= 3) & (state.ngram_num_proposed > 0)
        assert ((decision.drafter == NGRAM) == want).all()
        on_ngram += int(want.sum())
    assert on_ngram > 0
