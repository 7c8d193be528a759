import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.errors import InputError
from tabletune.table import VLLM_DOCUMENTED_RANGES, DraftTable


def test_dense_hand_worked_gap_and_tail():
    t = DraftTable.from_ranges([[1, 4, 3], [8, 9, 1]])
    # gap 5..7 takes the previous k (3); beyond 9 the last k (1)
    assert t.dense(12) == [0, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1]
    assert [t.k_for(b) for b in (1, 4, 5, 7, 8, 9, 10, 1000)] == [3, 3, 3, 3, 1, 1, 1, 1]


def test_dense_clamps_to_num_speculative_tokens():
    t = DraftTable.from_ranges([[1, 2, 5], [3, 4, 1]])
    assert t.dense(4, num_speculative_tokens=3) == [0, 3, 3, 1, 1]


def test_dense_shorter_than_table():
    t = DraftTable.from_ranges(VLLM_DOCUMENTED_RANGES)
    assert t.dense(3) == [0, 5, 5, 5]
    assert t.dense(17)[16:] == [5, 4]


@pytest.mark.parametrize("ks, ranges", [
    ([2], [(1, 1, 2)]),
    ([3, 3, 1], [(1, 2, 3), (3, 3, 1)]),
    ([0, 1, 0], [(1, 1, 0), (2, 2, 1), (3, 3, 0)]),
])
def test_from_dense_boundaries(ks, ranges):
    assert DraftTable.from_dense(ks).ranges == tuple(ranges)


@pytest.mark.parametrize("ranges, problem", [
    ([[1, 4]], "triple"),
    ([[0, 4, 1]], "start_bs must be >= 1"),
    ([[1, 4, 1], [3, 8, 0]], "overlaps"),
    ([[2, 4, 1]], "first range must start at 1"),
    ([[1, 4, -1]], "k must be >= 0"),
    ([[1, 4, 2], [6, 5, 1]], "start_bs must be <= end_bs"),
    ([[1, 4, 9]], "exceeds num_speculative_tokens=4"),
    ([], "non-empty"),
    ([[1, 4, 1.5]], "integers"),
])
def test_validation_errors(ranges, problem):
    with pytest.raises(InputError, match=problem):
        DraftTable.from_ranges(ranges, num_speculative_tokens=4)


def test_vllm_and_trtllm_formats():
    t = DraftTable.from_ranges([[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, 512, 0]])
    assert t.to_vllm() == {"num_speculative_tokens": 4,
                           "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 8, 2], [9, 32, 1], [33, 512, 0]]}
    assert t.to_trtllm() == {"draft_len_schedule": {"4": 4, "8": 2, "32": 1}}


def test_load_table_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 64, 0]]}))
    assert DraftTable.load(p).ranges == ((1, 8, 3), (9, 64, 0))
    p.write_text(json.dumps({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 8, 3]]}))
    with pytest.raises(InputError, match=r"t.json: field 'num_speculative_tokens_per_batch_size\[0\]'"):
        DraftTable.load(p)


dense_tables = st.lists(st.integers(0, 7), min_size=1, max_size=80)


@given(dense_tables)
def test_dense_roundtrip(ks):
    t = DraftTable.from_dense(ks)
    assert t.dense(len(ks))[1:] == ks
    assert DraftTable.from_dense(t.dense(len(ks))[1:]) == t


@st.composite
def valid_ranges(draw):
    n = draw(st.integers(1, 8))
    out, start = [], 1
    for _ in range(n):
        start += draw(st.integers(0, 5)) if out else 0  # gaps allowed after the first
        end = start + draw(st.integers(0, 20))
        out.append([start, end, draw(st.integers(0, 7))])
        start = end + 1
    return out


@given(valid_ranges())
def test_any_valid_table_roundtrips(ranges):
    t = DraftTable.from_ranges(ranges)
    assert DraftTable.from_ranges(t.as_lists()) == t
    assert DraftTable.from_ranges(json.loads(json.dumps(t.to_vllm()))["num_speculative_tokens_per_batch_size"]) == t
    n = ranges[-1][1] + 3
    dense = t.dense(n)
    assert all(dense[b] == t.k_for(b) for b in range(1, n + 1))
    # the dense form compresses to a table with the same expansion
    assert DraftTable.from_dense(dense[1:]).dense(n) == dense


@given(st.binary(max_size=300))
def test_table_file_parser_never_crashes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fuzz") / "t.json"
    p.write_bytes(data)
    try:
        DraftTable.load(p)
    except InputError:
        pass
