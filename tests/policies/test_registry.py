import pytest

from helpers_batch import ctx
from tabletune.errors import InputError
from tabletune.policies import REGISTRY, make_policy, parse_options, resolve
from tabletune.policies.base import Policy


def test_parse_options():
    assert parse_options("a=1,b=0.5,c=x,d-e=2") == {"a": 1, "b": 0.5, "c": "x", "d_e": 2}
    assert parse_options(None) == {}
    with pytest.raises(InputError):
        parse_options("a")


@pytest.mark.parametrize("name", ["fixed:2", "off", "documented", "documented-div4", "tabletune", "controller",
                                  "turbospec", "nightjar", "sglang", "sglang:strategy=throughput"])
def test_batch_policies_build_and_satisfy_the_protocol(name):
    p = make_policy(name, ctx())
    assert isinstance(p, Policy)


def test_every_registered_name_resolves_or_says_why():
    for name in REGISTRY:
        try:
            resolve(name)
        except InputError as exc:
            assert "not available" in str(exc)


def test_unknown_name_and_bad_options():
    with pytest.raises(InputError, match="unknown policy"):
        make_policy("magic", ctx())
    with pytest.raises(InputError):
        make_policy("nightjar:bogus=1", ctx())
