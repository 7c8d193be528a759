"""One tuning run: acceptance with the largest k, T(b, k) on the grid, refinement, close calls.

* batch sizes: the plan's grid (by default ``tabletune.padding.geometric_batch_sizes``:
  1, 2, 4, ..., max_batch_size), every k in the plan's ``ks``; each point is measured
  as ``tabletune.tuner.measure`` says;
* optional refinement: where the chosen k differs between neighbouring
  measured batch sizes, the midpoint is measured too (every k);
* close calls (``tabletune.tuner.close_calls``): where another k's modelled goodput is
  within ``close_call_margin`` of the best at a measured b, those k are measured
  in ``close_call_windows`` more windows and the pooled samples decide.

The table then maximises goodput(b, k) = b * E[tokens | k] / T(b, k), with
E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j from the measured acceptance
(see ``tabletune.optimizer``). A drafter that proposes only on a match (measured draft
rate below the plan's ``yields_below_draft_rate``) gets one acceptance run per k instead,
and the table maximises b * tokens_per_step(k) / T_q(b, k) on those yields, with the draft
share f of T_q fitted to the runs' own steps (``tabletune.tuner.yields``). This module
imports neither torch nor vllm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.acceptance import AcceptanceCounts
from tabletune.cost import MixedStep
from tabletune.goodput import DraftYield
from tabletune.optimizer import OptimizeOptions
from tabletune.prefill import PrefillCost
from tabletune.profile import Fingerprint, StepPoint, StepProfile
from tabletune.tuner.budget import BatchCap, capped_batch_sizes, check_caps
from tabletune.tuner.checkpoint import Checkpoint
from tabletune.tuner.close_calls import CloseCall, close_calls, refinement_batch_sizes, settle
from tabletune.tuner.measure import interference_filter, measure_points, recheck_points
from tabletune.tuner.plan import ProgressFn, TunePlan
from tabletune.tuner.protocol import Engine
from tabletune.tuner.yields import AcceptanceRun, DraftShare, fit_share, measure_yields, run_acceptance


@dataclass(frozen=True)
class TuneOutcome:
    """Everything one tuning run measured and derived."""

    profile: StepProfile
    acceptance: AcceptanceCounts
    rates: tuple[float, ...]  # conditional a_j measured with the largest k (censoring-correct)
    refined_batch_sizes: tuple[int, ...] = ()
    close_calls: tuple[CloseCall, ...] = ()  # found after the grid and refinement, then re-measured
    yields: tuple[DraftYield, ...] = ()  # per-k yields of a drafter that proposes only on a match (else none)
    draft_share: DraftShare = DraftShare(1.0)  # f of the partial-draft cost, used with the yields
    batch_cap: BatchCap | None = None  # how many sequences this context held (the grid stops there when capped)

    def options(self) -> OptimizeOptions:
        """The optimizer's options for this outcome (``table_options``)."""
        return table_options(max(self.profile.ks), self.yields, self.draft_share)


def table_options(k_max: int, yields: tuple[DraftYield, ...], share: DraftShare) -> OptimizeOptions:
    """The optimizer's options of a tune: k_max, and the yields with their draft share when measured."""
    return OptimizeOptions(k_max=k_max, yields=yields, draft_share=share.value if yields else None)


@dataclass(frozen=True)
class Inputs:
    """What the acceptance runs measured: counts at k_max and, for a drafter that proposes only on a
    match, the per-k yields with the steps recorded during all the runs."""

    counts: AcceptanceCounts
    yields: tuple[DraftYield, ...] = ()
    steps: tuple[MixedStep, ...] = ()
    prefill: PrefillCost | None = None  # from an engine that measures it (``measure_prefill``)


def _phase(progress: ProgressFn | None, lo: float, hi: float) -> ProgressFn | None:
    """Map a phase's 0..1 onto lo..hi of the whole run."""
    if progress is None:
        return None
    return lambda text, frac: progress(text, lo + (hi - lo) * frac)


