"""A tune over several contexts holds one engine's caches at a time, and sizes each context's engine from the memory
free when it is built (tiny shape on the CPU; the GPU's memory is the edge, faked)."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from tabletune.engine import tuner_adapter  # noqa: E402
from tabletune.engine.kv_cache import KVCache  # noqa: E402
from tabletune.tuner import EngineSpec, TunePlan  # noqa: E402
from tabletune.tuner.run import batch_caps, run_contexts  # noqa: E402


class FakeGpu:
    """``room`` bytes for KV caches once WORKSPACE_BYTES (what a real engine's activations and graphs take) is set
    aside. A cache that does not fit raises torch's OOM; a cache gives its bytes back only when the object dies,
    which for an engine (it and its drafter point at each other) takes a collection; ``taken``: another tenant."""

    def __init__(self, room: int) -> None:
        self.room, self.taken = room, 0
        self.live: dict[int, int] = {}  # id(cache) -> bytes

    def held(self) -> int:
        return self.taken + sum(self.live.values())

    def free_bytes(self) -> int:
        return tuner_adapter.WORKSPACE_BYTES + self.room - self.held()

    def release(self) -> None:
        gc.collect()

    def allocate(self, cache: KVCache) -> None:
        nbytes = cache.k.nbytes + cache.v.nbytes
        if self.held() + nbytes > self.room:
            raise torch.OutOfMemoryError(f"Tried to allocate {nbytes} bytes; {self.room - self.held()} free")
        self.live[id(cache)] = nbytes
        weakref.finalize(cache, self.live.pop, id(cache))


@pytest.fixture
def no_automatic_collection():
    """Only the collections the code asks for: the automatic one comes when it comes (on the H100 it had not come
    when the next context's engine was built)."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_each_context_is_built_alone_from_the_memory_free_then(monkeypatch, no_automatic_collection):
    spec = EngineSpec(model="tiny", method="eagle", k_max=1, max_batch_size=8, context_len=2048,
                      synthetic_acceptance=(0.9,))
    # KV of one slot, float32: 2 (K, V) x (2 target layers + the head's 1) x 2 KV heads x 16 dims x 4 bytes x
    # (max(context, 256) + k_max + 256) tokens
    per_slot = {64: 768 * 513, 2048: 768 * 2305}
    gpu = FakeGpu(room=4 * per_slot[2048] + 1000)  # context 64: 8 sequences + the spare slot; 2048: 3 + 1
    allocate = KVCache.__init__

    def allocating(cache, *args, **kwargs):
        allocate(cache, *args, **kwargs)
        gpu.allocate(cache)

    monkeypatch.setattr(KVCache, "__init__", allocating)
    engine = tuner_adapter.BuiltinEngine(spec, memory=gpu)
    assert engine._sequence_bytes(engine._max_len(2048)) == per_slot[2048]
    assert [c.batch_size for c in batch_caps(engine, [64, 2048])] == [8, 3]  # at the start, all of it free
    gpu.taken = per_slot[2048]  # then another tenant takes one long slot's worth
    plan = TunePlan(batch_sizes=(1, 8), ks=(0, 1), steps_per_call=1, min_samples=1, point_budget_s=0.01,
                    refine=False, acceptance_max_tokens=4, recheck_passes=0, close_call_windows=0)
    try:
        outcomes = run_contexts(engine, plan, ["def f(x):\n    return x"], [64, 2048])
        # the long context's engine is all that is left, 3 slots: the head's 1 layer and the target's 2 (the short
        # context's caches went before it was built, or it would not have fitted)
        assert sorted(gpu.live.values()) == [per_slot[2048], 2 * per_slot[2048]]
    finally:
        engine.close()
    assert gpu.live == {}
    # sized from what was free at build time: 3 long slots (2 sequences + the spare), not the 4 of the start
    free = tuner_adapter.WORKSPACE_BYTES + gpu.room - gpu.taken
    assert [(o.batch_cap.batch_size, o.batch_cap.free_bytes) for o in outcomes] == [(8, free), (2, free)]
    assert [o.profile.batch_sizes for o in outcomes] == [[1, 8], [1, 2]]
