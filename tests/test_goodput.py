import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.goodput import (conditional_from_survival, expected_tokens, goodput, interpolate,
                               survival)


def test_expected_tokens_hand_worked():
    rates = [0.8, 0.5, 0.5]
    assert expected_tokens(rates, 0) == 1.0
    assert expected_tokens(rates, 1) == pytest.approx(1.8)
    # 1 + 0.8 + 0.4 + 0.2
    assert expected_tokens(rates, 3) == pytest.approx(2.4)


def test_expected_tokens_rejects_k_beyond_rates():
    with pytest.raises(ValueError, match="k=4"):
        expected_tokens([0.5, 0.5, 0.5], 4)


def test_goodput_hand_worked():
    # 8 requests * 2.4 tokens / 12 ms = 1600 tokens/s
    assert goodput(8, 12.0, 2.4) == pytest.approx(1600.0)


def test_interpolate_linear_and_flat_outside():
    xs, ys = [1, 4, 8], [10.0, 16.0, 32.0]
    assert interpolate(xs, ys, 2) == pytest.approx(12.0)
    assert interpolate(xs, ys, 6) == pytest.approx(24.0)
    assert interpolate(xs, ys, 4) == 16.0
    assert interpolate(xs, ys, 100) == 32.0
    assert interpolate(xs, ys, 0.5) == 10.0


@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=10))
def test_survival_roundtrip(rates):
    back = conditional_from_survival(survival(rates))
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(rates, back))


def test_with_draft_rate_hand_worked():
    from tabletune.goodput import with_draft_rate

    assert with_draft_rate(2.5, 30.0, 10.0, 1.0) == (2.5, 30.0)
    assert with_draft_rate(2.5, 30.0, 10.0, 0.2) == pytest.approx((1.3, 14.0))
    with pytest.raises(ValueError):
        with_draft_rate(2.5, 30.0, 10.0, 1.5)
