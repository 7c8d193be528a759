"""Hook: tuning a drafter that proposes only on a match (n-gram) from yields measured at each k.

``run_plan`` measures acceptance once, at the largest k. For a drafter whose draft rate q is below 1,
neither q nor the tokens a step yields carry over from k_max to a shorter k (``goodput.DraftYield``),
so this measures acceptance at every k and turns each run's counts into a yield:

    tokens_per_step = 1 + accepted tokens / request-steps,   request-steps = drafts + undrafted
    draft_rate      = drafts / request-steps

``optimizer.optimize_yields`` then builds the table at the engine's draft share f (``cost.fit_draft_share``,
``benchmarks/partial_draft_cost.py``). This module imports neither torch nor vllm.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def measure_yields(engine: Engine, prompts: Sequence[str], ks: Sequence[int], max_tokens: int) -> tuple[DraftYield, ...]:
    """One acceptance run per k >= 1 on the same prompts (k = 0 yields one token a step, nothing to measure)."""
    return tuple(yield_from_counts(k, engine.measure_acceptance(prompts, k, max_tokens)) if k else DraftYield(0, 1.0, 0.0)
                 for k in sorted(set(ks)))
