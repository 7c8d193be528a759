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
