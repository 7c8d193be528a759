"""Workloads: what requests look like (lengths, acceptance, copyable spans), and switches in time.

A :class:`Workload` gives the population acceptance of the model drafter as
conditional rates a_1..a_K (the same convention as ``tabletune.acceptance``), how much
requests differ from each other (``heterogeneity``), prompt and output lengths, and
the n-gram structure (copyable spans). A :class:`Schedule` switches workloads at
given times, e.g. code -> math at 180 s.

The preset rates are stated assumptions for an EAGLE-3-like drafter at temperature 0
(code accepts best, chat worst), in the range reported for EAGLE-3 on 8B models; they
are replaced by measured profiles under ``profiles/acceptance/`` when those exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.errors import InputError


@dataclass(frozen=True)
class Workload:
    name: str
    rates: tuple[float, ...]  # population conditional acceptance a_j of the model drafter
    heterogeneity: float = 0.6  # sd of each request's logit shift of its rates (0: all alike)
    prompt_len_mean: float = 512.0  # prompt tokens, geometric around this mean
    output_len_mean: float = 256.0  # output tokens, geometric around this mean
    output_len: int | None = None  # fixed output length for every request (overrides the mean)
    span_start_prob: float = 0.005  # per emitted token: chance a copyable span starts
    span_mean_len: float = 8.0  # mean copyable span length, tokens (geometric)
    spurious_match_prob: float = 0.1  # per step outside spans: chance of a spurious n-gram match
    # noise on the confidence signal (logit units): 2.0 gives a top-1 AUC of ~0.84; the measured
    # early-exit traces at T=0 (profiles/traces) give 0.82-0.87
    signal_noise: float = 2.0

    def __post_init__(self) -> None:
        src = f"workload {self.name}"
        if not self.rates:
            raise InputError(src, "rates", list(self.rates), "no rates given")
        for i, r in enumerate(self.rates):
            if not 0.0 < r <= 1.0:
                raise InputError(src, f"rates[{i}]", r, "acceptance rates must lie in (0, 1]")
        if self.heterogeneity < 0:
            raise InputError(src, "heterogeneity", self.heterogeneity, "must be >= 0")
        if self.prompt_len_mean < 0:
            raise InputError(src, "prompt_len_mean", self.prompt_len_mean, "must be >= 0")
        if self.output_len_mean < 1:
            raise InputError(src, "output_len_mean", self.output_len_mean, "must be >= 1")
        if self.output_len is not None and self.output_len < 1:
            raise InputError(src, "output_len", self.output_len, "must be >= 1")
        for name in ("span_start_prob", "spurious_match_prob"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise InputError(src, name, v, "must lie in [0, 1]")
        if self.span_mean_len < 1:
            raise InputError(src, "span_mean_len", self.span_mean_len, "must be >= 1")
        if self.signal_noise < 0:
            raise InputError(src, "signal_noise", self.signal_noise, "must be >= 0")

    def with_rates(self, rates: Sequence[float]) -> Workload:
        return dataclasses.replace(self, rates=tuple(float(r) for r in rates))


#: Presets (EAGLE-3-like drafter, temperature 0). code-edit has long copyable spans.
PRESETS: dict[str, Workload] = {
    "code": Workload("code", (0.90, 0.88, 0.86, 0.84, 0.82, 0.80, 0.78, 0.76)),
    "math": Workload("math", (0.74, 0.66, 0.60, 0.55, 0.50, 0.46, 0.42, 0.39)),
    "chat": Workload("chat", (0.70, 0.62, 0.56, 0.51, 0.47, 0.43, 0.40, 0.37)),
    "code-edit": Workload(
        "code-edit", (0.80, 0.76, 0.72, 0.68, 0.64, 0.60, 0.56, 0.52),
        prompt_len_mean=1024.0, span_start_prob=0.04, span_mean_len=40.0,
    ),
}


def preset(name: str) -> Workload:
    if name not in PRESETS:
        raise InputError("--workload", "workload", name, f"unknown; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class Schedule:
    """Workloads over time: ``phases[i] = (start_s, workload)``, the first starting at 0.

    A request takes the workload in force when it arrives and keeps it; requests that
    arrive after a switch use the new one.
    """

    phases: tuple[tuple[float, Workload], ...]

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0][0] != 0.0:
            raise ValueError("a schedule's first phase must start at 0")
        starts = [s for s, _ in self.phases]
        if starts != sorted(starts):
            raise ValueError(f"phase start times must increase, got {starts}")

    @classmethod
    def constant(cls, workload: Workload) -> Schedule:
        return cls(((0.0, workload),))

    @classmethod
    def switch(cls, first: Workload, second: Workload, at_s: float) -> Schedule:
        return cls(((0.0, first), (float(at_s), second)))

    def index_at(self, time_s: float) -> int:
        idx = 0
        for i, (start, _) in enumerate(self.phases):
            if time_s >= start:
                idx = i
        return idx

    @property
    def workloads(self) -> list[Workload]:
        return [w for _, w in self.phases]

    @property
    def k_max(self) -> int:
        return min(len(w.rates) for w in self.workloads)
