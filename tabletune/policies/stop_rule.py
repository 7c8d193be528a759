"""A stop rule as numbers: what a device evaluates between drafted positions without asking the host.

``controller:per-request`` stops row i after drafted position j unless

    sum_{l<=j} log sigmoid(w x_il + c_l) > theta_j,    x_il = logit(top1_il),

that is S_ij a_{j+1} > R dT_{j+1}(b, cap) with theta_j = log(R dT_{j+1} / a_{j+1}) (``controller.per_request``).
Before the calibration's first fit w = 0 and c_l = logit(a_l), so S_ij is the estimator's
prod a_l. A row also stops at its cap. ``LogitStopRule`` holds (w, c, theta) for one step,
decided on the host before drafting; ``keep`` is the host's evaluation and the engine's device
evaluation (``tabletune.engine.device_stop``) computes the same float64 sums, so a draft loop
can run every position without a host sync between them (vLLM's adaptive verification keeps
its per-request split on the GPU for the same reason, #47808).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z_CLIP = 30.0  # |w x + c| clipped as in LogitCalibration
TOP1_CLIP = 1e-6


@dataclass(frozen=True)
class LogitStopRule:
    """One step's stop rule: slope w, intercepts c_1..c_K, thresholds theta_1..theta_K (module docstring).

    theta_j is the test after drafted position j (+inf: stop there, e.g. at the plan's cap)."""

    slope: float
    intercepts: tuple[float, ...]
    log_thresholds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.intercepts) != len(self.log_thresholds):
            raise ValueError(f"LogitStopRule: {len(self.intercepts)} intercepts, {len(self.log_thresholds)} thresholds")

    @property
    def k_max(self) -> int:
        return len(self.intercepts)

    def log_p(self, top1: np.ndarray, j: int) -> np.ndarray:
        """[rows] log p of drafted position j (1-based) from its top-1 probabilities [rows]."""
        q = np.clip(np.asarray(top1, np.float64), TOP1_CLIP, 1 - TOP1_CLIP)
        z = np.clip(self.slope * np.log(q / (1 - q)) + self.intercepts[j - 1], -Z_CLIP, Z_CLIP)
        return -np.log1p(np.exp(-z))

    def keep(self, top1: np.ndarray, j: int) -> np.ndarray:
        """[rows] True where a row that drafted positions 1..j (top1 [rows, >= j]) drafts j + 1."""
        if j >= self.k_max:
            return np.zeros(len(top1), bool)
        log_s = sum(self.log_p(top1[:, l - 1], l) for l in range(1, j + 1))
        return log_s > self.log_thresholds[j - 1]


def threshold(rate_per_ms: float, price_ms: float, next_rate: float) -> float:
    """theta = log(R dT / a_{j+1}); +inf when the next position is never accepted."""
    if next_rate <= 0:
        return float("inf")
    cost = rate_per_ms * price_ms / next_rate
    return float(np.log(cost)) if cost > 0 else float("-inf")
