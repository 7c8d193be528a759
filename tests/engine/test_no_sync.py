"""A step's launches never wait on the device: on CUDA, everything from the first launch to the step's read is
queued without a host sync (``torch.cuda.set_sync_debug_mode("error")`` raises at any), so the host runs ahead of
the device. Needs a GPU; the CPU has no stream to wait on."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.engine.device_stop import DeviceStop  # noqa: E402
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
    rule = LogitStopRule(1.0, (0.0, 0.0, 0.0), (-9.0, -9.0, float("inf")))
    torch.cuda.set_sync_debug_mode("error")
    try:
        stop = DeviceStop(engine, [0, 1], np.array([2, 2]), rule)
        for j in range(2):  # the model rows draft 2, the rule's numbers behind them
            engine.draft_position([0, 1], j, 2)
            stop.after_position(j + 1)
        engine.lookup_rows([2, 3], 3)  # the n-gram rows' proposals
        buf = engine.verify_drafted([0, 1, 2, 3], [2, 2, 3, 3], kinds=[MODEL, MODEL, NGRAM, NGRAM])
        copy = engine.copy_drafts([0, 1], 2)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    res = engine.read(buf, 4, engine.k_max)
    assert res.out.shape[0] == 4 and stop.lengths().tolist() == [2, 2]
    assert copy.get()[0].shape == (2, 2, 3)
