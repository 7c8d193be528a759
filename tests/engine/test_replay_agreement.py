"""The simulator and the engine replay one committed trace alike (tiny target on the CPU, fixed k = 3).

Both read a trace the same way: a draft of k tokens from row g keeps the leading run of accepted rows, the
target emits one more token, and the next draft starts after the emitted tokens. The simulator starts a
request at a random row of its stream; the test finds that row from the simulator's own accepted counts (the
walk below), then replays the same trace on the engine from that row: the per-step accepted counts must be
the same.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.cost import StepCost  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler  # noqa: E402
from tabletune.engine.trace_replay import TracedReplayDrafter  # noqa: E402
from tabletune.policies import make_policy  # noqa: E402
from tabletune.policies.base import Decision  # noqa: E402
from tabletune.profile import StepPoint, StepProfile  # noqa: E402
from tabletune.sim import Schedule, SimConfig, Simulator, Workload  # noqa: E402
from tabletune.sim.replay import load_traces  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402
from tabletune.token_trace import TokenTrace, load_token_traces  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "profiles" / "traces" / "early-exit_code_T0.csv.gz"
K, STEPS = 3, 12


def walk(accepted: np.ndarray, start: int, steps: int) -> list[int]:
    """Accepted counts of ``steps`` drafts of K from row ``start`` of a cyclic stream."""
    n, pos, out = len(accepted), start, []
    for _ in range(steps):
        run = int(np.cumprod(accepted[(pos + np.arange(K)) % n]).sum())
        out.append(run)
        pos += run + 1
    return out


def simulated(streams) -> list[int]:
    pts = tuple(StepPoint(b, k, (10.0 + k,)) for b in (1, 8) for k in range(K + 1))
    sim = Simulator(StepCost(StepProfile(points=pts, context_len=0)),
                    Schedule.constant(Workload("w", (0.5,) * K, output_len=10 ** 6, prompt_len_mean=0)),
                    SimConfig(duration_s=0.3, load=1, seed=3), replay=streams)
    steps = sim.run(make_policy(f"fixed:{K}", sim.context())).steps
    assert (steps.batch_size == 1).all() and len(steps.accepted) >= STEPS
    return [int(a) for a in steps.accepted[:STEPS]]


class FixedK:
    name, uses_features = "fixed-k", False

    def __init__(self):
        self.accepted: list[int] = []

    def decide(self, state):
        return Decision.batch(K)

    def observe(self, outcome):
        self.accepted.append(int(outcome.accepted[0]))


def on_the_engine(trace: TokenTrace) -> list[int]:
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    prompt, max_new = [5, 17, 29, 3], STEPS * (K + 1) + 1

    def engine(drafter):
        return SpecEngine(target, drafter, EngineConfig(max_num_seqs=1, max_len=96, k_max=K))

    base = Request(list(prompt), max_new, 0)
    Scheduler(engine(TracedReplayDrafter()), DraftTable.fixed(0)).run([base])
    req = Request(list(prompt), max_new, 0, oracle=base.output + [0] * 8, trace=(trace, None))
    policy = FixedK()
    Scheduler(engine(TracedReplayDrafter()), policy).run([req])
    assert req.output == base.output  # lossless whatever the trace says
    return policy.accepted[:STEPS]


@pytest.fixture
def one_thread():
    """The tiny model is latency-bound: one intra-op thread is ~20x faster than two on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_simulator_and_engine_replay_one_committed_trace_alike(one_thread):
    streams = load_traces([TRACE]).subset(np.array([0]))  # the first request (sorted by name)
    name = sorted(t.request for t in load_token_traces(TRACE))[0]
    (trace,) = [t for t in load_token_traces(TRACE) if t.request == name]
    assert trace.present.all() and np.array_equal(trace.accepted, streams.accepted)
    sim = simulated(streams)
    assert sum(sim) > 0 and min(sim) < K  # the stretch tells acceptance from rejection
    starts = [p for p in range(streams.num_rows) if walk(streams.accepted, p, STEPS) == sim]
    assert starts, "the simulator's accepted counts follow no walk of the trace"
    p = starts[0]
    rolled = TokenTrace(trace.request, np.roll(trace.signals, -p, axis=0), np.roll(trace.accepted, -p),
                        np.roll(trace.present, -p), np.roll(trace.match_len, -p))
    assert on_the_engine(rolled) == sim


