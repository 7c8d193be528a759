"""The device memory a tune sizes its engines from, and gives them back to: the edge the tests fake.

``free_bytes()`` is what the device has free now; ``release()`` returns the memory of engines no
longer referenced (Python's collector first: an engine and its drafter point at each other, so
dropping the last reference does not free them by itself; then the allocator's cached blocks).
"""

from __future__ import annotations

import gc
from typing import Protocol

import torch


class DeviceMemory(Protocol):
    def free_bytes(self) -> int | None: ...  # None: no limit (every batch fits)

    def release(self) -> None: ...


class CudaMemory:
    """The current CUDA device: its free bytes (``torch.cuda.mem_get_info``), collector + ``empty_cache``."""

    def free_bytes(self) -> int:
        return torch.cuda.mem_get_info()[0]

    def release(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()


class FixedMemory:
    """A free size that does not change (``None``: the CPU, no limit); ``release`` runs the collector."""

    def __init__(self, free: int | None = None) -> None:
        self.free = free

    def free_bytes(self) -> int | None:
        return self.free

    def release(self) -> None:
        gc.collect()
