"""Tuning a drafter that proposes only on a match (n-gram) from yields measured at each k.

``run_plan`` measures acceptance at the largest k. For a drafter whose draft rate q there is below
the plan's ``yields_below_draft_rate``, neither q nor the tokens a step yields carry over from k_max
to a shorter k (``goodput.DraftYield``), so this measures acceptance at every k and turns each run's
counts into a yield:

    tokens_per_step = 1 + accepted tokens / request-steps,   request-steps = drafts + undrafted
    draft_rate      = drafts / request-steps

The optimizer (``OptimizeOptions.yields``) then builds the table from these yields at the engine's
draft share f (the plan's ``draft_share``; ``cost.fit_draft_share``, ``benchmarks/partial_draft_cost.py``).
This module imports neither torch nor vllm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tabletune.acceptance import AcceptanceCounts
from tabletune.goodput import DraftYield
from tabletune.tuner.protocol import Engine


def yield_from_counts(k: int, counts: AcceptanceCounts) -> DraftYield:
    """The yield of one acceptance run at draft length k (formulas in the module docstring)."""
    steps = counts.num_drafts + counts.undrafted
    if k == 0 or steps == 0:
        return DraftYield(k, 1.0, 0.0)
    tokens = 1.0 + sum(counts.accepted) / steps
    return DraftYield(k, min(tokens, k + 1.0), counts.draft_rate)


def measure_yields(engine: Engine, prompts: Sequence[str], ks: Sequence[int], max_tokens: int,
                   known: Mapping[int, AcceptanceCounts] | None = None,
                   on_measured: Callable[[int, AcceptanceCounts], None] | None = None) -> tuple[DraftYield, ...]:
    """One acceptance run per k >= 1 on the same prompts (k = 0 yields one token a step, nothing to measure).

    Runs already in ``known`` (k -> counts: the pass at k_max, a checkpoint's) are not repeated;
    ``on_measured(k, counts)`` sees each new run as soon as it ends.
    """
    known = dict(known or {})
    out = []
    for k in sorted(set(ks)):
        if k == 0:
            out.append(DraftYield(0, 1.0, 0.0))
            continue
        if k not in known:
            known[k] = engine.measure_acceptance(prompts, k, max_tokens)
            if on_measured is not None:
                on_measured(k, known[k])
        out.append(yield_from_counts(k, known[k]))
    return tuple(out)