NGRAM_TRACE = Path(__file__).resolve().parents[2] / "profiles" / "traces" / "ngram_code-edit_T0.csv.gz"


def test_engine_and_simulator_read_an_ngram_trace_alike():
    """Every request of a committed n-gram trace: the engine's chain (``TokenTrace.bridged``: accepted, proposals,
    match length by output position) is the simulator's stream (``NgramStreams``) for that request, bonus
    positions after fully accepted recorded drafts included; and there are such positions to bridge."""
    from tabletune.sim.replay import load_ngram_trace
    traces = load_token_traces(NGRAM_TRACE)
    streams = load_ngram_trace(NGRAM_TRACE)
    bridged = [t.bridged() for t in traces]
    assert sum(int((b.present & ~t.present).sum()) for b, t in zip(bridged, traces)) > 0
    assert np.array_equal(np.concatenate([b.accepted for b in bridged]), streams.accepted)
    assert np.array_equal(np.concatenate([b.run for b in bridged]), streams.run)
    assert np.array_equal(np.concatenate([b.match_len for b in bridged]), streams.match_len)


def test_the_bonus_position_is_bridged_by_hand():
    """Rows at 1..3 accepted (a draft of 3), none at 4 (the bonus), a draft at 5..6 (accepted, rejected), none at 7,
    8 rejected: position 4 becomes an accepted proposal with 3's match length; 7 stays a gap (6 was rejected)."""
    present = np.array([1, 1, 1, 0, 1, 1, 0, 1], bool)
    accepted = np.array([1, 1, 1, 0, 1, 0, 0, 0], bool)
    match = np.array([2, 2, 2, 0, 4, 4, 0, 3], np.int64)
    t = TokenTrace("r", np.zeros((8, 3), np.float32), accepted, present, match).bridged()
    assert t.present.tolist() == [1, 1, 1, 1, 1, 1, 0, 1]
    assert t.accepted.tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert t.match_len.tolist() == [2, 2, 2, 2, 4, 4, 0, 3]
    assert t.run.tolist() == [6, 5, 4, 3, 2, 1, 0, 1]


def test_the_engine_drafter_loads_the_bridged_chain():
    """``TracedReplayDrafter.load`` writes the n-gram chain as bridged: output position g at sequence position
    prompt_len + g, accepted flags and proposals (run) those of the hand-worked trace above."""
    present = np.array([1, 1, 1, 0, 1, 1, 0, 1], bool)
    accepted = np.array([1, 1, 1, 0, 1, 0, 0, 0], bool)
    ngram = TokenTrace("r", np.zeros((8, 3), np.float32), accepted, present, np.array([2, 2, 2, 0, 4, 4, 0, 3]))
    model = TokenTrace("r", np.zeros((8, 3), np.float32), np.ones(8, bool), np.ones(8, bool), np.zeros(8, np.int64))
    torch.manual_seed(0)
    engine = SpecEngine(Decoder(PRESETS["tiny"], torch.float32, "cpu"), TracedReplayDrafter(),
                        EngineConfig(max_num_seqs=1, max_len=32, k_max=K))
    engine.drafter.load(0, 4, model, ngram)
    assert engine.drafter.ok[0, 5:13, 1].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert engine.drafter.ngram[0, 5:13, 1].tolist() == [6, 5, 4, 3, 2, 1, 0, 1]


