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
from tabletune.tuner.budget import BatchCap, largest_batch


STATIC_SPEEDUP = 0.0  # tests set it: T_static = T_dynamic / (1 + STATIC_SPEEDUP)
STATIC_FAILS = None  # tests set it: an exception the static-mode engine raises on its first step
MEMORY_TOKENS = None  # tests set it: a KV cache of this many tokens holds b sequences of context c while b c <= it
CAP = None  # tests set it: (context_len, max_num_seqs) -> BatchCap, as a real engine's memory check answers


class FakeEngine:
    context_len = 100

    def __init__(self, spec: EngineSpec, static_k: int | None = None) -> None:
        self.max_batch_size = spec.max_batch_size
        self.k_max = spec.k_max
        self.static_k = static_k
        self.steps = 0  # measure_step calls

    def set_context_len(self, context_len: int) -> None:
        self.context_len = context_len

    def batch_cap(self, context_len: int) -> BatchCap:
        n = self.max_batch_size
        if CAP is not None:
            return CAP(context_len, n)
        if MEMORY_TOKENS is None:
            return BatchCap(context_len, n, n)
        return BatchCap(context_len, largest_batch(MEMORY_TOKENS, 0, context_len, n), n,
                        f"{n * context_len} KV tokens, {MEMORY_TOKENS} held")

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(engine="fake", model="m")

    def measure_step(self, batch_size, k, num_steps):
        assert batch_size <= self.batch_cap(self.context_len).batch_size, "a batch that does not fit was measured"
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
    return FakeEngine(spec)


def start_static(spec: EngineSpec, k: int) -> FakeEngine:
    return FakeEngine(spec, static_k=k)
