"""The one batch-bucket padding rule, shared by the engine, the tuner and table lookups.

An engine that replays CUDA graphs captures a graph for a few batch sizes (the
buckets) and runs a batch of b requests in the smallest bucket >= b; the extra
rows are padding. So the step time of b requests is the step time of
``bucket_for(b)``:

    bucket_for(b) = min { B in buckets : B >= b }

The default buckets are vLLM's capture sizes up to 256: 1, 2, 4, 8, then every
multiple of 8.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

DEFAULT_MAX_BATCH = 256


def default_buckets(max_batch: int = DEFAULT_MAX_BATCH) -> list[int]:
    """[1, 2, 4, 8, 16, 24, ..., max_batch] (vLLM's cudagraph capture sizes), capped at max_batch."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sorted(set(sizes))


def power_of_two_buckets(max_batch: int = DEFAULT_MAX_BATCH) -> list[int]:
    """[1, 2, 4, ..., max_batch]: fewer graphs, more padding."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = []
    b = 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max_batch)
    return sizes


def bucket_for(batch_size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= batch_size (buckets sorted ascending)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    i = bisect.bisect_left(buckets, batch_size)
    if i == len(buckets):
        raise ValueError(f"batch_size {batch_size} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]
