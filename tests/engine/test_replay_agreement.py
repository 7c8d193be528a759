"""The simulator and the engine replay one committed trace alike (tiny target on the CPU, fixed k = 3).

Both read a trace the same way: a draft of k tokens from row g keeps the leading run of accepted rows, the
target emits one more token, and the next draft starts after the emitted tokens. The simulator starts a
request at a random row of its stream; the test finds that row from the simulator's own accepted counts (the
walk below), then replays the same trace on the engine from that row: the per-step accepted counts must be
the same.
"""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.cost import StepCost  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler  # noqa: E402
from tabletune.engine.trace_replay import TokenTrace, TracedReplayDrafter, load_token_traces  # noqa: E402
from tabletune.policies import make_policy  # noqa: E402
from tabletune.policies.base import Decision  # noqa: E402
from tabletune.profile import StepPoint, StepProfile  # noqa: E402
from tabletune.sim import Schedule, SimConfig, Simulator, Workload  # noqa: E402
from tabletune.sim.replay import load_traces  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402

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
