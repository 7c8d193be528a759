"""A tuner adapter module over an in-test engine, for ``tabletune tune`` end to end without vLLM.

T(b, k) = 10 + 0.5 b (k + 1) ms; acceptance: 100 drafts of k=3 accepting 0/1/2/3 tokens
10/18/22/50 times (conditional rates 0.9, 0.8, 50/72).
"""

from __future__ import annotations

from tabletune.acceptance import AcceptanceCounts
from tabletune.errors import InputError
from tabletune.profile import Fingerprint
from tabletune.tuner import EngineSpec, StepSamples


class FakeEngine:
    context_len = 100

    def __init__(self, spec: EngineSpec) -> None:
        self.max_batch_size = spec.max_batch_size
        self.k_max = spec.k_max

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(engine="fake", model="m")

    def measure_step(self, batch_size, k, num_steps):
        return StepSamples((10.0 + 0.5 * batch_size * (k + 1),) * num_steps)

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
    return FakeEngine(spec)
