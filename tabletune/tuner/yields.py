"""Tuning a drafter that proposes only on a match (n-gram) from yields measured at each k.

``run_plan`` measures acceptance at the largest k. For a drafter whose draft rate q there is below
the plan's ``yields_below_draft_rate``, neither q nor the tokens a step yields carry over from k_max
to a shorter k (``goodput.DraftYield``), so this measures acceptance at every k and turns each run's
counts into a yield:

    tokens_per_step = 1 + accepted tokens / request-steps,   request-steps = drafts + undrafted
    draft_rate      = drafts / request-steps

The optimizer (``OptimizeOptions.yields``) then builds the table from these yields, each step costed
T_q(b, k) (``cost.partial_draft_ms``) at the engine's draft share f. f is measured, not assumed: an
engine that records its steps (``take_mixed_steps``, vLLM) hands over the decode steps of these same
runs, real steps in which some rows drafted and others did not, and ``fit_share`` fits f to them
against the grid's uniform T(b, k), with a level of their own for the difference in context, text
and machine load (``cost.fit_share_and_level``). An engine that pads every row to the
longest draft (the built-in one) has f = 1, the default when there is nothing to fit.
This module imports neither torch nor vllm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tabletune.acceptance import AcceptanceCounts
from tabletune.cost import MixedStep, fit_share_and_level
from tabletune.goodput import DraftYield
from tabletune.profile import StepProfile
from tabletune.tuner.protocol import Engine

PADDED_SHARE = 1.0  # f with nothing to fit: every row pays for the longest draft


@dataclass(frozen=True)
class AcceptanceRun:
    """One acceptance run at one k: its counts and the decode steps the engine recorded meanwhile."""

    counts: AcceptanceCounts
    steps: tuple[MixedStep, ...] = ()


@dataclass(frozen=True)
class DraftShare:
    """The draft share f the table is built with, and where it came from."""

    value: float
    fitted_steps: int = 0  # informative steps it was fitted on (0: given or the padded default)
    source: str = "default"  # "fitted", "given" or "default"
    level: float = 1.0  # fitted: the recorded steps' time over the profile's (context, content, load)


def yield_from_counts(k: int, counts: AcceptanceCounts) -> DraftYield:
    """The yield of one acceptance run at draft length k (formulas in the module docstring)."""
    steps = counts.num_drafts + counts.undrafted
    if k == 0 or steps == 0:
        return DraftYield(k, 1.0, 0.0)
    tokens = 1.0 + sum(counts.accepted) / steps
    return DraftYield(k, min(tokens, k + 1.0), counts.draft_rate)


def run_acceptance(engine: Engine, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceRun:
    """``engine.measure_acceptance`` and, from an engine that records them, the run's decode steps."""
    counts = engine.measure_acceptance(prompts, k, max_tokens)
    take = getattr(engine, "take_mixed_steps", None)
    return AcceptanceRun(counts, tuple(take()) if take is not None else ())


def measure_yields(engine: Engine, prompts: Sequence[str], ks: Sequence[int], max_tokens: int,
                   known: Mapping[int, AcceptanceRun] | None = None,
                   on_measured: Callable[[int, AcceptanceRun], None] | None = None,
                   ) -> tuple[tuple[DraftYield, ...], tuple[MixedStep, ...]]:
    """One acceptance run per k >= 1 on the same prompts (k = 0 yields one token a step, nothing to
    measure): the yields, and every run's recorded steps.

    Runs already in ``known`` (k -> run: the pass at k_max, a checkpoint's) are not repeated;
    ``on_measured(k, run)`` sees each new run as soon as it ends.
    """
    known = dict(known or {})
    yields, steps = [], []
    for k in sorted(set(ks)):
        if k == 0:
            yields.append(DraftYield(0, 1.0, 0.0))
            continue
        if k not in known:
            known[k] = run_acceptance(engine, prompts, k, max_tokens)
            if on_measured is not None:
                on_measured(k, known[k])
        yields.append(yield_from_counts(k, known[k].counts))
        steps.extend(known[k].steps)
    return tuple(yields), tuple(steps)


def fit_share(profile: StepProfile, steps: Sequence[MixedStep], given: float | None = None) -> DraftShare:
    """f given by the operator, else fitted to the recorded steps that carry information about it (some
    rows drafted less than the longest, within the profile's k), else the padded default."""
    if given is not None:
        return DraftShare(given, 0, "given")
    usable = [s for s in steps if s.k_top <= max(profile.ks)]
    try:
        share, level = fit_share_and_level(profile, usable)
    except ValueError:
        return DraftShare(PADDED_SHARE, 0, "default")
    return DraftShare(share, sum(s.k_bar < s.k_top for s in usable), "fitted", level)
