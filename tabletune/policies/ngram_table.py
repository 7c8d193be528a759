"""The n-gram drafter's calibration table: match length x position -> conditional acceptance.

R[L, j-1] is the chance that the j-th token an n-gram drafter proposes is accepted,
given the suffix match has length L and tokens 1..j-1 were accepted (L = 0: no match,
nothing proposed). Built from a per-length rate r[L] by assuming each accepted copied
token lengthens the match by one, R[L, j] = r[L + j - 1]; or fit from logged n-gram
drafts (``python -m tabletune.policies.trace_fit ngram``). Used by Hybrid Spark's
market and by ``per_request.default_features`` as the n-gram drafter's confidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.errors import InputError

NGRAM_SCHEMA = "tabletune.ngram_table"


@dataclass(frozen=True)
class NgramTable:
    """R[L, j-1]: conditional acceptance of the n-gram draft's j-th token at match length L (0: none)."""

    rates: np.ndarray  # [l_max + 1, k_max]

    @classmethod
    def from_length_rates(cls, length_rates: Sequence[float], k_max: int) -> NgramTable:
        """R[L, j] = r[min(L + j - 1, l_max)] for L >= 1, R[0, :] = 0."""
        r = np.asarray(length_rates, dtype=float)
        l_max = len(r) - 1
        grid = np.arange(l_max + 1)[:, None] + np.arange(k_max)[None, :]
        table = r[np.minimum(grid, l_max)]
        table[0, :] = 0.0
        return cls(table)

    @classmethod
    def fit(cls, match_len: np.ndarray, position: np.ndarray, accepted: np.ndarray, prior: NgramTable,
            prior_weight: float = 20.0) -> NgramTable:
        """Per-cell rate from tested n-gram tokens, (acc + w R0) / (tested + w) around a prior table R0.

        Rows are tested tokens only (censoring: nothing after a draft's first rejection).
        """
        l_max, k_max = prior.rates.shape[0] - 1, prior.rates.shape[1]
        li = np.clip(np.asarray(match_len, dtype=np.int64), 0, l_max)
        ji = np.clip(np.asarray(position, dtype=np.int64) - 1, 0, k_max - 1)
        tested = np.zeros_like(prior.rates)
        acc = np.zeros_like(prior.rates)
        np.add.at(tested, (li, ji), 1.0)
        np.add.at(acc, (li, ji), np.asarray(accepted, dtype=float))
        return cls((acc + prior_weight * prior.rates) / (tested + prior_weight))

    def to_json(self) -> dict:
        return {"schema": NGRAM_SCHEMA, "version": 1, "rates": np.round(self.rates, 6).tolist()}

    @classmethod
    def load(cls, path: str | Path) -> NgramTable:
        """A table saved by ``python -m tabletune.policies.trace_fit ngram``."""
        obj = fileio.read_json(path)
        if not isinstance(obj, dict) or obj.get("schema") != NGRAM_SCHEMA:
            raise InputError(str(path), "schema", obj.get("schema") if isinstance(obj, dict) else obj,
                             f"expected {NGRAM_SCHEMA!r}")
        rates = np.asarray(obj.get("rates"), dtype=float)
        if rates.ndim != 2 or rates.size == 0 or not ((rates >= 0) & (rates <= 1)).all():
            raise InputError(str(path), "rates", obj.get("rates"), "must be a non-empty [L, k] table of rates in [0, 1]")
        return cls(rates)

    def survival(self, match_len: np.ndarray, num_proposed: np.ndarray, k_max: int) -> np.ndarray:
        """[b, k_max] S(i, j) = prod_{l<=j} R[L_i, l], 0 for j > num_proposed_i."""
        l_max, width = self.rates.shape[0] - 1, self.rates.shape[1]
        cols = np.minimum(np.arange(k_max), width - 1)  # positions past the table reuse its last column
        rows = self.rates[np.clip(np.asarray(match_len, dtype=np.int64), 0, l_max)][:, cols]
        surv = np.cumprod(rows, axis=1)
        surv[np.arange(1, k_max + 1)[None, :] > np.asarray(num_proposed)[:, None]] = 0.0
        return surv