def measure_acceptance(engine: Engine, plan: TunePlan, prompts: Sequence[str], workload: str,
                       checkpoint: Checkpoint | None = None) -> AcceptanceRun:
    """The acceptance pass with the largest k (from the checkpoint when it already holds it)."""
    if checkpoint is not None and checkpoint.acceptance is not None:
        return checkpoint.acceptance
    run = run_acceptance(engine, prompts, max(plan.ks), plan.acceptance_max_tokens)
    run.counts.workload = workload
    if not run.counts.known_rates():
        raise RuntimeError("no draft was verified while measuring acceptance: the drafter proposed nothing")
    if checkpoint is not None:
        checkpoint.save_acceptance(run)
    return run


def measure_inputs(engine: Engine, plan: TunePlan, prompts: Sequence[str], workload: str,
                   checkpoint: Checkpoint | None = None, progress: ProgressFn | None = None) -> Inputs:
    """Acceptance at k_max; when its draft rate is below the plan's threshold, also at every other k."""
    if progress:
        progress(f"acceptance: {len(prompts)} prompts, k={max(plan.ks)}", 0.0)
    first = measure_acceptance(engine, plan, prompts, workload, checkpoint)
    counts = first.counts
    prefill = measure_prefill(engine, prompts)
    if counts.draft_rate >= plan.yields_below_draft_rate:
        return Inputs(counts, prefill=prefill)
    known = {max(plan.ks): first, **(checkpoint.yield_runs if checkpoint is not None else {})}

    def measured(k: int, run: AcceptanceRun) -> None:
        run.counts.workload = counts.workload
        if checkpoint is not None:
            checkpoint.save_yield_run(k, run)

    if progress:
        progress(f"draft rate {counts.draft_rate:.2f}: acceptance at every k", 0.0)
    yields, steps = measure_yields(engine, prompts, plan.ks, plan.acceptance_max_tokens, known, measured)
    return Inputs(counts, yields, steps, prefill)


def measure_prefill(engine: Engine, prompts: Sequence[str]) -> PrefillCost | None:
    """The workload's prefill cost from an engine that offers ``measure_prefill(prompts)``, else None
    (the step profile then carries none, and predictions are decode-only)."""
    measure = getattr(engine, "measure_prefill", None)
    return measure(prompts) if measure is not None and prompts else None


def measure_grid(engine: Engine, plan: TunePlan, progress: ProgressFn | None = None,
                 checkpoint: Checkpoint | None = None, context_len: int = 0) -> list[StepPoint]:
    """Every (b, k) of the plan's grid, one batch size at a time; each batch size's points are
    appended to the checkpoint as soon as they are measured, and points it already holds are kept."""
    done = checkpoint.done_points(context_len) if checkpoint is not None else {}
    points: list[StepPoint] = []
    n = len(plan.batch_sizes)
    for i, b in enumerate(plan.batch_sizes):
        have = [done[(b, k)] for k in plan.ks if (b, k) in done]
        if len(have) == len(plan.ks):
            points.extend(have)
            continue
        got = measure_points(engine, [b], plan, _phase(progress, i / n, (i + 1) / n))
        if checkpoint is not None:
            checkpoint.save_points(context_len, got)
        points.extend(got)
    return points


def run_plan(engine: Engine, plan: TunePlan, prompts: Sequence[str], *, workload: str = "default",
             command: str = "", progress: ProgressFn | None = None,
             checkpoint: Checkpoint | None = None, inputs: Inputs | None = None) -> TuneOutcome:
    """Acceptance (``measure_inputs``, unless ``inputs`` are given), then T(b, k) on the grid at the
    engine's current context length, the draft share f when there are yields, then the optional
    refinement and the close calls."""
    k_max = max(plan.ks)
    if inputs is None:
        inputs = measure_inputs(engine, plan, prompts, workload, checkpoint, progress)
    counts, yields = inputs.counts, inputs.yields
    rates = tuple(counts.known_rates())
    points = measure_grid(engine, plan, _phase(progress, 0.05, 0.7), checkpoint, engine.context_len)
    points = recheck_points(engine, points, plan, _phase(progress, 0.7, 0.75))
    fp = engine.fingerprint()
    fp = Fingerprint(**{**fp.__dict__, "command": command or fp.command})
    profile = StepProfile(points=tuple(points), context_len=engine.context_len, fingerprint=fp,
                          prefill=inputs.prefill)
    share = fit_share(profile, inputs.steps, plan.draft_share) if yields else DraftShare(1.0)
    options = table_options(k_max, yields, share)
    refined: list[int] = []
    if plan.refine:
        refined = refinement_batch_sizes(profile, rates, k_max, options)
        if refined:
            points = recheck_points(engine, points + measure_points(engine, refined, plan, _phase(progress, 0.75, 0.85)),
                                    plan, _phase(progress, 0.85, 0.88))
            profile = dataclasses.replace(profile, points=tuple(points), context_len=engine.context_len)
    calls = settle_close_calls(engine, profile, rates, plan, _phase(progress, 0.88, 1.0), options)
    if calls:
        profile = dataclasses.replace(profile, points=tuple(calls[1]), context_len=engine.context_len)
    if progress:
        progress("done", 1.0)
    return TuneOutcome(profile, counts, rates, tuple(refined), tuple(calls[0]) if calls else (), yields, share)


