"""A deterministic in-test ``Engine`` for the tuner's tests (the real ones: tests/integrations, tests/engine)."""

from __future__ import annotations

from collections.abc import Sequence

from tabletune.acceptance import AcceptanceCounts
from tabletune.profile import Fingerprint, StepPoint, StepProfile
from tabletune.tuner import StepSamples

RATES = (0.9, 0.8, 0.7)


def step_ms(b: int, k: int) -> float:
    """Overhead-bound at small b, compute-bound at large b: T = 10 + 0.5 * b * (k + 1)."""
    return 10.0 + 0.5 * b * (k + 1)


class FakeEngine:
    """Deterministic step times; every ``slow_every``-th sample is 5x (interference)."""

    max_batch_size = 64
    k_max = 3
    context_len = 100

    def __init__(self, slow_every: int = 0) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.slow_every = slow_every
        self.n = 0

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(engine="fake", model="m")

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples:
        self.calls.append((batch_size, k, num_steps))
        out = []
        for _ in range(num_steps):
            self.n += 1
            slow = self.slow_every and self.n % self.slow_every == 0
            out.append(step_ms(batch_size, k) * (5 if slow else 1))
        return StepSamples(tuple(out), tuple([batch_size * (k + 1)] * num_steps))

    def measure_acceptance(self, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceCounts:
        counts = AcceptanceCounts(k_max=k)
        # 100 drafts of k=3 accepting 0/1/2/3 tokens: reached 100, 90, 72; accepted 90, 72, 50
        for m, n in ((0, 10), (1, 18), (2, 22), (3, 50)):
            for _ in range(n):
                counts.observe_draft(k, m)
        return counts

    def close(self) -> None:
        pass


def profile_from(fn, bs=(1, 2, 4, 8, 16, 32, 64), ks=(0, 1, 2, 3)) -> StepProfile:
    return StepProfile(tuple(StepPoint(b, k, (fn(b, k),)) for b in bs for k in ks), context_len=100)
