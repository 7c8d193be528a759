"""Prompt-lookup (n-gram) drafting with vLLM's matching rule, in numpy (vLLM-style reimplementation).

Reference: vLLM ``vllm/v1/spec_decode/ngram_proposer.py`` (``prompt_lookup_min``/``_max``), after
Saxena's prompt lookup decoding. Rule, for a context ``tokens`` of length L:

* find the largest n in [min_n, max_n] such that the last n tokens occur earlier in the context
  (an occurrence starting at s with s + n <= L - 1; it may overlap the suffix);
* of the occurrences of that longest n, take the earliest (smallest s);
* propose the tokens that followed it, ``tokens[s + n : s + n + k]`` (fewer than k when the
  context ends first). No occurrence for any n: no draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NgramMatch:
    """``n`` matched tokens, the earlier occurrence starting at ``start``; n == 0: no match."""

    n: int
    start: int


def longest_match(tokens: np.ndarray, min_n: int, max_n: int) -> NgramMatch:
    """The longest suffix n-gram (min_n <= n <= max_n) with an earlier occurrence, earliest one."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        # [total - n, n]: every window whose continuation token exists (s + n <= total - 1)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            return NgramMatch(n=n, start=int(hits[0]))
    return NgramMatch(n=0, start=-1)


def propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[np.ndarray, int]:
    """(draft tokens, matched n): up to k tokens that followed the matched n-gram."""
    if min_n < 1 or max_n < min_n or k < 1:
        raise ValueError(f"need 1 <= min_n <= max_n and k >= 1, got min_n={min_n} max_n={max_n} k={k}")
    match = longest_match(np.asarray(tokens), min_n, max_n)
    if match.n == 0:
        return np.empty(0, dtype=np.int64), 0
    begin = match.start + match.n
    return np.asarray(tokens[begin: begin + k], dtype=np.int64), match.n
