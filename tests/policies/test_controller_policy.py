import numpy as np
import pytest

from helpers_batch import ctx, outcome, state
from tabletune.controller import Controller
from tabletune.policies import make_policy
from tabletune.policies.controller import ControllerPolicy, observation


def test_wraps_the_plugin_controller_class():
    p = make_policy("controller", ctx())
    assert isinstance(p, ControllerPolicy) and type(p.controller) is Controller


def test_observation_counts_are_censored_and_exact():
    st = state(3)
    obs = observation(outcome(st, [3, 3, 1], [0, 2, 1]), k_max=4, time_s=1.0)
    # drafted_j = #{k>=j}; accepted_j = #{m>=j}; reached_j = #{k>=j and m>=j-1}
    assert obs.drafted == (3, 2, 2, 0)
    assert obs.accepted == (2, 1, 0, 0)
    assert obs.reached == (3, 1, 1, 0)
    assert obs.num_drafts == 3 and obs.k == 3


def test_starts_from_given_table_and_corrects_it():
    c = ctx()
    p = make_policy("controller:start=documented-div4,warmup_drafts=10,min_install_interval_s=0", c)
    assert p.controller.table.k_for(64) == 0  # documented/4: k=0 above 32
    assert p.decide(state(64)).k == 5  # no evidence at position 1 yet: the first step explores k_max
    t = 0.0
    for _ in range(400):  # every draft fully accepted
        st = state(64, time_s=t)
        k = p.decide(st).k
        p.observe(outcome(st, [k] * 64, [k] * 64, 10.0))
        t += 0.01
    assert p.controller.installs >= 1
    # Why 5: ctx() allows k in 0..5 (five prior rates) on T(64, k) = 10 + 0.1*64 + k + 0.05*64*k
    # = 16.4 + 4.2 k ms. With every draft accepted the estimated rates approach 1, so E[tokens | k]
    # approaches k + 1 and goodput 64 (k + 1) / (16.4 + 4.2 k) rises with k (16.4 > 4.2):
    # k = 4: 5 / 33.2 = 0.151 < k = 5: 6 / 37.4 = 0.160 tokens per ms per request. k = 5 stays
    # best while the product of the five rates exceeds (37.4 / 33.2 - 1) * E[tokens | 4] ~ 0.63.
    assert p.controller.estimator.rates() == pytest.approx([1.0] * 5, abs=0.02)
    assert p.decide(state(64)).k == 5


def test_prior_option():
    p = make_policy("controller:prior=0.5/0.4/0.3", ctx())
    assert p.controller.estimator.prior[:3] == pytest.approx([0.5, 0.4, 0.3])
    assert np.all(np.array(p.controller.estimator.prior) > 0)


def test_a_late_observe_counts_the_k_asked_for_its_own_step(monkeypatch):
    """Observed one step late (``observe_may_lag``: an engine decides step 1 before it observes step 0), a step's
    observation still counts the k asked for that step, not the next one's."""
    import tabletune.policies.controller as mod

    p = make_policy("controller", ctx())
    asked = iter([2, 4])
    monkeypatch.setattr(p.controller, "k_for", lambda b: next(asked))
    seen = []
    monkeypatch.setattr(mod, "observation", lambda o, k_max, t, asked_k=0: seen.append(asked_k) or observation(
        o, k_max, t, asked_k))
    s0, s1 = state(4, step=0), state(4, step=1)
    assert (p.decide(s0).k, p.decide(s1).k) == (2, 4)
    p.observe(outcome(s0, [2] * 4, [1] * 4))
    p.observe(outcome(s1, [4] * 4, [1] * 4))
    assert seen == [2, 4]
