"""The grid at the workload's shape: which contexts to time, and what text the timed requests carry.

A served request of P prompt tokens that generates G tokens runs its decode steps at contexts
P .. P + G, on average P + G / 2. So by default the tune times its grid at one context length,

    context_len = median(prompt tokens) + output_tokens // 2

and ``--context-lens`` may name quantiles of the prompt set instead of (or beside) plain lengths:
``p10,p50,p90`` -> the 10th, 50th and 90th percentile of the prompt lengths, each + output_tokens // 2.
The q-th quantile interpolates linearly between order statistics (NumPy's default): with the
lengths sorted as x_0 <= ... <= x_{n-1}, position h = q (n - 1), quantile = x_floor(h) +
(h - floor(h)) (x_floor(h)+1 - x_floor(h)), rounded to the nearest token.

The timed requests carry the workload's own token ids (``timing_rows``), so a drafter that
searches the context (n-gram) searches real text. This module imports neither torch nor vllm.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from tabletune.errors import InputError

QUANTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?|100)$")  # p50, p90, p99.5, p100


def quantile(values: Sequence[int], q: float) -> float:
    """The q-th quantile (0 <= q <= 1) by linear interpolation between order statistics (formula above)."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"q must lie in [0, 1], got {q}")
    xs = sorted(values)
    h = q * (len(xs) - 1)
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def workload_context_len(prompt_tokens: Sequence[int], output_tokens: int, q: float = 0.5) -> int:
    """round(quantile(prompt_tokens, q)) + output_tokens // 2: the mean context of a request at that quantile."""
    if output_tokens < 0:
        raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
    return max(1, round(quantile(prompt_tokens, q)) + output_tokens // 2)


def context_lens(text: str | None, prompt_tokens: Sequence[int], output_tokens: int,
                 source: str = "--context-lens") -> tuple[int, ...]:
    """Context lengths (ascending, distinct) from ``512,p50,p90`` (plain tokens or prompt-set quantiles,
    each + output_tokens // 2); None or empty: the median alone (``p50``)."""
    items = [s.strip() for s in (text or "p50").split(",") if s.strip()]
    if not items:
        raise InputError(source, "context_lens", text, "give context lengths or quantiles like p50")
    out = set()
    for item in items:
        m = QUANTILE.match(item)
        if m:
            if not prompt_tokens:
                raise InputError(source, "context_lens", item, "a quantile needs prompts")
            out.add(workload_context_len(prompt_tokens, output_tokens, float(m.group(1)) / 100))
            continue
        try:
            n = int(item)
        except ValueError:
            raise InputError(source, "context_lens", item, "give an integer or a quantile like p50") from None
        if n < 1:
            raise InputError(source, "context_lens", item, "context lengths must be >= 1")
        out.add(n)
    return tuple(sorted(out))


def timing_rows(prompt_ids: Sequence[Sequence[int]], num_rows: int, length: int, offset: int = 0) -> list[list[int]]:
    """``num_rows`` token rows of exactly ``length`` tokens of real text, one per timed request.

    Row i ends with prompt j = (offset + i) mod n whole (its last ``length`` tokens when longer);
    a shorter prompt is preceded by prompts j - 1, j - 2, ... (cyclically), so the row's earlier
    context is real text of the same workload too.
    """
    prompts = [list(p) for p in prompt_ids if p]
    if not prompts:
        raise ValueError("no non-empty prompt to build timing rows from")
    if length < 1 or num_rows < 0:
        raise ValueError(f"need length >= 1 and num_rows >= 0, got {length}, {num_rows}")
    n = len(prompts)
    rows = []
    for i in range(num_rows):
        j = (offset + i) % n
        row: list[int] = []
        back = 0
        while len(row) < length:
            row = prompts[(j - back) % n] + row
            back += 1
        rows.append(row[-length:])
    return rows


def byte_token_ids(text: str, vocab_size: int) -> list[int]:
    """Token ids of a model without a tokenizer (random or dummy weights): the UTF-8 bytes mod the vocabulary."""
    return [b % vocab_size for b in text.encode()]
