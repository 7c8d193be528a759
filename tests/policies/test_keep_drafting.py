"""Each stop rule's ``keep_drafting``, run position by position, ends every row where its ``decide`` does."""

import copy
import dataclasses

import numpy as np
import pytest

from tabletune.policies import make_policy
from tabletune.policies.base import ALWAYS_DRAFT, draft_stop_of
from tabletune.sim.loop import draft_until_stopped

from per_request_helpers import make_ctx, make_outcome, make_state

B, K = 24, 7


def random_state(seed: int, ids=None):
    rng = np.random.default_rng(seed)
    top1 = rng.uniform(0.05, 0.999, (B, K))
    margin = top1 * rng.uniform(0.0, 1.0, (B, K))
    entropy = rng.uniform(0.0, 3.0, (B, K))
    return make_state(top1, entropy=entropy, margin=margin, ids=ids)


def without_features(state):
    return dataclasses.replace(state, features=None)


@pytest.mark.parametrize("spec", ["disco", "disco:variant=threshold", "tapout"])
def test_signal_rules_stop_where_decide_does(spec):
    """decide(with every position's signals) == the draft loop from the cap k_max, fed positions one by one."""
    policy = make_policy(spec, make_ctx())
    for step in range(6):
        state = random_state(step)
        twin = copy.deepcopy(policy)  # same bandit / threshold state
        ks = policy.decide(state).ks
        caps = twin.decide(without_features(state)).ks
        assert caps.tolist() == [K] * B
        lengths = draft_until_stopped(twin, state, caps)
        assert lengths.tolist() == ks.tolist()
        assert 0 < len(set(ks.tolist())) and ks.min() < K  # the rule does stop some rows
        # the outcome teaches both alike (accepted <= ks)
        accepted = np.minimum(ks, np.random.default_rng(step).integers(0, K + 1, B))
        policy.observe(make_outcome(state, ks, accepted))
        twin.observe(make_outcome(state, lengths, accepted))


@pytest.mark.parametrize("spec", ["gammatune", "dsde"])
def test_length_rules_stop_at_their_decided_length(spec):
    """GammaTune and DSDE set each row's length before drafting: from the cap k_max the loop stops there."""
    policy = make_policy(spec, make_ctx())
    rng = np.random.default_rng(1)
    seen = set()
    for step in range(60):
        state = random_state(step, ids=np.arange(B))
        ks = policy.decide(state).ks
        full = np.full(B, K, np.int64)
        assert draft_until_stopped(policy, state, full).tolist() == np.maximum(ks, 0).tolist()
        seen |= set(ks.tolist())
        accepted = np.minimum(ks, rng.integers(0, K + 1, B))
        kl = np.where(np.arange(K)[None, :] < ks[:, None], rng.uniform(0, 1, (B, K)), np.nan)
        policy.observe(make_outcome(state, ks, accepted, kl=kl))
    assert len(seen) > 1


def test_every_stop_rule_is_a_draft_stop_and_the_batch_rules_are_not():
    ctx = make_ctx()
    for spec in ("disco", "tapout", "gammatune", "dsde"):
        assert draft_stop_of(make_policy(spec, ctx)) is not ALWAYS_DRAFT, spec
    for spec in ("fixed:3", "adaptive-verification"):
        assert draft_stop_of(make_policy(spec, ctx)) is ALWAYS_DRAFT, spec
