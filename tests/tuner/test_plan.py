"""The plan's checks: bad grids fail before any engine starts."""

import pytest

from tabletune.errors import InputError
from tabletune.tuner import Engine, TunePlan, check_grid

from tuner_fakes import FakeEngine


def test_fake_engine_satisfies_protocol():
    assert isinstance(FakeEngine(), Engine)


def test_check_grid_rejects_batch_above_max_num_seqs():
    check_grid([1, 64], 4, 64)
    with pytest.raises(InputError, match="exceeds max_num_seqs=64"):
        check_grid([1, 128], 4, 64)
    with pytest.raises(InputError, match="k_max"):
        check_grid([1], 0, 64)
    with pytest.raises(InputError, match="no batch size"):
        check_grid([], 2, 64)


@pytest.mark.parametrize("kwargs, text", [
    (dict(batch_sizes=(), ks=(0, 1)), "batch sizes"),
    (dict(batch_sizes=(1,), ks=(-1, 1)), "k must be >= 0"),
    (dict(batch_sizes=(1,), ks=(0,), point_budget_s=0), "point_budget_s"),
    (dict(batch_sizes=(1,), ks=(0,), close_call_margin=-0.1), "close_call_margin"),
])
def test_plan_rejects_bad_values(kwargs, text):
    with pytest.raises(ValueError, match=text):
        TunePlan(**kwargs)
