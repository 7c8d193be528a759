"""The host runs ahead of the device: on CUDA, everything from a step's first launch to its read is queued without
a host sync (``torch.cuda.set_sync_debug_mode("error")`` raises at any), and what is queued reads the inputs it was
launched with. Needs a GPU; the CPU has no stream to wait on."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.engine.device_stop import DeviceStop  # noqa: E402
from tabletune.engine.drafters import make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.ops import upload  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.trace_replay import TracedReplayDrafter  # noqa: E402
from tabletune.policies.base import MODEL, NGRAM  # noqa: E402
from tabletune.policies.stop_rule import LogitStopRule  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="a stream to wait on needs a GPU")


def test_upload_keeps_values_and_dtype():
    got = upload([3, 1, 2], torch.device("cpu"))
    assert got.dtype == torch.long and got.tolist() == [3, 1, 2]
    assert upload(np.array([0.5, -1.0]), torch.device("cpu"), torch.float64).tolist() == [0.5, -1.0]


@cuda
def test_a_split_plan_and_a_device_stop_queue_without_a_sync():
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cuda")
    engine = SpecEngine(target, TracedReplayDrafter(), EngineConfig(max_num_seqs=4, max_len=64, k_max=3,
                                                                    split_steps=True))
    engine.set_context(4, 16)
    torch.cuda.synchronize()
    # no trace is loaded, so every drafted top-1 reads 0 (clipped to 1e-6): log p = -13.8 a position, and the
    # thresholds keep a row after position 1 (-13.8 > -20) but stop it after position 2 (-27.6 < -9), below its cap 3
    rule = LogitStopRule(1.0, (0.0, 0.0, 0.0), (-20.0, -9.0, float("inf")))
    torch.cuda.set_sync_debug_mode("error")
    try:
        stop = DeviceStop(engine, [0, 1], np.array([3, 3]), rule)
        for j in range(3):  # the model rows draft up to 3, the rule's numbers behind each position
            engine.draft_position([0, 1], j, 3)
            stop.after_position(j + 1)
        engine.lookup_rows([2, 3])  # the n-gram rows' proposals
        buf = engine.verify_drafted([0, 1, 2, 3], [2, 2, 3, 3], kinds=[MODEL, MODEL, NGRAM, NGRAM])
        copy = engine.copy_drafts([0, 1], 2)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    res = engine.read(buf, 4, engine.k_max)
    assert res.out.shape[0] == 4 and stop.lengths().tolist() == [2, 2]
    assert ("lookup", 2) in engine.graphs  # the lookup replays a graph, no eager launches
    assert copy.get()[0].shape == (2, 2, 3)


@cuda
def test_draft_positions_queued_ahead_each_draft_their_own_rows():
    """Positions 1-3 of rows with caps (3, 3, 3, 3, 3, 2, 2, 1), launched while the device is busy: every position
    runs in the bucket of 8 and uploads its rows only when the device reaches it, after the host wrote the later
    positions' rows. Each row must draft exactly its cap's positions."""
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cuda")
    drafter = make_drafter("eagle", target, 3, draft_cfg=PRESETS["tiny"])
    engine = SpecEngine(target, drafter, EngineConfig(max_num_seqs=8, max_len=64, k_max=3, split_steps=True))
    engine.set_context(8, 16)
    engine.drafts.fill_(-1)
    caps = [3, 3, 3, 3, 3, 2, 2, 1]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # the device busy while the host launches every position
    for j in range(3):
        engine.draft_position([i for i in range(8) if caps[i] > j], j, 3)
    torch.cuda.synchronize()
    drafted = (engine.drafts[:8] != -1).cpu().numpy()
    assert drafted.tolist() == [[j < c for j in range(3)] for c in caps]


@cuda
def test_a_step_launched_ahead_queues_without_a_sync_and_serves_the_same_outputs():
    """A step's results copied behind it, the next step replayed on its inputs before the copy is waited for
    (``copy_out``, ``relaunch``): queued without a host sync, the second step goes on from where the first left
    each row, and a table served with steps launched ahead gives the outputs it gives without."""
    from tabletune.engine.scheduler import Request, Scheduler
    from tabletune.table import DraftTable

    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cuda")

    def engine():
        return SpecEngine(target, make_drafter("ngram", target, 3), EngineConfig(max_num_seqs=2, max_len=64, k_max=3))

    e = engine()
    e.set_context(2, 16)
    e.copy_out(e.launch([0, 1], 2), 2).get()  # the copies' pinned buffers made before the check
    e.reset_rows(2, 16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        buf = e.launch([0, 1], 2)
        first = e.copy_out(buf, 2)
        e.relaunch(buf)
        second = e.copy_out(buf, 2)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    a, b = first.get().accepted, second.get().accepted
    assert e.cached[:2].tolist() == [16 + x + y + 2 for x, y in zip(a, b)]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 97, int(n)).tolist() for n in (5, 9, 14, 7, 11)]
    outputs = []
    for ahead in (False, True):
        reqs = [Request(list(p), n, i) for i, (p, n) in enumerate(zip(prompts, (6, 30, 12, 25, 9)))]
        stats = Scheduler(engine(), DraftTable.fixed(2), launch_ahead=ahead).run(reqs)
        outputs.append([r.output for r in reqs])
        assert any(stats.step_ahead) == ahead
    assert outputs[0] == outputs[1]
