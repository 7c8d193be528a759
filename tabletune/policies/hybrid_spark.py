"""Hybrid Spark-style: a model drafter and an n-gram drafter every step; each request buys the better chain.

Source: the "Spark" hybrid-drafting idea named in the issue; its paper is not public in
detail, so this "-style" version assumes the following market rule.

Both drafters propose every step. Request i's two chains c in {model, n-gram} have
survivals S_c(i, j) = P(first j tokens of chain c accepted):

* model chain: prod_{l<=j} cal(top1_il), the online confidence calibration of
  adaptive verification (``ConfidenceCalibrator``);
* n-gram chain: prod_{l<=j} R[L_i, l] for j <= the tokens it proposes (0 beyond),
  with R the calibration table "match length x position -> acceptance", fit once on
  general text (``NgramTable``): from issue 7's n-gram traces when given
  (``hybrid-spark:ngram_table=FILE``, written by ``python -m tabletune.policies.trace_fit
  ngram``), else from the per-length table of the context (``ctx.ngram_rates``) by
  assuming each accepted copied token lengthens the suffix match by one:
  R[L, j] = r[L + j - 1].

Price. A verified draft slot costs step time that would earn tokens elsewhere in the
batch, so its price in tokens is

    lambda = R * dV/dslot,    R = the batch's running decode rate (tokens per ms,
                              EMA of tokens over EMA of step time),
    dV/dslot = (V(b, k_bar + 1) - V(b, k_bar - 1)) / (2 b)   (>= 0; a two-sided secant
                                                            smooths odd/even kinks of V)

with V = T - D the verification time (``tabletune.cost``): the model drafter runs every row to
k_max each step (its signals price the chains), so drafting is a fixed D(b, k_max) and a slot
costs only its verification.

Each request takes, per chain, the slots worth their price, j*_c = #{j : S_c(j) > lambda}
(S falls along j), and the chain with the larger surplus sum_{j<=j*_c} (S_c(j) - lambda);
a request with no slot worth its price verifies nothing. The market runs under each
length cap c = 1..k_max (only slots j <= c for sale). Per cap the candidates are: every slot (price 0; a kink of T such as
a cheap odd k can favour it), then lambda at k_bar = c / 2, then ``ROUNDS - 1`` rounds of
lambda at the last allocation's k_bar. Of all candidates, the one with the largest
step surplus

    E[tokens] - R * T(ks),   T(ks) = V~(b, k_bar) + D~(b, k_max)   (``tabletune.cost``)

over all caps and rounds is used. Using the running rate R, not the step's own ratio
E / T, is what maximises long-run throughput sum(E) / sum(T) (Dinkelbach): a step's
own ratio would favour cheap short steps even when a longer one earns more than its
time is worth. (Adaptive verification keeps the issue's per-step Theta rule.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.cost import StepCost
from tabletune.policies.adaptive_verification import ConfidenceCalibrator, update_calibrator
from tabletune.policies.base import MODEL, NGRAM, BatchState, Decision, PolicyContext, StepOutcome
from tabletune.policies.ngram_table import NgramTable
from tabletune.policies.per_request import require_features

ROUNDS = 3


@dataclass(frozen=True)
class Choice:
    ks: np.ndarray  # [b] slots bought
    drafter: np.ndarray  # [b] MODEL or NGRAM
    expected_tokens: float  # b + sum of the bought survivals
    step_ms: float
    price: float  # lambda, tokens per slot

    @property
    def theta(self) -> float:
        return self.expected_tokens / self.step_ms

    def surplus(self, rate: float) -> float:
        """E[tokens] - R * T: tokens beyond what the step's time earns at the running rate R."""
        return self.expected_tokens - rate * self.step_ms


