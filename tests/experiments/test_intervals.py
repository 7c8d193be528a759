"""Seed-bootstrap intervals of Fig 3 and Fig 4b, on hand-worked arrays."""

import numpy as np
import pytest

from tabletune.experiments.analysis import bootstrap_ci, seed_shares
from tabletune.experiments.figures import worst_loss_ci
from tabletune.experiments.runner import Point
from tabletune.experiments.switch import recovered


def _point(policy: str, load: int, seed: int, tok_s: float) -> Point:
    return Point("s", policy, load, seed, tok_s, 1.0, 0.5, 10.0)


def test_seed_shares_divide_by_each_seeds_best_fixed_k():
    points = [_point("fixed:1", 1, 0, 100.0), _point("fixed:2", 1, 0, 80.0), _point("table", 1, 0, 90.0),
              _point("fixed:1", 1, 1, 50.0), _point("fixed:2", 1, 1, 100.0), _point("table", 1, 1, 100.0)]
    per_seed = seed_shares(points, ["fixed:1", "fixed:2"])
    assert per_seed[("s", "table", 1)] == {0: pytest.approx(0.9), 1: pytest.approx(1.0)}
    assert per_seed[("s", "fixed:2", 1)] == {0: pytest.approx(0.8), 1: pytest.approx(1.0)}


def test_bootstrap_interval_of_a_constant_is_the_constant_and_of_a_mean_brackets_it():
    assert bootstrap_ci(lambda idx: 3.0, 5) == (3.0, 3.0)
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    low, high = bootstrap_ci(lambda idx: values[idx].mean(), len(values))
    assert 1.0 < low < values.mean() < high < 6.0


def test_worst_loss_interval_pairs_seeds_and_loads():
    # shares per (load, seed): the worst load is 2 (mean 0.95) for "a"; "b" equals "a" seed by seed
    per_seed = {("s", "a", 1): {0: 1.0, 1: 1.0}, ("s", "a", 2): {0: 0.94, 1: 0.96},
                ("s", "b", 1): {0: 1.0, 1: 1.0}, ("s", "b", 2): {0: 0.94, 1: 0.96}}
    low, high = worst_loss_ci(per_seed, "s", "a", (1, 2), (0, 1))
    assert 0.04 - 1e-9 <= low <= 0.05 <= high <= 0.06 + 1e-9
    assert worst_loss_ci(per_seed, "s", "a", (1, 2), (0, 1), minus="b") == (0.0, 0.0)


def test_recovered_share_is_the_ratio_of_mean_gains_with_paired_seeds():
    stale = np.array([[100.0, 90.0], [110.0, 80.0]])  # [seeds, windows]
    oracle = np.array([[100.0, 100.0], [110.0, 100.0]])
    ctrl = np.array([[100.0, 99.0], [110.0, 98.0]])  # recovers 9 of 10 and 18 of 20
    share, low, high = recovered(stale, oracle, ctrl, [1])
    assert share == pytest.approx(27 / 30)
    assert 0.9 - 1e-9 <= low <= share <= high <= 0.9 + 1e-9  # both seeds recover 90%: no spread
    assert recovered(stale, oracle, ctrl, [0]) is None  # no loss to recover before the switch
