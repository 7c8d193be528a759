"""The builtin engine behind the tuner's Engine protocol (tiny shape, CPU)."""

import pytest

pytest.importorskip("torch")

from tabletune.engine import tuner_adapter  # noqa: E402
from tabletune.errors import InputError  # noqa: E402
from tabletune.tuner import Engine, EngineSpec  # noqa: E402


def test_validate_rejects_unknown_method_and_model():
    with pytest.raises(InputError, match="method"):
        tuner_adapter.validate(EngineSpec(model="tiny", method="medusa", k_max=2, max_batch_size=2))
    with pytest.raises(InputError, match="preset"):
        tuner_adapter.validate(EngineSpec(model="no-such-model", method="eagle", k_max=2, max_batch_size=2))


@pytest.mark.slow
def test_builtin_engine_measures_steps_and_synthetic_acceptance():
    spec = EngineSpec(model="tiny", method="eagle", k_max=2, max_batch_size=2, context_len=16,
                      synthetic_acceptance=(1.0, 0.0))
    engine = tuner_adapter.start(spec)
    try:
        assert isinstance(engine, Engine)
        fp = engine.fingerprint()
        assert (fp.engine, fp.drafter, fp.device) == ("builtin", "eagle", "cpu x1")  # device name and count
        got = engine.measure_step(2, 1, 3)
        assert len(got.samples_ms) == 3 and all(s > 0 for s in got.samples_ms)
        assert got.scheduled_tokens == (4, 4, 4)
        counts = engine.measure_acceptance(["def f(x):\n    return x", "hello hello hello"], 2, 9)
        # rates (1, 0): every draft passes position 1 and is cut at position 2
        assert counts.rates() == [1.0, 0.0]
        assert counts.drafted[0] == counts.num_drafts > 0
    finally:
        engine.close()


def test_validate_rejects_an_unknown_policy():
    with pytest.raises(InputError, match="unknown policy"):
        tuner_adapter.validate(EngineSpec(model="tiny", method="eagle", k_max=2, max_batch_size=2, policy="nope:1"))


@pytest.mark.slow
def test_builtin_engine_measures_acceptance_under_a_per_request_policy():
    """GammaTune picks k_i in {1, 2} per request (k_start 2; rates (1, 0) make a k = 2 draft shrink it, a full
    k = 1 acceptance grow it): position 1 always passes, position 2 never, and some drafts stop at 1."""
    spec = EngineSpec(model="tiny", method="eagle", k_max=2, max_batch_size=2, context_len=16,
                      synthetic_acceptance=(1.0, 0.0), policy="gammatune")
    engine = tuner_adapter.start(spec)
    try:
        counts = engine.measure_acceptance(["def f(x):\n    return x", "hello hello hello"], 2, 20)
        assert counts.rates() == [1.0, 0.0]
        assert counts.drafted[0] == counts.num_drafts > counts.drafted[1] > 0
    finally:
        engine.close()


def test_memory_plan_counts_the_cache_the_loaded_weights_and_the_draft_model_to_load(monkeypatch):
    """Tiny shape on CPU (float32, 4 bytes); the device's free memory is the edge, faked."""
    import torch

    from tabletune.engine.presets import PRESETS

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 << 30, 8 << 30))
    spec = EngineSpec(model="tiny", method="draft_model", k_max=2, max_batch_size=2, context_len=16)
    plan = tuner_adapter.BuiltinEngine(spec).memory_plan()
    # KV: 2 (K, V) x 2 layers x 2 KV heads x 16 dims x 4 bytes x 3 slots x (max(16, 256) + 2 + 256) tokens
    assert plan.kv_bytes == 2 * 2 * 2 * 16 * 4 * 3 * 514 == 789_504
    # the draft (1 layer of the tiny shape) is still to load: attention 64*16*(4+2*2) + 4*16*64, MLP 3*64*128,
    # untied embeddings 2*97*64 -> 49,280 parameters
    assert plan.weights_bytes == 49_280 * 4
    tiny = PRESETS["tiny"].num_params()
    assert tiny == 2 * (12_288 + 24_576) + 12_416
    assert tiny * 4 <= plan.already_allocated_bytes < tiny * 4 * 1.1  # the target, loaded (plus norms)
    assert plan.free_bytes == 3 << 30 and plan.workspace_bytes == tuner_adapter.WORKSPACE_BYTES
    assert plan.need_bytes == plan.weights_bytes + plan.kv_bytes + plan.workspace_bytes
    eagle = tuner_adapter.BuiltinEngine(EngineSpec(model="tiny", method="eagle", k_max=2, max_batch_size=2,
                                                   context_len=16, synthetic_acceptance=(1.0, 0.0)))
    assert eagle.memory_plan().weights_bytes == 0
