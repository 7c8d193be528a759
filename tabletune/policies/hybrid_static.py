"""Hybrid-static: a row takes the n-gram chain when its lookup matches at least m tokens, else the model drafter.

A "-style" static baseline built from the descriptions of three serving hybrids that draft with two chains:

* vLLM's open n-gram + EAGLE hybrid (vllm-project/vllm #24344): rows whose prompt lookup matches take the
  n-gram proposals, the others EAGLE's; on InstructCoder its acceptance length was 2.82 against 1.95 for the
  n-gram drafter alone;
* SGLang's per-batch choice of suffix decoding, MTP or no speculation (sgl-project/sglang #27628);
* TensorRT-LLM's suffix-automaton hybrid (NVIDIA/TensorRT-LLM #11434).

Rule, per step, on the n-gram lookup that comes with the state before drafting (``BatchState.before_drafting``:
``ngram_match_len`` L_i and ``ngram_num_proposed`` P_i; no model signal is read, so nothing is peeked at):

    row i -> NGRAM, k_i = min(P_i, k_max)   if L_i >= m and P_i > 0
             MODEL, k_i = k_table(b)        otherwise

with k_table(b) the tuned table's k at the batch size b (``tabletune``, ``tuned_table.TunedTable``: the
goodput-optimal table of the offline profile and prior rates). A row on the n-gram chain takes no model draft and
verifies the lookup's proposal. Without a lookup (a drafter with no n-gram chain, or an n-gram default drafter) every
row takes the table's k on the default drafter: the tuned table alone. Nothing is learned online.

m: ``hybrid-static:m=3`` fixes it; without it m = 1 (every match takes the chain, as vLLM's hybrid does). The
benchmark harnesses (``benchmarks/policies_sim.py``, and through it ``benchmarks/engine_policies.py``) choose m
per workload on the calibration half of the prompts, as DISCO's threshold is chosen there: every m in 1..k_max
is simulated at a few loads on the calibration half, and ``choose_m`` takes the m with the largest mean share of
each load's best m (ties to the smaller m). An m above the lookup's longest match puts no row on the chain.

It reads the lookup (``uses_lookup``), so the engine and the simulator plan it before drafting, the lookup known
and its n-gram rows free of model drafting, as they do for ``controller:per-request``; it ends no draft early,
so nothing is read back between drafted positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.errors import InputError
from tabletune.policies.base import MODEL, NGRAM, BatchState, Decision, PolicyContext, StepOutcome
from tabletune.policies.tuned_table import TunedTable


@dataclass(frozen=True)
class Rows:
    """One step's split of the batch between the two chains."""

    ks: np.ndarray  # [batch_size] int, draft length per row
    drafter: np.ndarray  # [batch_size] int, MODEL or NGRAM


def split_rows(match_len: np.ndarray, num_proposed: np.ndarray, m: int, k_model: int, k_max: int) -> Rows:
    """Rows with L_i >= m and P_i > 0 on the n-gram chain at min(P_i, k_max); the others on the model at k_model."""
    match_len, num_proposed = np.asarray(match_len), np.asarray(num_proposed)
    on_ngram = (match_len >= m) & (num_proposed > 0)
    ks = np.where(on_ngram, np.minimum(num_proposed, k_max), k_model).astype(np.int64)
    return Rows(ks, np.where(on_ngram, NGRAM, MODEL).astype(np.int64))


@dataclass(frozen=True)
class MChoice:
    """The m chosen on calibration runs, with each candidate's score."""

    m: int
    candidates: tuple[int, ...]
    mean_share: tuple[float, ...]  # per candidate: mean over loads of tok/s / the load's best candidate's tok/s


def choose_m(candidates: Sequence[int], tok_s: np.ndarray) -> MChoice:
    """The m of ``candidates`` (ascending) whose calibration tok/s [len(candidates), loads] has the largest mean
    share of each load's best candidate; ties go to the smaller m."""
    tok_s = np.asarray(tok_s, dtype=float)
    if tok_s.ndim != 2 or tok_s.shape[0] != len(candidates) or tok_s.shape[1] == 0 or not (tok_s > 0).all():
        raise ValueError(f"need positive tok/s of shape [{len(candidates)}, loads], got {tok_s.tolist()}")
    if list(candidates) != sorted(set(candidates)):
        raise ValueError(f"candidates must be ascending and distinct, got {list(candidates)}")
    share = (tok_s / tok_s.max(axis=0, keepdims=True)).mean(axis=1)
    best = int(np.flatnonzero(share >= share.max() - 1e-12)[0])
    return MChoice(int(candidates[best]), tuple(int(c) for c in candidates), tuple(round(float(s), 4) for s in share))


class HybridStaticPolicy:
    """Match length >= m: the n-gram chain at its proposals; else the model drafter at the tuned table's k."""

    name: ClassVar[str] = "hybrid-static"
    uses_features: ClassVar[bool] = False
    uses_lookup: ClassVar[bool] = True  # plans before drafting on state.ngram_match_len / ngram_num_proposed

    def __init__(self, ctx: PolicyContext, m: int = 1) -> None:
        if not isinstance(m, int) or m < 1:
            raise InputError("--policy", "hybrid-static m", m, "must be an integer >= 1")
        self.ctx = ctx
        self.m = m
        self.label = f"hybrid-static:m={m}"
        self.table = TunedTable(ctx)
        self.two_chains = ctx.default_drafter == MODEL

    def decide(self, state: BatchState) -> Decision:
        k_model = self.table.k_for(state)
        if not self.two_chains or state.ngram_match_len is None or state.ngram_num_proposed is None:
            return Decision.batch(k_model)
        rows = split_rows(state.ngram_match_len, state.ngram_num_proposed, self.m, k_model, self.ctx.k_max)
        return Decision.per_request(rows.ks, rows.drafter)

    def observe(self, outcome: StepOutcome) -> None:
        return None
