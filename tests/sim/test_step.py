"""``StepDraws``: one step's draws, hand-worked on replayed traces (no randomness in what is checked)."""

import numpy as np

from tabletune.cost import StepCost
from tabletune.profile import StepPoint, StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, Workload
from tabletune.sim.replay import NgramStreams, TraceStreams
from tabletune.sim.requests import RunningRequests
from tabletune.sim.step import StepDraws

# model chain by row: 1 1 0 1 | 1 1 1 0 (cyclic); n-gram chain: all accepted, 2 proposals at every row
MODEL = [1, 1, 0, 1, 1, 1, 1, 0]


def draws_at(rows, uses_features=True):
    top1 = np.linspace(0.1, 0.9, 8)
    trace = TraceStreams(top1, 1.0 - top1, top1 / 2, np.array(MODEL, bool), np.zeros(8, np.int64))
    ngram = NgramStreams(np.ones(8, bool), np.full(8, 2, np.int64), np.full(8, 5, np.int64))
    cost = StepCost(StepProfile(tuple(StepPoint(b, k, (10.0 + k,)) for b in (1, 8) for k in range(4)), 0))
    sim = Simulator(cost, Schedule.constant(Workload("w", (0.5, 0.5, 0.5))), SimConfig(duration_s=1.0, load=2),
                    replay=trace, ngram_replay=ngram)
    reqs = RunningRequests(sim.k_max)
    new = sim.new_requests(len(rows), 0.0, np.random.default_rng(0), 0)
    reqs.extend({**new, "trace_pos": np.asarray(rows, np.int64)})
    zeros = np.zeros(len(rows), np.int64)
    return StepDraws(sim, reqs, np.random.default_rng(1), True, uses_features, zeros), top1


def test_the_policy_sees_the_traces_signals_and_the_lookup():
    draws, top1 = draws_at([0, 4])
    state = draws.state(step=3, time_s=0.5)
    assert state.step == 3 and state.batch_size == 2
    assert np.allclose(state.features.top1_prob, [top1[0:3], top1[4:7]])
    assert state.ngram_num_proposed.tolist() == [2, 2] and state.ngram_match_len.tolist() == [5, 5]
    assert draws_at([0, 4], uses_features=False)[0].state(0, 0.0).features is None


def test_accepted_is_the_leading_run_capped_at_k_on_each_rows_chain():
    """Row 0 (rows 0..2: 1 1 0) accepts 2 of k = 3; row 1 (rows 4..6: 1 1 1) 1 of k = 1; on the n-gram chain
    (all accepted) row 0 accepts its k = 2."""
    draws, _ = draws_at([0, 4])
    assert draws.accepted(np.array([3, 1]), np.array([False, False])).tolist() == [2, 1]
    assert draws.accepted(np.array([2, 1]), np.array([True, False])).tolist() == [2, 1]
    assert draws.accepted(np.array([0, 0]), np.array([False, False])).tolist() == [0, 0]
    assert draws.fates()[0].tolist() == [2, 3] and draws.fates()[1].tolist() == [2, 2]
    assert draws.kl(np.array([3, 1])) is None  # traces record no KL
