"""The one batch-bucket padding rule, shared by the engine, the tuner and table lookups.

An engine that replays CUDA graphs captures a graph for a few batch sizes (the
buckets) and runs a batch of b requests in the smallest bucket >= b; the extra
rows are padding. So the step time of b requests is the step time of
``bucket_for(b)``:

    bucket_for(b) = min { B in buckets : B >= b }

The default buckets are vLLM's capture sizes up to 256: 1, 2, 4, 8, then every
multiple of 8. ``geometric_batch_sizes`` gives the power-of-two sizes, the one
geometric grid in tabletune (the tuner measures it; engines may pad to it).
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


def geometric_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """(1, 2, 4, ..., max_batch_size): powers of two below the maximum, which is always included.

    The tuner's default measurement grid and the power-of-two padding buckets
    (fewer CUDA graphs than ``default_buckets``, more padding). Examples:
    64 -> (1, 2, 4, 8, 16, 32, 64); 48 -> (1, 2, 4, 8, 16, 32, 48); 1 -> (1,).
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


def bucket_for(batch_size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= batch_size (buckets sorted ascending)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    i = bisect.bisect_left(buckets, batch_size)
    if i == len(buckets):
        raise ValueError(f"batch_size {batch_size} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]
