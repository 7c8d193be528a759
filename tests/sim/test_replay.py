import gzip
from pathlib import Path

import numpy as np
import pytest

from tabletune.cost import StepCost
from tabletune.policies import make_policy
from tabletune.policies.base import BatchState, Decision, StepOutcome
from tabletune.profile import StepPoint, StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, Workload
from tabletune.sim.replay import TraceStreams, load_traces


def streams(accepted, request=None):
    acc = np.asarray(accepted, dtype=bool)
    n = len(acc)
    top1 = np.linspace(0.1, 0.9, n)
    return TraceStreams(top1, 1.0 - top1, top1 / 2, acc, np.zeros(n, np.int64) if request is None else
                        np.asarray(request, dtype=np.int64))


def test_window_is_cyclic_and_aligned():
    t = streams([1, 0, 1, 1, 0])
    ok, top1, entropy, margin = t.window(np.array([3, 0]), 3)
    assert ok.tolist() == [[True, False, True], [True, False, True]]  # rows 3,4,0 and 0,1,2
    assert top1[0].tolist() == pytest.approx([0.7, 0.9, 0.1]) and entropy.shape == (2, 3)


def test_conditional_rates_by_hand():
    # rows 1,0,1,1,0 (cyclic). Position 1: 3 of 5 accepted. Position 2, reached from starts 0, 2, 3:
    # rows 1, 3, 4 -> 1 of 3... row 1 is 0, row 3 is 1, row 4 is 0: 1/3
    rates = streams([1, 0, 1, 1, 0]).conditional_rates(2)
    assert rates == pytest.approx((0.6, 1 / 3))


def test_split_keeps_whole_requests():
    t = streams([1, 0, 1, 1, 0, 1], request=[0, 0, 1, 1, 2, 2])
    train, test = t.split(0.5, seed=0)
    assert set(train.request) | set(test.request) == {0, 1, 2} and not set(train.request) & set(test.request)
    assert train.num_rows + test.num_rows == 6


def test_load_traces_sorts_by_position_and_skips_ngram_rows(tmp_path):
    text = ("request,draft_start,draft_pos,gen_pos,top1_prob,entropy,margin,ngram_len,accept_prob,accepted\n"
            "a,2,1,2,0.5,1.0,0.2,0,0,0\na,1,1,1,0.9,0.1,0.8,0,1,1\nb,1,1,1,,,,3,1,1\n")
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    t = load_traces([path])
    assert t.top1_prob.tolist() == [0.9, 0.5] and t.accepted.tolist() == [True, False]


class Recorder:
    """Fixed k = 3 that records the features it was shown and the outcomes."""

    name = "recorder"
    uses_features = True

    def __init__(self):
        self.seen: list[tuple[BatchState, StepOutcome]] = []

    def decide(self, state):
        return Decision.per_request(np.full(state.batch_size, 3))

    def observe(self, outcome):
        self.seen.append(outcome)


def sim_with(trace, load=1):
    pts = tuple(StepPoint(b, k, (10.0 + k,)) for b in (1, 8) for k in range(4))
    cost = StepCost(StepProfile(points=pts, context_len=0))
    w = Workload("w", (0.5, 0.5, 0.5), output_len=10 ** 6)
    return Simulator(cost, Schedule.constant(w), SimConfig(duration_s=0.2, load=load), replay=trace)


def test_replay_drives_acceptance_and_features():
    # stream 1,1,0,1 | 1,1,1,0 (cyclic, 8 rows): a request starting at row r drafts rows r..r+2
    trace = streams([1, 1, 0, 1, 1, 1, 1, 0])
    policy = Recorder()
    sim_with(trace).run(policy)
    pos = int(round((policy.seen[0].state.features.top1_prob[0, 0] - 0.1) * 7 / 0.8))  # top1 = linspace(.1, .9, 8)
    for outcome in policy.seen[:20]:
        f = outcome.state.features
        ok, top1, *_ = trace.window(np.array([pos]), 3)
        assert f.top1_prob[0] == pytest.approx(top1[0])  # the policy sees the trace's signals
        assert outcome.accepted[0] == int(np.cumprod(ok[0]).sum())  # and the trace decides acceptance
        assert outcome.kl is None
        pos += int(outcome.accepted[0]) + 1


def test_replay_fixed_k_matches_the_trace_rates():
    trace = streams(np.random.default_rng(0).random(2000) < 0.7)
    result = sim_with(trace, load=8).run(make_policy("fixed:1", sim_with(trace).context()))
    assert result.acceptance == pytest.approx(trace.conditional_rates(1)[0], abs=0.05)