def settle_close_calls(engine: Engine, profile: StepProfile, rates: Sequence[float], plan: TunePlan,
                       progress: ProgressFn | None = None,
                       options: OptimizeOptions | None = None) -> tuple[list[CloseCall], list[StepPoint]] | None:
    """Re-measure the close calls (``tabletune.tuner.close_calls``); None when there are none."""
    calls = (close_calls(profile, rates, max(plan.ks), plan.close_call_margin, options)
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


def batch_cap(engine: Engine, context_len: int) -> BatchCap:
    """The largest batch the engine holds at ``context_len`` now: its optional ``batch_cap(n)``, else all of
    ``max_batch_size``. Measures nothing."""
    cap = getattr(engine, "batch_cap", None)
    n = engine.max_batch_size
    return cap(context_len) if cap is not None else BatchCap(context_len, n, n)


def batch_caps(engine: Engine, context_lens: Sequence[int]) -> list[BatchCap]:
    """``batch_cap`` of each context length; refuses (InputError) when a context holds not even one sequence."""
    caps = [batch_cap(engine, c) for c in sorted(set(context_lens))]
    check_caps(caps)
    return caps


def run_contexts(engine: Engine, plan: TunePlan, prompts: Sequence[str], context_lens: Sequence[int], *,
                 workload: str = "default", command: str = "", progress: ProgressFn | None = None,
                 checkpoint: Checkpoint | None = None) -> list[TuneOutcome]:
    """One outcome per context length (ascending): acceptance once, then ``run_plan`` at each context, on the
    plan's batch sizes up to what that context holds (``capped_batch_sizes``). Every context is checked before
    anything is measured (``batch_caps``); each context's cap is then asked again once ``set_context_len`` has
    released the previous context's engine, just before its own is built (an engine sized from memory sees
    what is free then).

    The engine must offer ``set_context_len(n)`` when there is more than one context length.
    """
    lens = sorted(set(context_lens))
    batch_caps(engine, lens)
    inputs = measure_inputs(engine, plan, prompts, workload, checkpoint, progress)
    out = []
    for i, n in enumerate(lens):
        if len(lens) > 1:  # the engine started at the largest (its cache fits it); a single one is that
            engine.set_context_len(n)  # type: ignore[attr-defined]
        phase = _phase(progress, i / len(lens), (i + 1) / len(lens))
        if phase and len(lens) > 1:
            phase = _labelled(phase, f"ctx {n} ")
        cap = batch_cap(engine, n)
        check_caps([cap])
        grid = dataclasses.replace(plan, batch_sizes=capped_batch_sizes(plan.batch_sizes, cap.batch_size))
        outcome = run_plan(engine, grid, prompts, workload=workload, command=command, progress=phase,
                           checkpoint=checkpoint, inputs=inputs)
        out.append(dataclasses.replace(outcome, batch_cap=cap))
    return out


def _labelled(progress: ProgressFn, label: str) -> ProgressFn:
    return lambda text, frac: progress(label + text, frac)


def measure_static(engine: Engine, plan: TunePlan, k: int, batch_sizes: Sequence[int],
                   progress: ProgressFn | None = None) -> list[StepPoint]:
    """T_static(b, k) at ``batch_sizes`` on an engine started without the table mechanism."""
    return measure_points(engine, batch_sizes, dataclasses.replace(plan, ks=(k,)), progress)
