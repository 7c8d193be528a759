"""tests/margins.py, the margins other tests assert with, against exact sums and the real estimators."""

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st
from margins import ALPHA, binomial_margin, decayed_count, decayed_share_range

from tabletune.controller.estimator import DecayedDraftRate


def outside(p: Fraction, n: int, m: Fraction) -> Fraction:
    """P(|X / n - p| > m), X ~ Binomial(n, p), in exact arithmetic."""
    return sum((comb(n, x) * p**x * (1 - p) ** (n - x) for x in range(n + 1) if abs(Fraction(x, n) - p) > m),
               Fraction(0))


@pytest.mark.parametrize("p, n", [(Fraction(1, 2), 100), (Fraction(9, 10), 300), (Fraction(3, 4), 40)])
def test_binomial_margin_is_the_exact_quantile(p, n):
    m = Fraction(binomial_margin(float(p), n)).limit_denominator(10 * n)
    assert outside(p, n, m) <= ALPHA
    assert outside(p, n, m - Fraction(1, n)) > ALPHA / 2  # one count less and a tail holds more than its share


def test_decayed_count_is_what_the_estimator_keeps():
    rate = DecayedDraftRate(1.0, 0.0, half_life=50)
    for _ in range(120):
        rate.update(1, 0)
    s, n_eff = decayed_count(120, 50)
    assert rate.drafts == pytest.approx(s)
    assert 120 > n_eff > s  # fewer than the draws, more than their weight


@given(st.lists(st.booleans(), min_size=2, max_size=300), st.integers(1, 40))
def test_the_decayed_draft_rate_lies_in_its_range_whatever_the_order(draws, window):
    rate = DecayedDraftRate(1.0, 20.0, half_life=80)
    for i in range(0, len(draws), window):
        chunk = draws[i:i + window]
        rate.update(sum(chunk), len(chunk) - sum(chunk))
    hits = sum(draws)
    lo, hi = decayed_share_range(hits, len(draws) - hits, 80, window, 20.0, 1.0)
    assert lo - 1e-12 <= rate.rate <= hi + 1e-12


def test_the_range_is_reached_one_draw_at_a_time():
    for misses_first, end in ((True, 1), (False, 0)):
        rate = DecayedDraftRate(1.0, 20.0, half_life=80)
        for hit in [not misses_first] * 30 + [misses_first] * 70:
            rate.update(int(hit), int(not hit))
        hits = 70 if misses_first else 30
        assert rate.rate == pytest.approx(decayed_share_range(hits, 100 - hits, 80, 1, 20.0, 1.0)[end])
