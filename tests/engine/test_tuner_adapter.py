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
