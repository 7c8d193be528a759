import pytest

from helpers_batch import ctx, outcome, state
from tabletune.errors import InputError
from tabletune.policies import make_policy


def test_fixed_k_every_step_and_off():
    c = ctx()
    p = make_policy("fixed:3", c)
    for b in (1, 50, 128):
        d = p.decide(state(b))
        assert d.k == 3 and d.ks_for(b).tolist() == [3] * b
        p.observe(outcome(state(b), [3] * b, [0] * b))
    assert make_policy("off", c).decide(state(7)).k == 0


@pytest.mark.parametrize("spec", ["fixed", "fixed:", "fixed:x", "fixed:-1", "fixed:9", "off:2"])
def test_bad_specs(spec):
    with pytest.raises(InputError):
        make_policy(spec, ctx())
