"""A tuner adapter module over an in-test engine, for ``tabletune tune`` end to end without vLLM.

T(b, k) = 10 + 0.5 b (k + 1) c / 100 ms at context c (100 unless ``set_context_len``); the engine
``start_static`` returns times every step ``STATIC_SPEEDUP`` faster (the table mechanism's cost); acceptance: 100 drafts of k=3 accepting 0/1/2/3 tokens
10/18/22/50 times (conditional rates 0.9, 0.8, 50/72).
"""

from __future__ import annotations

from tabletune.acceptance import AcceptanceCounts
from tabletune.errors import InputError
from tabletune.profile import Fingerprint
from tabletune.tuner import EngineSpec, StepSamples


STATIC_SPEEDUP = 0.0  # tests set it: T_static = T_dynamic / (1 + STATIC_SPEEDUP)
REFUSE_AT_START = None  # tests set it: a check start() runs, as a real engine checks its memory budget
STATIC_FAILS = None  # tests set it: an exception the static-mode engine raises on its first step


class FakeEngine:
    context_len = 100

    def __init__(self, spec: EngineSpec, static_k: int | None = None) -> None:
        self.max_batch_size = spec.max_batch_size
        self.k_max = spec.k_max
        self.static_k = static_k
        self.steps = 0  # measure_step calls

    def set_context_len(self, context_len: int) -> None:
        self.context_len = context_len

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(engine="fake", model="m")

    def measure_step(self, batch_size, k, num_steps):
        self.steps += 1
        ms = 10.0 + 0.5 * batch_size * (k + 1) * self.context_len / 100
        if self.static_k is not None:
            if STATIC_FAILS is not None:
                raise STATIC_FAILS
            assert k == self.static_k
            ms /= 1 + STATIC_SPEEDUP
        return StepSamples((ms,) * num_steps)

    def measure_acceptance(self, prompts, k, max_tokens):
        counts = AcceptanceCounts(k_max=k)
        for m, n in ((0, 10), (1, 18), (2, 22), (3, 50)):
            for _ in range(n):
                counts.observe_draft(k, m)
        return counts

    def close(self) -> None:
        pass


def validate(spec: EngineSpec) -> None:
    if spec.model != "fake":
        raise InputError("--model", "model", spec.model, "the fake adapter runs model 'fake' only")


def start(spec: EngineSpec) -> FakeEngine:
    validate(spec)
    if REFUSE_AT_START is not None:
        REFUSE_AT_START(spec)
    return FakeEngine(spec)


def start_static(spec: EngineSpec, k: int) -> FakeEngine:
    return FakeEngine(spec, static_k=k)
