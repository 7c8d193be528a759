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


def test_memory_plan_counts_the_cache_the_loaded_weights_and_the_draft_model_to_load():
    """Tiny shape on CPU (float32, 4 bytes); the device's free memory is the edge, faked."""
    from tabletune.engine.presets import PRESETS

    spec = EngineSpec(model="tiny", method="draft_model", k_max=2, max_batch_size=2, context_len=16)
    engine = tuner_adapter.BuiltinEngine(spec, free_bytes=tuner_adapter.WORKSPACE_BYTES + (3 << 30))
    plan = engine.memory_plan(16, 2)
    # KV: 2 (K, V) x (2 target layers + 1 draft layer) x 2 KV heads x 16 dims x 4 bytes x 3 slots
    # x (max(16, 256) + 2 + 256) tokens
    assert plan.kv_bytes == 2 * 3 * 2 * 16 * 4 * 3 * 514 == 1_184_256
    # the draft (1 layer of the tiny shape) is still to load: attention 64*16*(4+2*2) + 4*16*64, MLP 3*64*128,
    # untied embeddings 2*97*64 -> 49,280 parameters
    assert plan.weights_bytes == 49_280 * 4
    tiny = PRESETS["tiny"].num_params()
    assert tiny == 2 * (12_288 + 24_576) + 12_416
    assert tiny * 4 <= plan.already_allocated_bytes < tiny * 4 * 1.1  # the target, loaded (plus norms)
    assert plan.free_bytes == tuner_adapter.WORKSPACE_BYTES + (3 << 30)
    assert plan.workspace_bytes == tuner_adapter.WORKSPACE_BYTES
    assert plan.need_bytes == plan.weights_bytes + plan.kv_bytes + plan.workspace_bytes
    # the weights to load come off the free memory before the slots: 3 GiB holds fewer slots with them
    per_slot = plan.kv_bytes // 3
    assert engine.batch_cap(16).batch_size == 2
    tight = tuner_adapter.BuiltinEngine(spec, free_bytes=tuner_adapter.WORKSPACE_BYTES + 3 * per_slot
                                        + plan.weights_bytes - 1)
    assert tight.batch_cap(16).batch_size == 1
    eagle = tuner_adapter.BuiltinEngine(EngineSpec(model="tiny", method="eagle", k_max=2, max_batch_size=2,
                                                   context_len=16, synthetic_acceptance=(1.0, 0.0)))
    assert eagle.memory_plan(16, 2).weights_bytes == 0


def test_builtin_engine_caps_each_context_to_its_free_memory():
    """A fake 'free memory' on the CPU: the tiny shape's KV per slot grows with the context, so the long context
    holds fewer sequences; the timing engine is rebuilt with that many slots and that cache length."""
    spec = EngineSpec(model="tiny", method="ngram", k_max=2, max_batch_size=8, context_len=2048)
    probe = tuner_adapter.BuiltinEngine(spec)
    assert probe.batch_cap(2048).batch_size == 8 and not probe.batch_cap(2048).capped  # CPU: no limit given
    per_slot = probe._sequence_bytes(probe._max_len(2048))
    free = tuner_adapter.WORKSPACE_BYTES + 4 * per_slot  # 3 sequences + the spare slot at context 2048
    engine = tuner_adapter.BuiltinEngine(spec, free_bytes=free)
    assert engine.batch_cap(2048).batch_size == 3 and "8 sequences of" in engine.batch_cap(2048).numbers
    assert engine.batch_cap(64).batch_size == 8  # a short context holds them all
    engine.set_context_len(64)
    assert (engine.engine.cfg.max_num_seqs, engine.engine.cfg.max_len) == (8, engine._max_len(64))
    engine.set_context_len(2048)  # the cache is too short: rebuilt with the slots that fit
    assert (engine.engine.cfg.max_num_seqs, engine.engine.cfg.max_len) == (3, engine._max_len(2048))
    with pytest.raises(ValueError, match="outside 1..3"):
        engine.measure_step(4, 1, 1)
    assert len(engine.measure_step(3, 1, 1).samples_ms) == 1
    engine.close()
    tiny = tuner_adapter.BuiltinEngine(spec, free_bytes=tuner_adapter.WORKSPACE_BYTES)
    assert tiny.batch_cap(2048).batch_size == 0


@pytest.mark.slow
def test_a_tune_over_two_contexts_measures_the_long_one_up_to_what_fits(tmp_path):
    """The H200 long-context run's code path on the CPU: fake free memory that holds 8 sequences at context 64 and
    3 at context 2048; the tune measures each up to its cap and its table reaches max_num_seqs."""
    from tabletune.tuner import TunePlan
    from tabletune.tuner.files import write_runs
    from tabletune.tuner.run import run_contexts

    spec = EngineSpec(model="tiny", method="eagle", k_max=2, max_batch_size=8, context_len=2048,
                      synthetic_acceptance=(0.9, 0.5))
    probe = tuner_adapter.BuiltinEngine(spec)
    free = tuner_adapter.WORKSPACE_BYTES + 4 * probe._sequence_bytes(probe._max_len(2048))
    engine = tuner_adapter.BuiltinEngine(spec, free_bytes=free)
    plan = TunePlan(batch_sizes=(1, 2, 4, 8), ks=(0, 1, 2), point_budget_s=0.05, min_samples=2, refine=False,
                    close_call_windows=0, recheck_passes=0)
    try:
        outcomes = run_contexts(engine, plan, ["def f(x):\n    return x"], [64, 2048])
    finally:
        engine.close()
    assert [o.profile.batch_sizes for o in outcomes] == [[1, 2, 4, 8], [1, 2, 3]]
    assert outcomes[1].batch_cap.capped and "measured up to b=3" in outcomes[1].batch_cap.describe()
    results, _ = write_runs(tmp_path / "run", outcomes, lambda r: {"num_speculative_tokens_per_batch_size": r})
    assert [r.table.ranges[-1][1] for r in results] == [8, 8]


def test_builtin_timing_rows_hold_the_workloads_text():
    """The timed rows' context is the prompts' own tokens (bytes for a random-weight shape), laid out by
    ``timing_rows``, so the n-gram drafter searches the workload's text, not random tokens."""
    from tabletune.tuner.workload import timing_rows

    texts = ("def add(a, b):\n    return a + b\n", "hello world")
    spec = EngineSpec(model="tiny", method="ngram", k_max=2, max_batch_size=2, context_len=24, timing_prompts=texts)
    ids = tuner_adapter.prompt_token_ids(spec, texts)
    assert ids[1] == [b % 97 for b in b"hello world"]  # the tiny shape's 97-token vocabulary
    engine = tuner_adapter.start(spec)
    try:
        got = engine.measure_step(2, 1, 2)
        assert got.scheduled_tokens == (4, 4)
        history = engine.engine.history[:2, :25].tolist()
    finally:
        engine.close()
    assert history == timing_rows(ids, 2, 25)
