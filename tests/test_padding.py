import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.padding import bucket_for, default_buckets, geometric_batch_sizes


def test_default_buckets_follow_vllm_capture_sizes():
    assert default_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert default_buckets(3) == [1, 2, 3]
    assert default_buckets(1) == [1]
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]


def test_geometric_batch_sizes_end_at_max():
    assert geometric_batch_sizes(1) == (1,)
    assert geometric_batch_sizes(2) == (1, 2)
    assert geometric_batch_sizes(3) == (1, 2, 3)
    assert geometric_batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert geometric_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert geometric_batch_sizes(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)


def test_geometric_batch_sizes_rejects_zero():
    with pytest.raises(ValueError, match="got 0"):
        geometric_batch_sizes(0)


@given(st.integers(min_value=1, max_value=10_000))
def test_geometric_batch_sizes_properties(max_batch_size):
    sizes = geometric_batch_sizes(max_batch_size)
    assert sizes[0] == 1 and sizes[-1] == max_batch_size
    assert list(sizes) == sorted(set(sizes))
    assert all(b == 2 ** i for i, b in enumerate(sizes[:-1]))  # powers of two, then the maximum
    assert all(hi <= 2 * lo for lo, hi in zip(sizes, sizes[1:]))  # no gap wider than doubling


def test_bucket_for_is_smallest_bucket_at_least_b():
    buckets = [1, 2, 4, 8, 16, 24]
    assert [bucket_for(b, buckets) for b in (1, 2, 3, 5, 8, 9, 17, 24)] == [1, 2, 4, 8, 8, 16, 24, 24]


def test_bucket_for_rejects_out_of_range():
    with pytest.raises(ValueError):
        bucket_for(0, [1, 2])
    with pytest.raises(ValueError, match="exceeds"):
        bucket_for(3, [1, 2])
