"""benchmarks/plan_ahead.py's ``StalePlans``: the per-request plan made on each row's lookup class of the step
before, with the device's fallback for a row whose n-gram chain proposes nothing now (hand-worked)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import plan_ahead  # noqa: E402

from tabletune.policies.base import MODEL, NGRAM, BatchState, Decision  # noqa: E402


class Controller:
    def k_for(self, batch_size: int) -> int:
        return 3


class Planner:
    """Puts a row on the n-gram chain at its proposals where it sees a match, else the model chain at k = 2."""

    controller = Controller()

    def __init__(self) -> None:
        self.seen: list[tuple[list[int], list[int]]] = []

    def decide(self, state: BatchState) -> Decision:
        match, proposed = np.asarray(state.ngram_match_len), np.asarray(state.ngram_num_proposed)
        self.seen.append((match.tolist(), proposed.tolist()))
        on_ngram = match > 0
        return Decision.per_request(np.where(on_ngram, proposed, 2), np.where(on_ngram, NGRAM, MODEL))


def state(step: int, ids, match, proposed) -> BatchState:
    n = len(ids)
    return BatchState(step, 0.01 * step, np.array(ids), np.zeros(n, np.int64), ngram_match_len=np.array(match),
                      ngram_num_proposed=np.array(proposed))


def test_plans_on_the_classes_of_the_step_before_and_falls_back_where_nothing_is_proposed():
    inner = Planner()
    policy = plan_ahead.StalePlans(inner, fallback=True)
    first = policy.decide(state(0, [7, 8], [3, 0], [4, 0]))
    assert inner.seen[0] == ([0, 0], [0, 0])  # no step before: no match
    assert first.ks.tolist() == [2, 2] and first.drafter.tolist() == [MODEL, MODEL]
    # request 9 is new; 7 matched 3 tokens (4 proposed) a step ago but its lookup proposes nothing now
    second = policy.decide(state(1, [7, 8, 9], [0, 2, 5], [0, 3, 6]))
    assert inner.seen[1] == ([3, 0, 0], [4, 0, 0])
    assert second.ks.tolist() == [3, 2, 2] and second.drafter.tolist() == [MODEL, MODEL, MODEL]
    third = policy.decide(state(2, [8, 9], [2, 5], [3, 6]))
    assert inner.seen[2] == ([2, 5], [3, 6])
    assert third.ks.tolist() == [3, 6] and third.drafter.tolist() == [NGRAM, NGRAM]


def test_without_the_fallback_such_a_row_verifies_nothing():
    policy = plan_ahead.StalePlans(Planner(), fallback=False)
    policy.decide(state(0, [7], [3], [4]))
    got = policy.decide(state(1, [7], [0], [0]))
    assert got.ks.tolist() == [0] and got.drafter.tolist() == [NGRAM]
    assert policy.controller.k_for(1) == 3  # the rest of the policy is the inner one's


class Wants:
    """Plans the given ks step by step: row 0 and 1 on the model chain, row 2 on the n-gram chain."""

    controller = Controller()

    def __init__(self, plans) -> None:
        self.plans = iter(plans)

    def decide(self, state: BatchState) -> Decision:
        return Decision.per_request(np.array(next(self.plans)), np.array([MODEL, MODEL, NGRAM]))


def test_a_device_plan_drafts_to_the_depth_the_step_before_wanted():
    """The launch's depth is the deepest model draft the plan of the step before wanted (the first step's own): model
    rows deeper are capped at it, shallower ones draft it all the same (``launch_depth``); n-gram rows keep theirs."""
    policy = plan_ahead.DevicePlans(Wants([[3, 1, 6], [5, 2, 6], [1, 1, 7]]))
    got = []
    for step in range(3):
        d = policy.decide(state(step, [7, 8, 9], [0, 0, 4], [0, 0, 7]))
        got.append((d.ks.tolist(), policy.launch_depth))
        assert d.drafter.tolist() == [MODEL, MODEL, NGRAM]
    assert got == [([3, 1, 6], 3), ([3, 2, 6], 3), ([1, 1, 7], 5)]
