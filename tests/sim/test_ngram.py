import numpy as np
import pytest

from tabletune.sim import ngram


def test_ngram_rate_grows_with_match_length():
    r = ngram.ngram_rate(np.array([1, 3, 10, 40]))
    assert r[0] == pytest.approx(0.5)
    assert np.all(np.diff(r) > 0) and r[-1] < 0.97


def test_calibration_table():
    rates = ngram.calibration_rates(span_mean_len=10.0, l_max=8)
    assert rates[0] == 0.0 and rates[1] == rates[2] == ngram.SPURIOUS_RATE
    assert rates[5] == pytest.approx(float(ngram.ngram_rate(5)) * 0.9)


def test_tokens_past_the_span_end_are_rejected():
    rng = np.random.default_rng(0)
    m = ngram.margins(np.array([2] * 1000), np.array([40] * 1000), 5, rng)
    assert np.all(m[:, 2:] < 0)
    assert (m[:, 0] > 0).mean() > 0.9


def test_propose_and_advance():
    rng = np.random.default_rng(0)
    prop, seen = ngram.propose(np.array([5, 0]), np.array([7, 0]), np.array([0.0, 0.0]), 4, rng)
    assert prop.tolist() == [4, 0] and seen.tolist() == [7, 0]
    left, length = ngram.advance(np.array([5, 3]), np.array([7, 4]), np.array([2, 3]), np.array([0.0, 0.0]),
                                 np.array([10.0, 10.0]), rng)
    assert left.tolist() == [3, 0] and length.tolist() == [9, 0]
    left, length = ngram.advance(np.array([0]), np.array([0]), np.array([1]), np.array([1.0]), np.array([10.0]), rng)
    assert left[0] >= 1 and length[0] == ngram.START_MATCH_LEN
