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
        assert (fp.engine, fp.drafter, fp.device) == ("builtin", "eagle", "cpu")
        got = engine.measure_step(2, 1, 3)
        assert len(got.samples_ms) == 3 and all(s > 0 for s in got.samples_ms)
        assert got.scheduled_tokens == (4, 4, 4)
        counts = engine.measure_acceptance(["def f(x):\n    return x", "hello hello hello"], 2, 9)
        # rates (1, 0): every draft passes position 1 and is cut at position 2
        assert counts.rates() == [1.0, 0.0]
        assert counts.drafted[0] == counts.num_drafts > 0
    finally:
        engine.close()
