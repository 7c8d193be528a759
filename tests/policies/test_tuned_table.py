from helpers_batch import ctx, state
from tabletune.goodput import expected_tokens
from tabletune.policies import make_policy


def test_tuned_table_is_argmax_goodput_at_every_b():
    c = ctx()
    p = make_policy("tabletune", c)
    for b in (1, 8, 30, 64, 128):
        scores = {k: expected_tokens(c.prior_rates, k) / c.cost.step_ms(b, k) for k in c.ks}
        best = max(sorted(scores), key=lambda k: (scores[k], -k))
        assert p.decide(state(b)).k == best


def test_cheap_drafts_give_long_k_at_low_load_and_short_at_high():
    p = make_policy("tabletune", ctx())
    # b=1: T = 10.1 + 1.05k; E[tokens|4] = 3.093 -> 0.2163/ms beats E[tokens|5] = 3.257 -> 0.2122/ms
    assert p.decide(state(1)).k == 4
    assert p.decide(state(128)).k < p.decide(state(1)).k