def buy(surv_model: np.ndarray, surv_ngram: np.ndarray, price: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: slots worth the price on each chain and the chain with the larger surplus.

    Returns (ks, drafter, bought survival sum) per request; ties go to the model chain.
    """
    k_max = surv_model.shape[1]
    ks, use_ng, tokens = _choose(surv_model, surv_ngram, np.array([price]), np.array([k_max]))
    return ks[0].astype(np.int64), np.where(use_ng[0], NGRAM, MODEL).astype(np.int64), tokens[0]


def _choose(surv_model: np.ndarray, surv_ngram: np.ndarray, prices: np.ndarray,
            caps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each (price, cap) pair c: ks, use-n-gram and bought survival per request, each [len(caps), b].

    j*_c = min(#{j : S_j > price}, cap) slots per chain (S falls along j); the chain with the
    larger surplus sum_{j<=j*} S_j - price j* wins.
    """
    return _choose_from(_chains(surv_model, surv_ngram), prices, caps)


def _chains(surv_model: np.ndarray, surv_ngram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(survivals [2, b, k_max], their prefix sums flattened [2 * b * (k_max + 1)]) of the two chains."""
    surv = np.stack([surv_model, surv_ngram])  # [2, b, k_max]
    chains, b, k_max = surv.shape
    cum = np.zeros((chains, b, k_max + 1))  # cum[., ., j] = S_1 + ... + S_j
    np.cumsum(surv, axis=2, out=cum[:, :, 1:])
    return surv, cum.ravel()


def _choose_from(chains: tuple[np.ndarray, np.ndarray], prices: np.ndarray,
                 caps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    surv, cum = chains
    n, b, k_max = surv.shape
    j = np.minimum((surv[:, None, :, :] > prices[None, :, None, None]).sum(axis=3), caps[None, :, None])
    base = (np.arange(n)[:, None, None] * b + np.arange(b)[None, None, :]) * (k_max + 1)  # [2, 1, b]
    tok = cum[base + j]  # [2, caps, b]
    gain = tok - prices[None, :, None] * j
    use_ng = gain[1] > gain[0]
    return np.where(use_ng, j[1], j[0]), use_ng, np.where(use_ng, tok[1], tok[0])


def slot_slope_ms(cost: StepCost, batch_size: int, k_bar: np.ndarray | float) -> np.ndarray:
    """dV/dslot = (V(b, k_bar + 1) - V(b, k_bar - 1)) / (2 b), clipped at 0; one-sided at the ends."""
    ks = np.array(cost.ks, dtype=float)
    row = cost.row(batch_size) - cost.draft_row(batch_size)
    k_bar = np.asarray(k_bar, dtype=float)
    lo, hi = np.maximum(k_bar - 1.0, ks[0]), np.minimum(k_bar + 1.0, ks[-1])
    rise = np.maximum(np.interp(hi, ks, row) - np.interp(lo, ks, row), 0.0)
    return np.where(hi > lo, rise / np.maximum(hi - lo, 1e-9) / batch_size, 0.0)


def market(surv_model: np.ndarray, surv_ngram: np.ndarray, cost: StepCost, rate: float,
           rounds: int = ROUNDS) -> Choice:
    """The allocation with the largest surplus E - R T over length caps and price rounds.

    For each cap c = 1..k_max (only slots j <= c for sale; the longest draft sets the
    drafting time) the candidates are: every slot (price 0, which a kink of T such as a
    cheap odd k can favour), then the price R * dT/dslot(c / 2) iterated ``rounds - 1``
    times as lambda <- R * dT/dslot(k_bar) of the cap's last allocation. All caps are
    evaluated at once ([caps, b] arrays).
    """
    b, k_max = surv_model.shape
    caps = np.arange(1, k_max + 1)
    drafting = float(np.interp(float(k_max), np.array(cost.ks, dtype=float), cost.draft_row(b)))  # every row, k_max
    best = Choice(np.zeros(b, np.int64), np.full(b, MODEL, np.int64), float(b),
                  float(cost.verify_ms(b, 0.0)) + drafting, 0.0)
    if b == 0 or k_max == 0:
        return best
    prices = np.zeros(k_max)
    chains = _chains(surv_model, surv_ngram)
    for r in range(rounds + 1):
        ks, use_ng, tokens = _choose_from(chains, prices, caps)  # [caps, b] each
        expected = b + tokens.sum(axis=1)
        step_ms = cost.verify_ms(b, ks.mean(axis=1)) + drafting
        c = int(np.argmax(expected - rate * step_ms))
        if expected[c] - rate * step_ms[c] > best.surplus(rate):
            best = Choice(ks[c].astype(np.int64), np.where(use_ng[c], NGRAM, MODEL).astype(np.int64),
                          float(expected[c]), float(step_ms[c]), float(prices[c]))
        prices = rate * slot_slope_ms(cost, b, caps / 2.0 if r == 0 else ks.mean(axis=1))
    return best


class HybridSparkPolicy:
    """Both drafters every step; each request buys the chain whose slots are worth the batch price."""

    name: ClassVar[str] = "hybrid-spark"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, num_bins: int = 20, prior_weight: float = 5.0, ema: float = 0.95,
                 ngram_table: NgramTable | str | None = None) -> None:
        self.ctx = ctx
        prior = float(np.mean(ctx.prior_rates)) if ctx.prior_rates else 0.5
        self.calibrator = ConfidenceCalibrator(prior, num_bins=num_bins, prior_weight=prior_weight)
        if isinstance(ngram_table, str):  # hybrid-spark:ngram_table=FILE
            ngram_table = NgramTable.load(ngram_table)
        if ngram_table is None:
            rates = ctx.ngram_rates or (0.0,)
            ngram_table = NgramTable.from_length_rates(rates, ctx.k_max)
        self.ngram = ngram_table
        self.ema = ema
        self.ema_tokens = 0.0  # running decode tokens and ms per step; R = their ratio
        self.ema_ms = 0.0
        self.last: Choice | None = None
        self._top1: np.ndarray | None = None

    def decide(self, state: BatchState) -> Decision:
        f = require_features(state.features, self.name)
        k_max = self.ctx.k_max
        self._top1 = f.top1_prob[:, :k_max]
        surv_m = np.cumprod(self.calibrator(self._top1), axis=1)
        surv_n = self.ngram.survival(f.ngram_match_len, f.ngram_num_proposed, k_max)
        b = state.batch_size
        if self.ema_ms > 0:
            rate = self.ema_tokens / self.ema_ms
        else:  # first step: the rate of drafting every slot
            rate = (b + float(np.maximum(surv_m, surv_n).sum())) / self.ctx.cost.step_ms(b, k_max)
        self.last = market(surv_m, surv_n, self.ctx.cost, rate)
        return Decision.per_request(self.last.ks, self.last.drafter)

    def observe(self, outcome: StepOutcome) -> None:
        if self._top1 is None:
            return
        top1, self._top1 = self._top1, None
        update_calibrator(self.calibrator, top1, outcome, MODEL)
        w = self.ema if self.ema_ms > 0 else 0.0
        self.ema_tokens = w * self.ema_tokens + (1.0 - w) * outcome.num_tokens
        self.ema_ms = w * self.ema_ms + (1.0 - w) * outcome.step_ms
