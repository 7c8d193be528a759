import json

import pytest

from helpers_batch import ctx, state
from tabletune.errors import InputError
from tabletune.policies import make_policy


def test_documented_table_lookup():
    p = make_policy("documented", ctx())
    got = {b: p.decide(state(b)).k for b in (1, 16, 17, 32, 33, 64, 65, 128)}
    assert got == {1: 5, 16: 5, 17: 4, 32: 4, 33: 3, 64: 3, 65: 1, 128: 1}


def test_documented_div4():
    p = make_policy("documented-div4", ctx())
    assert [p.decide(state(b)).k for b in (4, 5, 8, 9, 16, 17, 32, 33)] == [5, 4, 4, 3, 3, 1, 1, 0]


def test_table_k_is_clamped_to_the_allowed_ks():
    # rates known for 3 positions only: ks 0..3, so the documented k=5 becomes 3
    p = make_policy("documented", ctx(rates=(0.8, 0.7, 0.6)))
    assert p.decide(state(1)).k == 3


def test_table_file_and_errors(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 512, 2]]}))
    p = make_policy(f"table:{f}", ctx())
    assert p.decide(state(8)).k == 4 and p.decide(state(9)).k == 2 and p.decide(state(500)).k == 2
    bad = tmp_path / "bad.json"
    bad.write_text("[[2, 8, 4]]")
    with pytest.raises(InputError, match="first range must start at 1"):
        make_policy(f"table:{bad}", ctx())
    with pytest.raises(InputError):
        make_policy("table", ctx())
