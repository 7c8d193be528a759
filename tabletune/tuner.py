"""The tuner: a measurement plan over any ``Engine``, and the files it writes.

An engine adapter (vLLM: ``tabletune.integrations.vllm.tuner_engine``; the
reference engine: ``tabletune.engine.tuner_adapter``) implements ``Engine``:
four methods, no knowledge of the plan. The tuner decides what to measure:

* batch sizes: a geometric grid 1, 2, 4, ..., max_batch_size (the largest is
  always included), every k in 0..k_max;
* per (b, k): calls of ``num_steps`` timed steps, round-robin over k so slow
  drift (other load, growing context) spreads over every k alike, until the
  spread (IQR / median) is at most ``target_spread`` or the point has used its
  time budget;
* optional refinement: where the chosen k differs between neighbouring
  measured batch sizes, the midpoint is measured too (every k);
* close calls (``tabletune.close_calls``): where another k's modelled goodput is
  within ``close_call_margin`` of the best at a measured b, those k are measured
  in ``close_call_windows`` more windows and the pooled samples decide.

Interference filter: on a shared machine other processes stretch some steps by
several times. As ``timeit`` argues for its minimum, the fast samples are the
engine's own cost and the slow ones are interference, so a point keeps only
samples <= (1 + ``interference_tolerance``) * its 10th percentile (the profile
stores the kept samples; the median and spread are over them).

The table then maximises goodput(b, k) = b * E[tokens | k] / T(b, k), with
E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j from the measured acceptance
(see ``tabletune.optimizer``). This module imports neither torch nor vllm.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tabletune.acceptance import AcceptanceCounts
from tabletune.close_calls import CloseCall, close_calls, pool, refinement_batch_sizes, settle
from tabletune.errors import InputError
from tabletune.profile import Fingerprint, StepPoint, StepProfile


@dataclass(frozen=True)
class StepSamples:
    """What one ``Engine.measure_step`` call timed.

    ``samples_ms[i]`` is the wall time of one steady-state decode step (no
    prefill in it) with exactly ``batch_size`` requests, each verifying a draft
    of the requested k; ``scheduled_tokens[i]`` is the number of tokens that
    step actually scheduled (b * (k + 1) when every request drafted k tokens).
    """

    samples_ms: tuple[float, ...]
    scheduled_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.scheduled_tokens and len(self.scheduled_tokens) != len(self.samples_ms):
            raise ValueError("scheduled_tokens must have one entry per sample")


@runtime_checkable
class Engine(Protocol):
    """A speculative-decoding engine the tuner can measure. Engine-agnostic.

    The engine is started once (with every k up to ``k_max`` usable) and
    measured many times; the tuner never restarts it.

    * ``fingerprint()``: where the numbers come from (engine, version, device,
      model, dtype, runner, drafter); stored in the StepProfile.
    * ``measure_step(batch_size, k, num_steps)``: keep exactly ``batch_size``
      requests decoding with draft length ``k`` (forced, whatever table the
      engine was started with), let the first steps after a change of k or of
      the batch go untimed, and return ``num_steps`` timed steady-state decode
      steps. Steps containing a prefill are never timed.
    * ``measure_acceptance(prompts, k, max_tokens)``: decode every prompt (text)
      for up to ``max_tokens`` tokens drafting ``k`` tokens per step, and return
      the censored per-position counts (see ``tabletune.acceptance``).
    * ``close()``: free the engine.

    Attributes: ``max_batch_size`` (largest b it can hold, e.g. vLLM's
    max_num_seqs), ``k_max`` (largest k it can draft), ``context_len`` (the
    typical context length of timed steps, in tokens).
    """

    max_batch_size: int
    k_max: int
    context_len: int

    def fingerprint(self) -> Fingerprint: ...

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples: ...

    def measure_acceptance(self, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceCounts: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    """What to start: the CLI's options, checked before any engine starts.

    Adapter modules expose ``validate(spec)`` (raise InputError, cheap, no
    engine) and ``start(spec) -> Engine``.
    """

    model: str
    method: str
    k_max: int
    max_batch_size: int
    draft_model: str | None = None
    synthetic_acceptance: tuple[float, ...] | None = None  # conditional rates, a controlled run
    context_len: int = 128
    seed: int = 0


@dataclass(frozen=True)
class TunePlan:
    """How long to measure. Defaults finish the tiny demo grid in minutes."""

    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    steps_per_call: int = 4  # short calls: a point's samples spread over the whole batch size's time
    min_samples: int = 12
    target_spread: float = 0.05  # IQR / median at which a point is done
    point_budget_s: float = 4.0  # wall time one (b, k) point may use
    refine: bool = True
    acceptance_max_tokens: int = 128
    interference_tolerance: float | None = 0.3  # None: keep every sample
    recheck_passes: int = 2  # re-measure points slower than a point doing more work
    recheck_tolerance: float = 0.15
    close_call_margin: float = 0.05  # re-measure k within this goodput share of the best (0: off)
    close_call_windows: int = 2
    model_draft_rate: bool = False  # optimise with the measured draft rate q (opt-in; see tabletune.goodput)

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if not self.ks or min(self.ks) < 0:
            raise ValueError(f"k must be >= 0, got {self.ks}")
        if self.steps_per_call < 1 or self.min_samples < 1:
            raise ValueError("steps_per_call and min_samples must be >= 1")
        if self.point_budget_s <= 0 or self.target_spread <= 0:
            raise ValueError("point_budget_s and target_spread must be > 0")
        if self.close_call_margin < 0 or self.close_call_windows < 0:
            raise ValueError("close_call_margin and close_call_windows must be >= 0")


def geometric_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_batch_size, which is always included."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    out = [1]
    while out[-1] * 2 < max_batch_size:
        out.append(out[-1] * 2)
    if out[-1] != max_batch_size:
        out.append(max_batch_size)
    return tuple(out)


def check_grid(batch_sizes: Sequence[int], k_max: int, max_batch_size: int, source: str = "--batch-sizes") -> None:
    """Bad grids fail before any engine starts."""
    if k_max < 1:
        raise InputError("--k-max", "k_max", k_max, "must be >= 1")
    if not batch_sizes:
        raise InputError(source, "batch_sizes", list(batch_sizes), "no batch size given")
    for b in batch_sizes:
        if b < 1:
            raise InputError(source, "batch_size", b, "must be >= 1")
        if b > max_batch_size:
            raise InputError(source, "batch_size", b, f"exceeds max_num_seqs={max_batch_size}")


ProgressFn = Callable[[str, float], None]  # (description, fraction of the plan done 0..1)


def interference_filter(samples_ms: Sequence[float], tolerance: float | None) -> list[int]:
    """Indices of samples <= (1 + tolerance) * the 10th percentile (the minimum below 10 samples)."""
    if tolerance is None or not samples_ms:
        return list(range(len(samples_ms)))
    floor = statistics.quantiles(samples_ms, n=10)[0] if len(samples_ms) >= 10 else min(samples_ms)
    return [i for i, s in enumerate(samples_ms) if s <= floor * (1 + tolerance)]


@dataclass
class _Point:
    samples_ms: list[float] = field(default_factory=list)
    scheduled_tokens: list[int] = field(default_factory=list)
    spent_s: float = 0.0

    def kept(self, plan: TunePlan) -> tuple[tuple[float, ...], tuple[int, ...]]:
        idx = interference_filter(self.samples_ms, plan.interference_tolerance)
        full = len(self.scheduled_tokens) == len(self.samples_ms)
        tokens = tuple(self.scheduled_tokens[i] for i in idx) if full else ()
        return tuple(self.samples_ms[i] for i in idx), tokens

    def to_step_point(self, b: int, k: int, plan: TunePlan) -> StepPoint:
        return StepPoint(b, k, *self.kept(plan))

    def done(self, plan: TunePlan) -> bool:
        if self.spent_s >= plan.point_budget_s and self.samples_ms:
            return True
        samples, _ = self.kept(plan)
        if len(samples) < plan.min_samples:
            return False
        return StepPoint(1, 0, samples).spread <= plan.target_spread


def measure_points(engine: Engine, batch_sizes: Sequence[int], plan: TunePlan,
                   progress: ProgressFn | None = None, clock: Callable[[], float] = time.monotonic) -> list[StepPoint]:
    """Measure every (b, k) of ``batch_sizes`` x ``plan.ks``: round-robin over k until done."""
    out: list[StepPoint] = []
    total = len(batch_sizes) * len(plan.ks)
    for bi, b in enumerate(batch_sizes):
        points = {k: _Point() for k in plan.ks}
        while True:
            pending = [k for k in plan.ks if not points[k].done(plan)]
            if not pending:
                break
            for k in pending:
                t0 = clock()
                got = engine.measure_step(b, k, plan.steps_per_call)
                points[k].spent_s += clock() - t0
                points[k].samples_ms.extend(got.samples_ms)
                points[k].scheduled_tokens.extend(got.scheduled_tokens)
                if progress:
                    done_here = sum(min(1.0, p.spent_s / plan.point_budget_s) if not p.done(plan) else 1.0
                                    for p in points.values())
                    progress(f"b={b} k={k}", (bi * len(plan.ks) + done_here) / total)
        out.extend(points[k].to_step_point(b, k, plan) for k in plan.ks)
    return out


def suspect_points(points: Sequence[StepPoint], tolerance: float) -> list[tuple[int, int]]:
    """(b, k) whose median exceeds (1 + tolerance) x that of a point doing at least as much work.

    A step with more requests and longer drafts (b' >= b, k' >= k) verifies more
    tokens; when it measured faster, the slower point most likely met interference.
    """
    bad = []
    for p in points:
        if any(q is not p and q.batch_size >= p.batch_size and q.k >= p.k
               and p.median_ms > (1 + tolerance) * q.median_ms for q in points):
            bad.append((p.batch_size, p.k))
    return bad


def recheck_points(engine: Engine, points: list[StepPoint], plan: TunePlan,
                   progress: ProgressFn | None = None) -> list[StepPoint]:
    """Add samples to suspect points (``suspect_points``) and filter again, up to ``recheck_passes`` times."""
    by_key = {(p.batch_size, p.k): p for p in points}
    for n in range(plan.recheck_passes):
        bad = suspect_points(list(by_key.values()), plan.recheck_tolerance)
        for i, (b, k) in enumerate(bad):
            if progress:
                progress(f"recheck b={b} k={k}", (n + i / len(bad)) / plan.recheck_passes)
            got = engine.measure_step(b, k, 2 * plan.steps_per_call)
            by_key[(b, k)] = pool(by_key[(b, k)], StepPoint(b, k, got.samples_ms, got.scheduled_tokens),
                                  lambda samples: interference_filter(samples, plan.interference_tolerance))
    return list(by_key.values())


@dataclass(frozen=True)
class TuneOutcome:
    """Everything one tuning run measured and derived."""

    profile: StepProfile
    acceptance: AcceptanceCounts
    rates: tuple[float, ...]  # conditional a_j measured with the largest k (censoring-correct)
    refined_batch_sizes: tuple[int, ...] = ()
    close_calls: tuple[CloseCall, ...] = ()  # found after the grid and refinement, then re-measured
    draft_rate_modelled: float = 1.0  # the q the table is optimised with (1.0 unless plan.model_draft_rate)


def _phase(progress: ProgressFn | None, lo: float, hi: float) -> ProgressFn | None:
    """Map a phase's 0..1 onto lo..hi of the whole run."""
    if progress is None:
        return None
    return lambda text, frac: progress(text, lo + (hi - lo) * frac)


