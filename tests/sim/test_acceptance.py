import numpy as np
import pytest
from margins import binomial_margin

from tabletune.sim import acceptance as acc
from tabletune.sim.traces import draft_log
from tabletune.sim.workload import Workload

RATES = (0.8, 0.75, 0.7, 0.65, 0.6)


@pytest.mark.parametrize("h", [0.0, 0.3, 1.0])
def test_calibration_matches_population_survival(h):
    thetas = acc.calibrate_logits(RATES, h)
    assert acc.population_survival(thetas, h) == pytest.approx(np.cumprod(RATES), abs=1e-6)


def test_no_heterogeneity_means_sigmoid_theta_is_the_rate():
    assert acc.sigmoid(acc.calibrate_logits(RATES, 0.0)) == pytest.approx(RATES, abs=1e-6)


def test_accepted_count_hand_worked():
    margin = np.array([[1.0, 2.0, -1.0, 3.0],
                       [-0.5, 1.0, 1.0, 1.0],
                       [0.1, 0.2, 0.3, 0.4]])
    assert acc.accepted_count(margin, np.array([4, 4, 4])).tolist() == [2, 0, 4]
    assert acc.accepted_count(margin, np.array([1, 4, 2])).tolist() == [1, 0, 2]


def test_sampled_conditional_rates_match():
    rng = np.random.default_rng(0)
    thetas = acc.calibrate_logits(RATES, 0.6)
    logits = acc.request_logits(thetas, 0.6, 200_000, rng)
    m = acc.accepted_count(acc.draw_margins(logits, rng), np.full(200_000, 5))
    for j, p in enumerate(np.cumprod(RATES), 1):  # each a share of 200_000 independent rows
        assert abs((m >= j).mean() - p) <= binomial_margin(p, 200_000), j


def test_confidence_signal_separates_accepted_tokens():
    log = draft_log(Workload("w", RATES), 5000, 5, seed=1)
    x, y = log.training_rows()
    top1 = x[:, 0]
    assert top1[y == 1].mean() > top1[y == 0].mean() + 0.2
    assert x[:, 1][y == 1].mean() < x[:, 1][y == 0].mean()  # lower entropy when accepted
    assert np.all((top1 > 0) & (top1 < 1)) and np.all(x[:, 2] >= 0)
    # censoring: a position is reached only if all earlier ones were accepted
    assert np.all(log.reached[:, 1:] <= log.accepted[:, :-1])


def test_kl_is_larger_for_rejected_tokens():
    rng = np.random.default_rng(0)
    margin = np.array([[3.0] * 2000, [-3.0] * 2000])
    kl = acc.kl_divergence(margin, rng)
    assert kl[1].mean() > 3 * kl[0].mean()
