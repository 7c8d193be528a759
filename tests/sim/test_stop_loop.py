"""The simulator drafts position by position through ``draft_stop_of(policy)``: stopped rows cost nothing more."""

from typing import ClassVar

import numpy as np
import pytest

from tabletune.cost import StepCost
from tabletune.policies.base import BatchState, Decision, DraftFeatures, StepOutcome
from tabletune.profile import StepPoint, StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, Workload
from tabletune.sim.loop import draft_until_stopped


def stop_cost() -> StepCost:
    # T(b, k) = 10 + b + 4k, D(b, k) = b k at b in {1, 4} (tests/test_cost.py's worked example)
    pts = [StepPoint(b, k, (10.0 + b + 4 * k,)) for b in (1, 4) for k in range(4)]
    return StepCost.split(StepProfile(points=tuple(pts), context_len=0), lambda b, k: b * k)


class StopAt:
    """Caps ``caps`` from decide; row i stops after drafting position ``stops[i]``; logs every call."""

    name: ClassVar[str] = "stop-at"
    uses_features: ClassVar[bool] = True

    def __init__(self, caps, stops) -> None:
        self.caps, self.stops = np.array(caps), np.array(stops)
        self.calls: list[tuple[int, int, np.ndarray]] = []
        self.outcomes: list[StepOutcome] = []

    def decide(self, state: BatchState) -> Decision:
        return Decision.per_request(self.caps)

    def keep_drafting(self, state: BatchState, features: DraftFeatures, j: int, active: np.ndarray) -> np.ndarray:
        self.calls.append((j, features.top1_prob.shape[1], active.copy()))
        return active & (self.stops > j)

    def observe(self, outcome: StepOutcome) -> None:
        self.outcomes.append(outcome)


class ReadsAll(StopAt):
    """Reads every drafted position's signals, then decides: not a DraftStop (the sim drafts k_max for every row)."""

    keep_drafting = None


class OnDevice(StopAt):
    """The same stop rule, given as numbers an engine evaluates on the device (``device_stop_rule``)."""

    def device_stop_rule(self, state):
        return "a rule the engine evaluates on the device"


def first_step(policy, cost: StepCost | None = None) -> tuple[float, StepOutcome]:
    w = Workload("w", rates=(0.6, 0.6, 0.6), heterogeneity=0.0, output_len=10_000, prompt_len_mean=0.0)
    sim = Simulator(cost or stop_cost(), Schedule.constant(w), SimConfig(duration_s=0.001, load=2, seed=0))
    res = sim.run(policy)
    return float(res.steps.step_ms[0]), policy.outcomes[0]


def test_rows_stopping_at_chosen_positions_are_charged_by_hand():
    # row 0 drafts 3, row 1 stops after 1: a = (2, 1, 1), drafting 2 + 1 + 1 = 4, V~(2, 2) = 16: 20 ms
    policy = StopAt(caps=[3, 3], stops=[3, 1])
    step_ms, outcome = first_step(policy)
    assert step_ms == pytest.approx(20.0) and outcome.ks.tolist() == [3, 1]
    # the rule is asked after j = 1 and j = 2 with the signals of positions 1..j; row 1 is inactive at j = 2
    assert [(j, cols) for j, cols, _ in policy.calls] == [(1, 1), (2, 2)]
    assert policy.calls[1][2].tolist() == [True, False]
    # a cap ends a row as a stop does: caps (3, 2), no stop: a = (2, 2, 1), V~(2, 2.5) = 22 - 5 = 17, drafting 5
    step_ms, outcome = first_step(StopAt(caps=[3, 2], stops=[9, 9]))
    assert step_ms == pytest.approx(22.0) and outcome.ks.tolist() == [3, 2]
    # every row stops at j = 2: T(2, 2) = 20
    step_ms, outcome = first_step(StopAt(caps=[3, 3], stops=[2, 2]))
    assert step_ms == pytest.approx(20.0) and outcome.ks.tolist() == [2, 2]