def run_plan(engine: Engine, plan: TunePlan, prompts: Sequence[str], *, workload: str = "default",
             command: str = "", progress: ProgressFn | None = None) -> TuneOutcome:
    """Acceptance with the largest k, then T(b, k) on the grid, then the optional refinement."""
    k_max = max(plan.ks)
    if progress:
        progress(f"acceptance: {len(prompts)} prompts, k={k_max}", 0.0)
    counts = engine.measure_acceptance(prompts, k_max, plan.acceptance_max_tokens)
    counts.workload = workload
    rates = tuple(counts.known_rates())
    q = counts.draft_rate if plan.model_draft_rate else 1.0
    if not rates:
        raise RuntimeError("no draft was verified while measuring acceptance: the drafter proposed nothing")
    points = measure_points(engine, plan.batch_sizes, plan, _phase(progress, 0.05, 0.7))
    points = recheck_points(engine, points, plan, _phase(progress, 0.7, 0.75))
    fp = engine.fingerprint()
    fp = Fingerprint(**{**fp.__dict__, "command": command or fp.command})
    profile = StepProfile(points=tuple(points), context_len=engine.context_len, fingerprint=fp)
    refined: list[int] = []
    if plan.refine:
        refined = refinement_batch_sizes(profile, rates, k_max, q)
        if refined:
            points = recheck_points(engine, points + measure_points(engine, refined, plan, _phase(progress, 0.75, 0.85)),
                                    plan, _phase(progress, 0.85, 0.88))
            profile = StepProfile(points=tuple(points), context_len=engine.context_len, fingerprint=fp)
    calls = settle_close_calls(engine, profile, rates, plan, _phase(progress, 0.88, 1.0), q)
    if calls:
        profile = StepProfile(points=tuple(calls[1]), context_len=engine.context_len, fingerprint=fp)
    if progress:
        progress("done", 1.0)
    return TuneOutcome(profile, counts, rates, tuple(refined), tuple(calls[0]) if calls else (), q)


def settle_close_calls(engine: Engine, profile: StepProfile, rates: Sequence[float], plan: TunePlan,
                       progress: ProgressFn | None = None,
                       draft_rate: float = 1.0) -> tuple[list[CloseCall], list[StepPoint]] | None:
    """Re-measure the close calls (``tabletune.close_calls``); None when there are none."""
    calls = (close_calls(profile, rates, max(plan.ks), plan.close_call_margin, draft_rate)
             if plan.close_call_windows else [])
    if not calls:
        return None
    windows = iter(range(len(calls) * plan.close_call_windows))

    def measure(b: int, ks: tuple[int, ...]) -> list[StepPoint]:
        if progress:
            progress(f"close call b={b} k={ks}", next(windows) / (len(calls) * plan.close_call_windows))
        return measure_points(engine, [b], dataclasses.replace(plan, ks=ks, point_budget_s=plan.point_budget_s / 2))

    keep = lambda samples: interference_filter(samples, plan.interference_tolerance)  # noqa: E731
    return calls, settle(list(profile.points), calls, plan.close_call_windows, measure, keep)