NGRAM_TRACE = """request,draft_start,draft_pos,gen_pos,top1_prob,entropy,margin,ngram_len,accept_prob,accepted
A,1,1,1,,,,2,1,1
A,1,2,2,,,,2,1,1
A,1,3,3,,,,2,0,0
A,4,1,4,,,,3,1,1
A,4,2,5,,,,3,1,1
A,4,3,6,,,,3,1,1
A,8,1,8,,,,4,1,1
A,8,2,9,,,,4,0,0
A,12,1,12,,,,2,0,0
"""


def test_ngram_trace_proposals_and_the_bonus_gap(tmp_path):
    from tabletune.sim.replay import load_ngram_trace

    path = tmp_path / "ngram.csv.gz"
    path.write_bytes(gzip.compress(NGRAM_TRACE.encode()))
    t = load_ngram_trace(path)
    # gen 7 (after the fully accepted draft 4..6, with the next draft at 8) is the bonus gap: bridged, accepted
    assert t.run.tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 1]
    assert t.accepted.tolist() == [1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert t.match_len[6] == 3
    ok, proposed, match = t.window(np.array([0, 9, 11, 12]), 3)
    assert proposed.tolist() == [3, 0, 1, 3]  # row 12 wraps to row 0
    assert ok[0].tolist() == [True, True, False] and match.tolist() == [2, 0, 2, 2]


def test_ngram_replay_sets_the_draft_rate(tmp_path):
    from tabletune.experiments.runner import measure_prior
    from tabletune.policies.base import NGRAM
    from tabletune.sim.replay import load_ngram_trace

    path = tmp_path / "ngram.csv"
    path.write_text(NGRAM_TRACE)
    prof = StepProfile(points=tuple(StepPoint(b, k, (10.0 + b + k,)) for b in (1, 8) for k in range(4)),
                       context_len=0)
    sim = Simulator(StepCost(prof, 1.0), Schedule.constant(Workload("w", (0.5, 0.5, 0.5))),
                    SimConfig(duration_s=5.0, load=4, max_num_seqs=8, seed=0), default_drafter=NGRAM,
                    ngram_replay=load_ngram_trace(path))
    rates, q = measure_prior(sim)
    # positions 10 and 11 never propose; every other step does: 0 < q < 1
    assert 0.3 < q < 0.95
    # a draft at run >= 3 from rows 0..2 accepts 2 of 3: the rates are the trace's, not the workload's 0.5
    assert rates[0] > 0.6


def test_segments_wrap_each_request_within_its_own_rows():
    """Segments of 5 and 3 rows: request ids 0..3 start in segments 0, 1, 0, 1 at their draws 7, 7, 3, 2 mod the
    segment's length (2, 1, 3, 2); a window of 4 from offset 2 of segment 1 reads rows 5 + (2, 3, 4, 5) mod 3 = 7, 5,
    6, 7, and from offset 3 of segment 0 rows 3, 4, 0, 1."""
    from tabletune.sim.replay import SEGMENT_STRIDE, Segments

    seg = Segments(np.array([0, 5]), np.array([5, 3]))
    assert seg.first_positions(np.arange(4), np.array([7, 7, 3, 2])).tolist() == [
        2, SEGMENT_STRIDE + 1, 3, SEGMENT_STRIDE + 2]
    assert seg.rows(np.array([SEGMENT_STRIDE + 2, 3]), 4).tolist() == [[7, 5, 6, 7], [3, 4, 0, 1]]


def test_paired_streams_hold_each_requests_two_chains_row_for_row():
    """``load_paired_traces``: per request, the model chain over its positions (absent rows rejected) and the
    bridged n-gram chain cut or padded to the same length, in the same rows; and there is a pair whose n-gram
    trace is shorter than its model trace, so the cut matters."""
    from tabletune.sim.replay import load_paired_traces
    from tabletune.token_trace import load_token_traces, pair_traces

    root = Path(__file__).resolve().parents[2] / "profiles" / "traces"
    model_path, ngram_path = root / "early-exit_code_T0.csv.gz", root / "ngram_code_T0.csv.gz"
    replay, ngram = load_paired_traces(model_path, ngram_path)
    pairs = pair_traces(load_token_traces(model_path), load_token_traces(ngram_path))
    assert replay.segments is ngram.segments and len(replay.segments.starts) == len(pairs)
    assert any(g is not None and len(g.accepted) < len(m.accepted) for m, g in pairs)
    for (m, g), start, n in zip(pairs, replay.segments.starts, replay.segments.lengths):
        assert n == len(m.accepted)
        rows = slice(start, start + n)
        assert np.array_equal(replay.accepted[rows], m.accepted & m.present)
        chain = g.bridged()
        cut = min(n, len(chain.accepted))
        assert np.array_equal(ngram.accepted[rows][:cut], (chain.accepted & chain.present)[:cut])
        assert not ngram.accepted[rows][cut:].any() and (ngram.run[rows][:cut] <= chain.run[:cut]).all()
