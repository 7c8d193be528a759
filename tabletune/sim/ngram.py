"""The n-gram (prompt-lookup) drafter: copyable spans, match length -> acceptance.

Stated model. Each request alternates between free text and *copyable spans* (text
that repeats something in its context, e.g. the unchanged lines of a code edit):

* outside a span, each emitted token starts a span with probability
  ``Workload.span_start_prob``; a span lasts Geometric(mean ``span_mean_len``) tokens,
  and its suffix match length L starts at 3 (the lookup matches once a few tokens
  of the span are out) and grows by the tokens emitted;
* in a span the drafter proposes k_max tokens; position j is accepted with
  conditional probability ngram_rate(L + j - 1) while j <= the span's remaining
  length, and rejected past the span's end, where

      ngram_rate(L) = 0.97 - 0.47 * exp(-(L - 1) / 4)

  (short matches are often coincidental, long matches are nearly always copies);
* outside a span a spurious match (L = 1 or 2) occurs with probability
  ``Workload.spurious_match_prob`` per step; its tokens are accepted with
  conditional probability 0.1; otherwise the drafter proposes nothing.

``calibration_rates`` is the population conditional acceptance per L, the
"calibration table fit once on general text" that Hybrid Spark uses.
"""

from __future__ import annotations

import numpy as np

SPURIOUS_RATE = 0.1
START_MATCH_LEN = 3


def ngram_rate(match_len: np.ndarray) -> np.ndarray:
    """Conditional acceptance of an in-span n-gram token at suffix-match length L."""
    return 0.97 - 0.47 * np.exp(-(np.asarray(match_len, dtype=float) - 1.0) / 4.0)


def calibration_rates(span_mean_len: float, l_max: int = 64) -> tuple[float, ...]:
    """rates[L] for L = 0..l_max: spurious below START_MATCH_LEN, in-span rate times span continuation.

    A span token at match length L is a copy that continues with probability
    1 - 1/span_mean_len per token (geometric), so the rate is ngram_rate(L) * (1 - 1/mean).
    """
    cont = 1.0 - 1.0 / max(span_mean_len, 1.0)
    out = [0.0]
    for length in range(1, l_max + 1):
        out.append(SPURIOUS_RATE if length < START_MATCH_LEN else float(ngram_rate(length)) * cont)
    return tuple(out)


def propose(span_left: np.ndarray, match_len: np.ndarray, spurious_prob: np.ndarray, k_max: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(num_proposed [b], match_len_seen [b]) before a step; spurious matches get L in {1, 2}."""
    in_span = span_left > 0
    spurious = ~in_span & (rng.random(len(span_left)) < spurious_prob)
    seen = np.where(in_span, match_len, 0)
    seen = np.where(spurious, rng.integers(1, START_MATCH_LEN, len(span_left)), seen)
    proposed = np.where(in_span | spurious, k_max, 0)
    return proposed, seen


def margins(span_left: np.ndarray, match_len_seen: np.ndarray, k_max: int, rng: np.random.Generator) -> np.ndarray:
    """[b, k_max] pseudo-margins, > 0 where the n-gram token at that position would be accepted.

    In a span (span_left > 0): position j accepted w.p. ngram_rate(L + j - 1) while j <= span_left.
    Spurious (span_left == 0, L > 0): accepted w.p. SPURIOUS_RATE.
    """
    j = np.arange(1, k_max + 1)[None, :]
    in_span = (span_left > 0)[:, None]
    rate = np.where(in_span, ngram_rate(match_len_seen[:, None] + j - 1), SPURIOUS_RATE)
    rate = np.where(in_span & (j > span_left[:, None]), 0.0, rate)
    return rate - rng.random(rate.shape)


def advance(span_left: np.ndarray, match_len: np.ndarray, tokens: np.ndarray, span_start_prob: np.ndarray,
            span_mean_len: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Span state after each request emitted ``tokens``; returns new (span_left, match_len)."""
    in_span = span_left > 0
    left = np.where(in_span, span_left - tokens, 0)
    length = np.where(in_span, match_len + tokens, 0)
    ended = left <= 0
    left = np.where(ended, 0, left)
    length = np.where(ended, 0, length)
    start_p = 1.0 - (1.0 - span_start_prob) ** tokens
    starts = ~in_span & (rng.random(len(tokens)) < start_p)
    if starts.any():
        new_len = rng.geometric(1.0 / np.maximum(span_mean_len, 1.0))
        left = np.where(starts, new_len, left)
        length = np.where(starts, START_MATCH_LEN, length)
    return left, length
