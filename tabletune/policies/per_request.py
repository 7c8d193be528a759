"""Helpers shared by the per-request policies (DISCO, TapOut, DSDE, GammaTune, DSpark, Hybrid Spark).

* ``first_stop``: a token-by-token stop rule as a per-request length. keep[i, j-1] says
  whether request i keeps drafting after drafted position j; the length is the first j
  whose test fails (that token is still verified) or k_max if none fails:

      k_i = min{ j : not keep[i, j-1] }   (k_max if keep[i, :] is all true)

  Position j's decision uses only column j-1, so the rule is causal.
* ``tested_mask``: which drafted positions the target actually tested. A draft of k with
  m accepted tested positions 1..min(m+1, k); later ones are censored.
* ``feature_tensor``: the model drafter's per-token features in the column order of
  ``tabletune.policies.disco_model.FEATURES``.
* ``default_features``: the confidence signals of the setting's default drafter. For
  the model drafter they are the engine's ``DraftFeatures``. An n-gram drafter has no
  probabilities, so its confidence at position j is the calibration table's conditional
  acceptance p_ij = R[L_i, j] (``ngram_table.NgramTable``, from ``ctx.ngram_rates``;
  0 past the tokens it proposes), with entropy H(p) = -p ln p - (1-p) ln(1-p) and
  top-1/top-2 margin max(2p - 1, 0), as if the proposal were a two-way choice.
* ``feature_column`` / ``features_upto``: one drafted position's features, and the
  signals of the positions drafted so far (what ``DraftStop.keep_drafting`` is given).
* ``PerRequest``: a dict of per-request state that forgets finished requests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from tabletune.policies.base import NGRAM, BatchState, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.ngram_table import NgramTable

T = TypeVar("T")


def first_stop(keep: np.ndarray) -> np.ndarray:
    """[batch_size] lengths from a [batch_size, k_max] keep-drafting matrix (see module docstring)."""
    k_max = keep.shape[1]
    if k_max == 0:
        return np.zeros(keep.shape[0], np.int64)
    return np.where(keep.all(axis=1), k_max, np.argmin(keep, axis=1) + 1).astype(np.int64)


def tested_mask(ks: np.ndarray, accepted: np.ndarray, k_max: int) -> np.ndarray:
    """[batch_size, k_max] True at the positions the target tested: j <= min(m + 1, k)."""
    reach = np.minimum(np.asarray(accepted) + 1, np.asarray(ks))
    return np.arange(1, k_max + 1)[None, :] <= reach[:, None]


def accepted_mask(accepted: np.ndarray, k_max: int) -> np.ndarray:
    """[batch_size, k_max] True at the accepted positions: j <= m."""
    return np.arange(1, k_max + 1)[None, :] <= np.asarray(accepted)[:, None]


def feature_tensor(f: DraftFeatures) -> np.ndarray:
    """[batch_size, k_max, 5]: top1_prob, entropy, margin, position j, n-gram match length."""
    b, k_max = f.top1_prob.shape
    position = np.broadcast_to(np.arange(1, k_max + 1, dtype=float)[None, :], (b, k_max))
    match = np.broadcast_to(np.asarray(f.ngram_match_len, dtype=float)[:, None], (b, k_max))
    return np.stack([f.top1_prob, f.entropy, f.margin, position, match], axis=2)


def feature_column(f: DraftFeatures, j: int) -> np.ndarray:
    """[batch_size, 5]: the ``feature_tensor`` row of drafted position j (column j - 1) alone."""
    b = f.top1_prob.shape[0]
    return np.stack([f.top1_prob[:, j - 1], f.entropy[:, j - 1], f.margin[:, j - 1], np.full(b, float(j)),
                     np.asarray(f.ngram_match_len, dtype=float)], axis=1)


def features_upto(f: DraftFeatures, j: int) -> DraftFeatures:
    """The signals of positions 1..j only (what a drafter has produced after drafting position j)."""
    return DraftFeatures(f.top1_prob[:, :j], f.entropy[:, :j], f.margin[:, :j], f.ngram_match_len,
                         f.ngram_num_proposed)


def require_features(features: DraftFeatures | None, policy: str) -> DraftFeatures:
    if features is None:
        raise ValueError(f"policy {policy} needs draft features; the engine must fill BatchState.features")
    return features


def default_features(state: BatchState, ctx: PolicyContext, policy: str) -> DraftFeatures:
    """The default drafter's signals (module docstring): the engine's for MODEL, the table's for NGRAM."""
    return drafter_features(require_features(state.features, policy), ctx)


def drafter_features(f: DraftFeatures, ctx: PolicyContext) -> DraftFeatures:
    """``default_features`` of given model-drafter features (the engine's, or the columns drafted so far)."""
    if ctx.default_drafter != NGRAM:
        return f
    k_max = f.top1_prob.shape[1]
    rates = _ngram_table(ctx.ngram_rates or (0.0,), k_max)
    l_max = rates.shape[0] - 1
    p = rates[np.clip(np.asarray(f.ngram_match_len, dtype=np.int64), 0, l_max)]
    p[np.arange(1, k_max + 1)[None, :] > np.asarray(f.ngram_num_proposed)[:, None]] = 0.0
    q = np.clip(p, 1e-9, 1 - 1e-9)
    entropy = -q * np.log(q) - (1 - q) * np.log(1 - q)
    return DraftFeatures(p, entropy, np.maximum(2 * p - 1, 0.0), f.ngram_match_len, f.ngram_num_proposed)


@functools.lru_cache(maxsize=16)
def _ngram_table(length_rates: tuple[float, ...], k_max: int) -> np.ndarray:
    return NgramTable.from_length_rates(length_rates, k_max).rates


class PerRequest(Generic[T]):
    """Per-request state created on first use and dropped when the request finishes."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self.factory = factory
        self.items: dict[int, T] = {}

    def get(self, request_id: int) -> T:
        rid = int(request_id)
        item = self.items.get(rid)
        if item is None:
            item = self.items[rid] = self.factory()
        return item

    def forget(self, outcome: StepOutcome) -> None:
        for rid in outcome.finished_ids.tolist():
            self.items.pop(int(rid), None)

    def __len__(self) -> int:
        return len(self.items)
