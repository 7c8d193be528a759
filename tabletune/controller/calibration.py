"""Signal calibration: p(accepted) from a drafter's top-1 probability, fitted online on verified outcomes.

p_j(x) = sigmoid(w x + c_j) with x = logit(top1): one slope w and one intercept c_j per draft
position j, the form vLLM's acceptance estimator uses (PR #52228, feature logit(max q)).
Fitted by damped Newton steps on the log-likelihood with a unit ridge penalty, of the last ``memory``
tested tokens (a ring buffer), so it follows a workload that changes; ``clear`` drops the
buffer (a detected workload shift) and keeps the coefficients until the next fit. Only
tokens the target tested may be added (censoring: nothing after a draft's first rejection).
No torch, no vllm.
"""

from __future__ import annotations

import numpy as np


class LogitCalibration:
    """p_j(x) = sigmoid(w x + c_j), x = logit(top1): one slope, one intercept per position (module docstring, 2)."""

    def __init__(self, k_max: int, memory: int = 20_000, ridge: float = 1.0) -> None:
        self.k_max, self.memory, self.ridge = k_max, memory, ridge
        self.coef = np.concatenate([[1.0], np.zeros(k_max)])  # [w, c_1..c_k_max]
        self.x = np.zeros(memory)
        self.pos = np.zeros(memory, np.int64)
        self.y = np.zeros(memory)
        self.size = 0
        self.head = 0
        self.fits = 0  # refits that had enough tokens

    @staticmethod
    def feature(top1: np.ndarray) -> np.ndarray:
        q = np.clip(top1, 1e-6, 1 - 1e-6)
        return np.log(q / (1 - q))

    def __call__(self, top1: np.ndarray) -> np.ndarray:
        """[batch_size, k_max] acceptance probabilities for top1 [batch_size, k_max]."""
        z = self.coef[0] * self.feature(top1) + self.coef[1:1 + top1.shape[1]][None, :]
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))

    def add(self, top1: np.ndarray, position: np.ndarray, accepted: np.ndarray) -> None:
        """Append tested tokens (ring buffer of ``memory``)."""
        n = len(top1)
        if n == 0:
            return
        idx = (self.head + np.arange(n)) % self.memory
        self.x[idx], self.pos[idx], self.y[idx] = self.feature(top1), position, accepted
        self.head = int((self.head + n) % self.memory)
        self.size = min(self.size + n, self.memory)

    def refit(self, iterations: int = 8) -> None:
        """Newton steps on the ridge-penalised log-likelihood of the buffered tokens."""
        if self.size < 10:
            return
        x, pos, y = self.x[: self.size], self.pos[: self.size], self.y[: self.size]
        design = np.zeros((self.size, 1 + self.k_max))
        design[:, 0] = x
        design[np.arange(self.size), 1 + pos] = 1.0
        coef = self.coef.copy()
        penalty = self.ridge * np.eye(1 + self.k_max)
        for _ in range(iterations):
            p = 1.0 / (1.0 + np.exp(-np.clip(design @ coef, -30.0, 30.0)))
            grad = design.T @ (y - p) - penalty @ coef
            hess = (design * (p * (1 - p))[:, None]).T @ design + penalty
            step = np.linalg.solve(hess, grad)
            coef = coef + step / max(1.0, float(np.abs(step).max()))  # damped: at most 1 per coefficient
        self.coef = coef
        self.fits += 1

    def clear(self) -> None:
        """Forget the buffered tokens (keep the fitted coefficients)."""
        self.size = 0
        self.head = 0
