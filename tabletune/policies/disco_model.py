"""DISCO's stop classifier: the model, its training, its JSON file and the default model.

P(accepted | x) = sigmoid(w . (x - mu) / sigma + c) over the features ``FEATURES``
(the columns of issue 7's per-token traces). ``train_disco`` fits it with scikit-learn
on logged (features, accepted) pairs of tested tokens and picks the threshold tau on the
ROC curve of the fitted probabilities with transformers' cost (``roc_threshold``):

    tau* = argmin_tau  FPR(tau) + 3 * FNR(tau)

The model is saved as JSON coefficients, never a pickle; scoring needs only numpy.
``default_disco_model`` is the committed sim-trained model (``profiles/policies/disco-sim.json``,
written by ``python -m tabletune.sim.traces``: the simulator trains it, this module only scores).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.errors import InputError

FEATURES = ("top1_prob", "entropy", "margin", "position", "ngram_match_len")
DISCO_SCHEMA = "tabletune.disco_model"
DISCO_VERSION = 1
HF_FN_COST = 3.0  # transformers weighs a false negative 3x a false positive
DEFAULT_DISCO_MODEL = Path(__file__).resolve().parents[2] / "profiles" / "policies" / "disco-sim.json"


def roc_curve(labels: Sequence[int], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) for 'score >= threshold predicts label 1', thresholds descending.

    The first threshold is +inf (nothing predicted positive) and tied scores share a
    point, as in ``sklearn.metrics.roc_curve(drop_intermediate=False)``.
    """
    y = np.asarray(labels, dtype=float)
    s = np.asarray(scores, dtype=float)
    pos = y.sum()
    neg = len(y) - pos
    if len(y) == 0 or pos == 0 or neg == 0:
        raise ValueError("the ROC curve needs both labels")
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last_of_tie = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tps = np.cumsum(y)[last_of_tie]
    fps = (last_of_tie + 1) - tps
    return np.r_[0.0, fps / neg], np.r_[0.0, tps / pos], np.r_[np.inf, s[last_of_tie]]


def roc_threshold(labels: Sequence[int], scores: Sequence[float], fn_cost: float = HF_FN_COST) -> float:
    """theta* = argmin FPR + fn_cost * FNR over the ROC thresholds (first minimum wins)."""
    fpr, tpr, thresholds = roc_curve(labels, scores)
    return float(thresholds[int(np.argmin(fpr + fn_cost * (1.0 - tpr)))])


@dataclass(frozen=True)
class DiscoModel:
    """Logistic stop classifier: P(accepted | x) = sigmoid(w . (x - mu) / sigma + c)."""

    coef: tuple[float, ...]
    intercept: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    threshold: float
    features: tuple[str, ...] = FEATURES
    trained_on: str = ""

    def accept_prob(self, x: np.ndarray) -> np.ndarray:
        """P(accepted) for rows of x, shape [n, len(features)] (or one row)."""
        z = (np.asarray(x, dtype=float) - np.asarray(self.mean)) / np.asarray(self.scale)
        return 1.0 / (1.0 + np.exp(-(z @ np.asarray(self.coef) + self.intercept)))

    def keep_drafting(self, x: np.ndarray) -> bool:
        return bool(self.accept_prob(x) >= self.threshold)

    def to_json(self) -> dict:
        return {"schema": DISCO_SCHEMA, "version": DISCO_VERSION, "features": list(self.features),
                "coef": list(self.coef), "intercept": self.intercept, "mean": list(self.mean),
                "scale": list(self.scale), "threshold": self.threshold, "trained_on": self.trained_on}

    def save(self, path: str | Path) -> None:
        fileio.write_json(path, self.to_json())

    @classmethod
    def from_json(cls, obj: object, source: str = "<json>") -> DiscoModel:
        if not isinstance(obj, dict) or obj.get("schema") != DISCO_SCHEMA:
            raise InputError(source, "schema", obj.get("schema") if isinstance(obj, dict) else obj,
                             f"expected {DISCO_SCHEMA!r}")
        if obj.get("version") != DISCO_VERSION:
            raise InputError(source, "version", obj.get("version"), f"expected {DISCO_VERSION}")
        n = len(obj.get("features", []))
        for name in ("coef", "mean", "scale"):
            values = obj.get(name)
            if not isinstance(values, list) or len(values) != n:
                raise InputError(source, name, values, f"must be a list of {n} numbers")
        if any(float(s) <= 0 for s in obj["scale"]):
            raise InputError(source, "scale", obj["scale"], "must be > 0")
        return cls(coef=tuple(map(float, obj["coef"])), intercept=float(obj["intercept"]),
                   mean=tuple(map(float, obj["mean"])), scale=tuple(map(float, obj["scale"])),
                   threshold=float(obj["threshold"]), features=tuple(obj["features"]),
                   trained_on=str(obj.get("trained_on", "")))

    @classmethod
    def load(cls, path: str | Path) -> DiscoModel:
        return cls.from_json(fileio.read_json(path), source=str(path))


def train_disco(x: np.ndarray, accepted: np.ndarray, trained_on: str = "", fn_cost: float = HF_FN_COST) -> DiscoModel:
    """Fit the logistic stop classifier on logged (features, accepted) pairs (scikit-learn).

    x is [n, len(FEATURES)]; accepted is [n] in {0, 1}. Only tokens that were tested
    belong in the log (censoring: nothing after a draft's first rejection). tau is the
    ROC threshold of the fitted probabilities with the transformers cost (FPR + 3 FNR).
    """
    from sklearn.linear_model import LogisticRegression  # training only; scoring is numpy

    x = np.asarray(x, dtype=float)
    y = np.asarray(accepted, dtype=int)
    if x.ndim != 2 or len(x) != len(y) or len(set(y.tolist())) != 2:
        raise ValueError("train_disco needs an [n, d] feature array and labels with both classes")
    mean = x.mean(axis=0)
    scale = np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
    clf = LogisticRegression(C=1.0, max_iter=1000).fit((x - mean) / scale, y)
    model = DiscoModel(coef=tuple(map(float, clf.coef_[0])), intercept=float(clf.intercept_[0]),
                       mean=tuple(map(float, mean)), scale=tuple(map(float, scale)), threshold=0.5,
                       features=FEATURES[: x.shape[1]], trained_on=trained_on)
    tau = roc_threshold(y, model.accept_prob(x), fn_cost)
    return dataclasses.replace(model, threshold=float(min(tau, 1.0)))


@functools.lru_cache(maxsize=1)
def default_disco_model() -> DiscoModel:
    """The committed sim-trained model (loaded once)."""
    if not DEFAULT_DISCO_MODEL.exists():
        raise InputError(str(DEFAULT_DISCO_MODEL), "<file>", None,
                         f"missing: write it with `python -m tabletune.sim.traces --out {DEFAULT_DISCO_MODEL}`")
    return DiscoModel.load(DEFAULT_DISCO_MODEL)
