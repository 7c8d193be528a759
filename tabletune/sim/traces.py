"""Logged drafts from the simulator's acceptance model: (features, accepted) pairs for training stopping rules.

``draft_log(workload, num_drafts, k_max, seed)`` drafts ``k_max`` tokens for
``num_drafts`` fresh requests (one draft each) and returns the confidence features
of every position together with whether the target accepted it *given that it was
reached*. Position j is reached when positions < j were accepted (censoring); a
classifier of P(accept | reached, features) trains on the reached rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabletune.sim import acceptance as acc
from tabletune.sim.workload import Workload


@dataclass(frozen=True)
class DraftLog:
    top1_prob: np.ndarray  # [num_drafts, k_max]
    entropy: np.ndarray  # [num_drafts, k_max]
    margin: np.ndarray  # [num_drafts, k_max]
    position: np.ndarray  # [num_drafts, k_max] int, 1..k_max
    accepted: np.ndarray  # [num_drafts, k_max] bool, the token would be accepted
    reached: np.ndarray  # [num_drafts, k_max] bool, all earlier positions accepted

    def training_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(X [n, 4] = top1, entropy, margin, position; y [n]) over reached positions."""
        r = self.reached
        x = np.stack([self.top1_prob[r], self.entropy[r], self.margin[r], self.position[r]], axis=1)
        return x, self.accepted[r].astype(np.int64)


def draft_log(workload: Workload, num_drafts: int, k_max: int, seed: int = 0) -> DraftLog:
    rng = np.random.default_rng(seed)
    rates = workload.rates[:k_max]
    thetas = acc.calibrate_logits(rates, workload.heterogeneity)
    logits = acc.request_logits(thetas, workload.heterogeneity, num_drafts, rng)
    margin = acc.draw_margins(logits, rng)
    top1, entropy, margin12, _ = acc.confidence_features(margin, workload.signal_noise, rng)
    ok = margin > 0
    reached = np.concatenate([np.ones((num_drafts, 1), bool), np.cumprod(ok, axis=1)[:, :-1].astype(bool)], axis=1)
    position = np.broadcast_to(np.arange(1, len(rates) + 1), ok.shape).copy()
    return DraftLog(top1, entropy, margin12, position, ok, reached)
