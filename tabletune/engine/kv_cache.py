"""Slot-per-request static KV cache: one row (slot) per running sequence.

``k[layer]`` and ``v[layer]`` are ``[num_slots, Hkv, max_len, D]``: a sequence's
keys for one KV head are contiguous, so attention streams them. The last slot is
scratch: padded rows of a batch bucket write there and nobody reads it.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype, device) -> None:
        shape = (num_layers, num_slots + 1, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_len = max_len

    @property
    def scratch_slot(self) -> int:
        return self.num_slots