def test_a_feature_policy_without_a_stop_rule_drafts_every_position():
    step_ms, outcome = first_step(ReadsAll(caps=[3, 1], stops=[0, 0]))
    # verified (3, 1): V~(2, 2) = 16; drafted (3, 3): D(2, 3) = 6
    assert step_ms == pytest.approx(22.0) and outcome.ks.tolist() == [3, 1]


@pytest.mark.parametrize("reads, host_stop_ms, device_stop_ms, reads_all_ms", [
    ({}, 21.5, 21.5, 23.5),
    ({"read_extra": ((1, 0.25), (4, 0.25)), "position_read_extra": ((1, 0.1), (4, 0.1))}, 21.95, 21.75, 23.75)])
def test_a_step_that_reads_between_drafting_and_verifying_pays_the_split_and_read_extras(reads, host_stop_ms,
                                                                                         device_stop_ms, reads_all_ms):
    """The engine drafts such a step position by position (a split step): with a split step costing 1.5 ms more at
    b = 2, the first hand-worked step above (20 ms) takes 21.5, the feature policy's (22 ms) 23.5. Where a read
    before verifying costs 0.25 ms and each further read of a stop rule on the host 0.1 ms, the stop rule's step (3
    positions drafted) reads after every position: 20 + 1.5 + 0.25 + 2 x 0.1 = 21.95; the same rule on the device
    reads the lengths once: 21.75; the feature policy reads once: 23.75."""
    import dataclasses

    cost = dataclasses.replace(stop_cost(), split_extra=((1, 1.5), (4, 1.5)), **reads)
    assert first_step(StopAt(caps=[3, 3], stops=[3, 1]), cost)[0] == pytest.approx(host_stop_ms)
    assert first_step(OnDevice(caps=[3, 3], stops=[3, 1]), cost)[0] == pytest.approx(device_stop_ms)
    assert first_step(ReadsAll(caps=[3, 1], stops=[0, 0]), cost)[0] == pytest.approx(reads_all_ms)


def test_draft_until_stopped_by_hand():
    policy = StopAt(caps=[0, 4, 4, 2], stops=[9, 1, 3, 9])
    state = BatchState(step=0, time_s=0.0, request_ids=np.arange(4), num_generated=np.zeros(4, np.int64))
    # no features (a policy that reads none): the rule gets None
    policy.keep_drafting = lambda s, f, j, active: active & (policy.stops > j)
    assert draft_until_stopped(policy, state, policy.caps).tolist() == [0, 1, 3, 2]


def test_a_stop_rule_decides_before_drafting_without_model_signals():
    # no peeking: decide sees no model signal of any position (features None) but the n-gram lookup;
    # keep_drafting gets positions 1..j; observe gets the drafted signals
    class Records(StopAt):
        def decide(self, state: BatchState) -> Decision:
            self.decided_on = state
            return super().decide(state)

    policy = Records(caps=[3, 3], stops=[3, 1])
    _, outcome = first_step(policy)
    state = policy.decided_on
    assert state.features is None
    assert state.ngram_match_len is not None and state.ngram_num_proposed is not None
    assert len(state.ngram_num_proposed) == 2
    assert outcome.state.features is not None and outcome.state.features.top1_prob.shape == (2, 3)


def test_before_drafting_keeps_the_lookup_and_drops_the_signals():
    top1 = np.array([[0.9, 0.8], [0.2, 0.1]])
    f = DraftFeatures(top1, 1 - top1, top1 / 2, np.array([3, 0]), np.array([2, 0]))
    state = BatchState(step=0, time_s=0.0, request_ids=np.arange(2), num_generated=np.zeros(2, np.int64), features=f)
    before = state.before_drafting()
    assert before.features is None and before.request_ids is state.request_ids
    assert before.ngram_match_len.tolist() == [3, 0] and before.ngram_num_proposed.tolist() == [2, 0]
