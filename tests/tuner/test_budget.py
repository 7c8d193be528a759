"""Will the tune fit: KV bytes by formula, the largest batch that fits per context, and a refusal with the numbers
only when not even one sequence fits."""

from __future__ import annotations

import pytest

from tabletune.errors import InputError
from tabletune.tuner.budget import GIB, MemoryPlan, kv_cache_bytes


def test_kv_bytes_hand_worked():
    # Qwen3-8B shape: 36 layers, 8 KV heads of 128, bf16; 257 slots of 1287 tokens
    assert kv_cache_bytes(36, 8, 128, 2, 257, 1287) == 2 * 36 * 8 * 128 * 2 * 257 * 1287


def test_a_memory_plan_says_what_it_needs_with_the_numbers():
    kv = int(40 * GIB)
    plan = MemoryPlan(free_bytes=int(60 * GIB), weights_bytes=0, kv_bytes=kv, workspace_bytes=int(4 * GIB), engines=2)
    text = plan.describe()
    assert plan.need_bytes == 2 * (kv + int(4 * GIB))
    assert "needs 88.0 GiB" in text and "KV 40.0 GiB x 2 engine(s)" in text and "60.0 GiB is free" in text


def test_the_weights_still_to_load_count():
    """KV and workspace fit the free memory; the weights to load tip it over."""
    plan = MemoryPlan(free_bytes=int(50 * GIB), weights_bytes=int(17 * GIB), kv_bytes=int(30 * GIB),
                      workspace_bytes=int(4 * GIB))
    assert plan.need_bytes == int(51 * GIB)
    assert "needs 51.0 GiB" in plan.describe() and "weights to load 17.0 GiB" in plan.describe()


def test_largest_batch_that_fits_hand_worked():
    from tabletune.tuner.budget import largest_batch

    # 100 free, 10 fixed, 7 a sequence and one spare slot: 10 + (b + 1) 7 <= 100 -> b = 11
    assert largest_batch(100, 10, 7, 256, extra_slots=1) == 11
    assert largest_batch(100, 10, 7, 8, extra_slots=1) == 8  # never above max_num_seqs
    assert largest_batch(16, 10, 7, 8, extra_slots=1) == 0  # not even one


def test_capped_grid_and_refusal():
    from tabletune.tuner.budget import BatchCap, capped_batch_sizes, check_caps

    assert capped_batch_sizes((1, 2, 4, 8, 16), 16) == (1, 2, 4, 8, 16)
    assert capped_batch_sizes((1, 2, 4, 8, 16), 6) == (1, 2, 4, 6)
    assert capped_batch_sizes((4, 8), 2) == (2,)
    check_caps([BatchCap(2048, 256, 256), BatchCap(32768, 3, 256, "x")])
    with pytest.raises(InputError) as err:
        check_caps([BatchCap(2048, 256, 256), BatchCap(32768, 0, 256, "256 sequences need 900 GiB")])
    assert "32768" in str(err.value) and "not even one sequence fits (256 sequences need 900 GiB)" in str(err.value)
