"""Will the tune fit: KV bytes by formula, and a refusal with the numbers before anything is allocated."""

from __future__ import annotations

import pytest

from tabletune.errors import InputError
from tabletune.tuner.budget import GIB, MemoryPlan, check_memory, kv_cache_bytes


def test_kv_bytes_hand_worked():
    # Qwen3-8B shape: 36 layers, 8 KV heads of 128, bf16; 257 slots of 1287 tokens
    assert kv_cache_bytes(36, 8, 128, 2, 257, 1287) == 2 * 36 * 8 * 128 * 2 * 257 * 1287


def test_refuses_with_the_numbers_when_it_will_not_fit():
    kv = int(40 * GIB)
    plan = MemoryPlan(free_bytes=int(60 * GIB), weights_bytes=0, kv_bytes=kv, workspace_bytes=int(4 * GIB), engines=2)
    with pytest.raises(InputError) as err:
        check_memory(plan)
    text = str(err.value)
    assert "needs 88.0 GiB" in text and "KV 40.0 GiB x 2 engine(s)" in text and "60.0 GiB is free" in text
    check_memory(MemoryPlan(free_bytes=int(60 * GIB), weights_bytes=0, kv_bytes=kv, workspace_bytes=int(4 * GIB)))


def test_the_weights_still_to_load_count():
    """KV and workspace fit the free memory; the weights to load tip it over."""
    plan = MemoryPlan(free_bytes=int(50 * GIB), weights_bytes=int(16 * GIB), kv_bytes=int(30 * GIB),
                      workspace_bytes=int(4 * GIB))
    assert plan.need_bytes == int(50 * GIB)
    check_memory(plan)
    heavier = MemoryPlan(free_bytes=int(50 * GIB), weights_bytes=int(17 * GIB), kv_bytes=int(30 * GIB),
                         workspace_bytes=int(4 * GIB))
    with pytest.raises(InputError) as err:
        check_memory(heavier)
    assert "needs 51.0 GiB" in str(err.value) and "weights to load 17.0 GiB" in str(err.value)


def test_refusal_names_the_flag_and_is_one_line():
    plan = MemoryPlan(free_bytes=int(8 * GIB), weights_bytes=0, kv_bytes=int(8 * GIB), workspace_bytes=int(4 * GIB),
                      already_allocated_bytes=int(16 * GIB))
    with pytest.raises(InputError) as err:
        check_memory(plan)
    text = str(err.value)
    assert "\n" not in text and "--max-num-seqs" in text and "after 16.0 GiB of weights" in text
