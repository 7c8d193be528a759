import pytest

from tabletune.padding import bucket_for, default_buckets, power_of_two_buckets


def test_default_buckets_follow_vllm_capture_sizes():
    assert default_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert default_buckets(3) == [1, 2, 3]
    assert default_buckets(1) == [1]
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]


def test_power_of_two_buckets_end_at_max():
    assert power_of_two_buckets(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert power_of_two_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_bucket_for_is_smallest_bucket_at_least_b():
    buckets = [1, 2, 4, 8, 16, 24]
    assert [bucket_for(b, buckets) for b in (1, 2, 3, 5, 8, 9, 17, 24)] == [1, 2, 4, 8, 8, 16, 24, 24]


def test_bucket_for_rejects_out_of_range():
    with pytest.raises(ValueError):
        bucket_for(0, [1, 2])
    with pytest.raises(ValueError, match="exceeds"):
        bucket_for(3, [1, 2])