MODEL_TRACE_CE = Path(__file__).resolve().parents[2] / "profiles" / "traces" / "early-exit_code-edit_T0.csv.gz"


def test_paired_streams_give_the_simulator_the_engines_steps_under_a_two_chain_plan(one_thread, monkeypatch):
    """Code-edit's model and n-gram traces, paired by request (``load_paired_traces``): at load 1 request 0
    replays pair 0 in both, from the row the simulator drew (``Request.trace_offset`` on the engine), so under
    ``hybrid-static`` (the n-gram chain where the lookup matched) every step's chain, k and accepted count are the
    engine's, wrap-around included (more steps than the trace has rows); the engine stays lossless."""
    from tabletune.engine.scheduler import policy_context
    from tabletune.sim.replay import SEGMENT_STRIDE, TraceStreams, load_paired_traces
    from tabletune.token_trace import pair_traces

    starts, first_positions = [], TraceStreams.first_positions
    monkeypatch.setattr(TraceStreams, "first_positions",
                        lambda self, ids, rng: starts.append(first_positions(self, ids, rng)) or starts[-1])
    replay, ngram = load_paired_traces(MODEL_TRACE_CE, NGRAM_TRACE)
    pair = pair_traces(load_token_traces(MODEL_TRACE_CE), load_token_traces(NGRAM_TRACE))[0]
    steps = 60
    ngram_rates = (0.0, 0.3, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7)
    pts = tuple(StepPoint(b, k, (10.0 + k,)) for b in (1, 8) for k in range(8))
    cost = StepCost(StepProfile(points=pts, context_len=0))
    sim = Simulator(cost, Schedule.constant(Workload("w", (0.5,) * 7, output_len=10 ** 6, prompt_len_mean=0)),
                    SimConfig(duration_s=steps * 0.03, load=1, seed=3), replay=replay, ngram_replay=ngram)
    seen_sim = []
    policy = make_policy("hybrid-static:m=4", dataclasses.replace(sim.context(prior_rates=(0.5,) * 7),
                                                                 ngram_rates=ngram_rates))
    observe = policy.observe
    policy.observe = lambda o: (seen_sim.append(o), observe(o))
    sim.run(policy)

    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    prompt, max_new = [5, 17, 29, 3], 600  # more than the steps emit: no step is cut at the request's end
    cfg = EngineConfig(max_num_seqs=1, max_len=max_new + 24, k_max=7, split_steps=True)
    base = Request(list(prompt), max_new, 0)
    Scheduler(SpecEngine(target, TracedReplayDrafter(), cfg), DraftTable.fixed(0)).run([base])
    engine = SpecEngine(target, TracedReplayDrafter(), cfg)
    offset = int(starts[0][0] % SEGMENT_STRIDE)
    assert starts[0][0] // SEGMENT_STRIDE == 0 and offset > 0  # pair 0, not from its first row
    req = Request(list(prompt), max_new, 0, oracle=base.output + [0] * 8, trace=pair, trace_offset=offset)
    seen = []
    policy = make_policy("hybrid-static:m=4", policy_context(engine, cost, (0.5,) * 7, ngram_rates))
    observe_e = policy.observe
    policy.observe = lambda o: (seen.append(o), observe_e(o))
    Scheduler(engine, policy).run([req], stop=lambda stats: stats.num_steps >= steps)
    assert req.output == base.output[: len(req.output)]
    n = min(len(seen), len(seen_sim), steps)  # the engine's last steps may be cut at the request's end
    assert n >= steps - 1 and sum(int(o.accepted[0]) + 1 for o in seen[:n]) > 2 * len(pair[0].accepted)
    chains = [(int(o.drafter[0]), int(o.ks[0]), int(o.accepted[0])) for o in seen[:n]]
    assert {c for c, _, _ in chains} == {0, 1}  # both chains ran
    assert chains == [(int(o.drafter[0]), int(o.ks[0]), int(o.accepted[0])) for o in seen_sim[:n]]
