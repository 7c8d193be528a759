"""How long and where to measure: the ``TunePlan`` and the checks on a grid before any engine starts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tabletune.errors import InputError

ProgressFn = Callable[[str, float], None]  # (description, fraction of the plan done 0..1)


@dataclass(frozen=True)
class TunePlan:
    """How long to measure. Defaults finish the tiny demo grid in minutes."""

    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    steps_per_call: int = 4  # short calls: a point's samples spread over the whole batch size's time
    min_samples: int = 12
    target_spread: float = 0.05  # IQR / median at which a point is done
    point_budget_s: float = 4.0  # wall time one (b, k) point may use
    refine: bool = True
    acceptance_max_tokens: int = 128
    interference_tolerance: float | None = 0.3  # None: keep every sample
    recheck_passes: int = 2  # re-measure points slower than a point doing more work
    recheck_tolerance: float = 0.15
    close_call_margin: float = 0.05  # re-measure k within this goodput share of the best (0: off)
    close_call_windows: int = 2
    # a drafter whose measured draft rate q is below this (n-gram: it proposes only on a match) has its
    # yield measured at every k (``tabletune.tuner.yields``); 0: never
    yields_below_draft_rate: float = 0.95
    # f of ``cost.partial_draft_ms`` for such a drafter; None: fitted to the acceptance runs' steps (else 1)
    draft_share: float | None = None

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if not self.ks or min(self.ks) < 0:
            raise ValueError(f"k must be >= 0, got {self.ks}")
        if self.steps_per_call < 1 or self.min_samples < 1:
            raise ValueError("steps_per_call and min_samples must be >= 1")
        if self.point_budget_s <= 0 or self.target_spread <= 0:
            raise ValueError("point_budget_s and target_spread must be > 0")
        if self.close_call_margin < 0 or self.close_call_windows < 0:
            raise ValueError("close_call_margin and close_call_windows must be >= 0")
        share = 0.0 if self.draft_share is None else self.draft_share
        if not 0 <= self.yields_below_draft_rate <= 1 or not 0 <= share <= 1:
            raise ValueError("yields_below_draft_rate and draft_share must lie in [0, 1]")


def check_grid(batch_sizes: Sequence[int], k_max: int, max_batch_size: int, source: str = "--batch-sizes") -> None:
    """Bad grids fail before any engine starts."""
    if k_max < 1:
        raise InputError("--k-max", "k_max", k_max, "must be >= 1")
    if not batch_sizes:
        raise InputError(source, "batch_sizes", list(batch_sizes), "no batch size given")
    for b in batch_sizes:
        if b < 1:
            raise InputError(source, "batch_size", b, "must be >= 1")
        if b > max_batch_size:
            raise InputError(source, "batch_size", b, f"exceeds max_num_seqs={max_batch_size}")
