"""Step cost: T(b, k) from a measured profile, and how a step with mixed draft lengths is costed.

A uniform step (every request drafts k) costs the profile's T(b, k), linear in b
between measured batch sizes (``StepProfile.step_ms``). A step whose requests draft
different lengths k_1..k_b is costed as

    T(b, k_1..k_b) = T(b, 0) + f * (T~(b, k_max) - T(b, 0)) + (1 - f) * (T~(b, k_bar) - T(b, 0))

with k_max = max_i k_i (the drafter runs k_max sequential steps for the whole batch),
k_bar = sum_i k_i / b (the target verifies sum_i (k_i + 1) tokens), T~(b, x) the
profile linear in x between measured k, and f = ``draft_share`` the share of the
per-k cost that is drafting (paid for the longest draft) rather than verification
(paid per verified token). With all k_i equal this is exactly T(b, k). f = 0 costs a
step by its total verified tokens only; f = 1 charges every request the longest draft.
An n-gram drafter runs on the CPU, so its settings use f = 0.

``budget_ms(b, slots)`` is T for a batch-wide budget of verified draft slots,
T(b, slots / b) with f = 0; adaptive verification (DSpark-style) prices budgets with it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from tabletune.profile import StepProfile


@dataclass(frozen=True)
class StepCost:
    """Offline step times T(b, k) plus the mixed-length rule above. Immutable and cheap to query."""

    profile: StepProfile
    draft_share: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.draft_share <= 1.0:
            raise ValueError(f"draft_share must lie in [0, 1], got {self.draft_share}")
        ks = self.profile.ks
        bs = self.profile.batch_sizes
        # grid[ki, bi] = T(bs[bi], ks[ki]); a k missing at some b is interpolated in b
        grid = np.array([[self.profile.step_ms(b, k) for b in bs] for k in ks], dtype=float)
        object.__setattr__(self, "_ks", np.array(ks, dtype=float))
        object.__setattr__(self, "_bs", np.array(bs, dtype=float))
        object.__setattr__(self, "_grid", grid)
        object.__setattr__(self, "_cache", {})

    @property
    def ks(self) -> list[int]:
        """The measured draft lengths."""
        return self.profile.ks

    @property
    def k_max(self) -> int:
        return int(self._ks[-1])  # type: ignore[attr-defined]

    def row(self, batch_size: float) -> np.ndarray:
        """T(b, k) for every measured k (same order as ``ks``), linear in b; cached per b."""
        cache = self._cache  # type: ignore[attr-defined]
        out = cache.get(batch_size)
        if out is None:
            bs, grid = self._bs, self._grid  # type: ignore[attr-defined]
            out = np.array([np.interp(batch_size, bs, g) for g in grid])
            if len(cache) < 4096:
                cache[batch_size] = out
        return out

    def step_ms(self, batch_size: float, k: float) -> float:
        """T(b, k); a non-integer k is linear between the neighbouring measured k."""
        row = self.row(batch_size)
        ks = self._ks  # type: ignore[attr-defined]
        if k <= ks[0]:
            return float(row[0])
        if k >= ks[-1]:
            return float(row[-1])
        i = bisect.bisect_left(ks.tolist(), k)
        if ks[i] == k:
            return float(row[i])
        w = (k - ks[i - 1]) / (ks[i] - ks[i - 1])
        return float(row[i - 1] + w * (row[i] - row[i - 1]))

    def mixed_ms(self, ks: np.ndarray) -> float:
        """T(b, k_1..k_b) by the rule in the module docstring; ks is [batch_size] ints."""
        b = len(ks)
        if b == 0:
            return 0.0
        k_top = int(ks.max())
        k_bar = float(ks.sum()) / b
        if k_bar == k_top:
            return self.step_ms(b, k_top)
        t0 = self.step_ms(b, 0)
        f = self.draft_share
        return t0 + f * (self.step_ms(b, k_top) - t0) + (1.0 - f) * (self.step_ms(b, k_bar) - t0)

    def budget_ms(self, batch_size: int, slots: float) -> float:
        """T(budget): a step verifying ``slots`` draft tokens in total over the batch, T(b, slots/b)."""
        return self.step_ms(batch_size, slots / batch_size if batch_size else 0.0)
