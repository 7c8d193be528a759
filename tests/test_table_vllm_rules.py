"""Our DraftTable agrees with vLLM's own validation and dense expansion (imports vLLM)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.errors import InputError
from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.profile import step_profile_from_csv
from tabletune.table import DraftTable

pytestmark = pytest.mark.slow
vllm_utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")

entries = st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40), st.integers(-1, 6)), min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(entries, st.integers(1, 50), st.integers(1, 6))
def test_same_acceptance_and_expansion_as_vllm(raw, max_batch, num_spec):
    ranges = [list(e) for e in raw]
    try:
        ours = DraftTable.from_ranges(ranges)
    except InputError:
        ours = None
    try:
        theirs = vllm_utils.build_dynamic_sd_schedule_lookup(ranges, max_batch, num_spec)
    except ValueError:
        theirs = None
    assert (ours is None) == (theirs is None), ranges
    if ours is not None:
        assert ours.dense(max_batch, num_spec) == theirs


def test_optimizer_tables_pass_vllm_rules(starter_8b, starter_32b):
    for path in (starter_8b, starter_32b):
        profile = step_profile_from_csv(path)
        for rates in ([0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5], [0.4, 0.3, 0.3, 0.2, 0.2, 0.1, 0.1]):
            r = optimize_table(profile, rates, OptimizeOptions())
            cfg = r.table.to_vllm(max(r.ks))
            dense = vllm_utils.build_dynamic_sd_schedule_lookup(
                cfg["num_speculative_tokens_per_batch_size"], profile.max_batch_size, cfg["num_speculative_tokens"])
            assert dense[1:] == [p.k for p in r.predictions]
