"""Logged drafts from the simulator's acceptance model: (features, accepted) pairs for training stopping rules.

``draft_log(workload, num_drafts, k_max, seed)`` drafts ``k_max`` tokens for
``num_drafts`` fresh requests (one draft each) and returns the confidence features
of every position together with whether the target accepted it *given that it was
reached*. Position j is reached when positions < j were accepted (censoring); a
classifier of P(accept | reached, features) trains on the reached rows only.

``sim_rows`` pools such logs over the workload presets; DISCO's default classifier is trained on them
(writes atomically)::

    python -m tabletune.sim.traces --out profiles/policies/disco-sim.json
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from tabletune.policies.disco_model import train_disco
from tabletune.sim import acceptance as acc
from tabletune.sim.workload import Workload, preset

SIM_WORKLOADS = ("code", "math", "chat", "code-edit")  # "general text" for a classifier trained on the simulator


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


def sim_rows(k_max: int = 7, drafts_per_workload: int = 5000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x [n, 4] = top1, entropy, margin, position; y [n]) from the simulator, pooled over SIM_WORKLOADS."""
    xs, ys = [], []
    for i, name in enumerate(SIM_WORKLOADS):
        x, y = draft_log(preset(name), drafts_per_workload, k_max, seed=seed + i).training_rows()
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


# ---- calibration of the confidence signal against measured per-token traces ---------------


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC by the rank (Mann-Whitney) formula; ties get average ranks."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs both accepted and rejected tokens")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def trace_top1_auc(path: str) -> tuple[float, int]:
    """(AUC of top1_prob for acceptance, rows) from an issue-7 trace CSV(.gz) with top1_prob, accepted."""
    import csv
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:  # type: ignore[operator]
        rows = [r for r in csv.DictReader(fh) if r.get("top1_prob")]
    top1 = np.array([float(r["top1_prob"]) for r in rows])
    accepted = np.array([int(r["accepted"]) for r in rows])
    return auc(top1, accepted), len(rows)


def signal_noise_for_auc(target_auc: float, workload: Workload, k_max: int = 7, num_drafts: int = 4000,
                         seed: int = 0) -> float:
    """The signal noise tau whose simulated top-1 AUC (reached positions) equals target_auc (bisection)."""
    import dataclasses

    lo, hi = 0.05, 8.0  # AUC falls as tau grows
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        x, y = draft_log(dataclasses.replace(workload, signal_noise=mid), num_drafts, k_max, seed).training_rows()
        if auc(x[:, 0], y) > target_auc:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tabletune.sim.traces",
                                 description="DISCO's classifier trained on the simulator's drafts (sim_rows)")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    x, y = sim_rows(args.k_max)
    model = train_disco(x, y, trained_on="sim presets " + ",".join(SIM_WORKLOADS))
    model.save(args.out)
    print(f"wrote {args.out}: coef {np.round(model.coef, 3).tolist()} threshold {model.threshold:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
