"""The controller's request level: which rows draft and verify how far, priced by the measured surface.

Pure decision functions on numpy arrays (no torch, no vllm); ``tabletune.policies.controller``
drives them with the ``Controller``'s table and acceptance estimate. Notation: b rows, positions
j = 1..k_max (columns j - 1), S_ij the calibrated survival of row i's draft through position j
(S_i0 = 1), R the batch's running decode rate (tokens per ms of step time).

Marginal cost. With the batch at cap c (every other row verifying c tokens, the table's
operating point), one more token at position j of one row costs

    dT_j(b, c) = T(ks with that row at j) - T(ks with that row at j - 1),   ks = (c, ..., c)

read from the step cost (``StepCost.mixed_ms``: whatever rule prices drafting and
verification, the measured surface underneath). For j <= c it is the row's verification
(and, when drafting is charged by active rows, its drafting); for j > c it also pays for
lengthening the longest draft. Its price in tokens is lambda_j = R dT_j (the tokens the
step's time would have earned elsewhere: Dinkelbach, maximising sum E / sum T over steps).

Rules (row i, under cap c):

    draft position j + 1  while  S_ij a_{j+1} > lambda_{j+1}  and  j < c      (keep_drafting)
    verify positions j    while  S_ij > lambda_j                               (a prefix)

a_{j+1} is the acceptance of the next position before its signal exists (the controller's
online estimate). A row's length is the shorter of the two. Each cap c gives one plan (all
caps 1..k_max, or a window around the table's k); with E = b + sum of the verified S, the plan
with the largest surplus E - R T(ks) wins, the table's own uniform k and no speculation being
two more candidates, so a step never scores below the table by its own estimate.

Drafter choice: where a second chain exists (n-gram, drafted on the host for free), each
row takes the chain with the larger surplus sum_{j <= k_i} (S_ij - lambda_j) over its
verified prefix (Hybrid Spark's yield per verified token). A row on the n-gram chain takes
no model drafting, so its lambda_j is R dV_j (``marginal_ms(..., free=True)``: its
verification only), and a plan costs T(b; k, d) with d_i = 0 on its n-gram rows, plus ``StepCost.split_ms(b)``
where its n-gram rows verify more than its model rows draft (the engine splits that step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tabletune.cost import StepCost, active_rows

MODEL, NGRAM = 0, 1  # as tabletune.policies.base


def marginal_ms(cost: StepCost, batch_size: int, cap: int, k_max: int, free: bool = False) -> np.ndarray:
    """[k_max] dT_j(b, c), j = 1..k_max: one row moved from j - 1 to j with the others at ``cap`` (>= 0).

    ``free``: the row's tokens come from the n-gram lookup (no model drafting), so dT_j is its verification only.
    A split step's extra (``StepCost.split_ms``) is the step's, not one token's: plans pay it (``choose_plan``),
    prices leave it out.
    """
    ks = np.full(batch_size, cap, dtype=np.int64)
    drafted = ks.copy()
    mask = np.zeros(batch_size, bool)
    mask[0] = free
    times = np.empty(k_max + 1)
    for j in range(k_max + 1):
        ks[0] = j
        drafted[0] = 0 if free else j
        times[j] = cost.mixed_ms(ks, drafted, mask, split_extra=False)
    return np.maximum(np.diff(times), 0.0)


def leading_true(mask: np.ndarray) -> np.ndarray:
    """[b] number of leading True values per row of a [b, n] mask."""
    if mask.shape[1] == 0:
        return np.zeros(mask.shape[0], np.int64)
    return np.where(mask.all(axis=1), mask.shape[1], np.argmin(mask, axis=1)).astype(np.int64)


def draft_lengths(survival: np.ndarray, next_rates: np.ndarray, price: np.ndarray, cap: int) -> np.ndarray:
    """[b] tokens drafted: the leading positions j + 1 <= cap with S_ij a_{j+1} > lambda_{j+1} (S_i0 = 1)."""
    b = survival.shape[0]
    before = np.concatenate([np.ones((b, 1)), survival[:, : cap - 1]], axis=1) if cap > 0 else np.ones((b, 0))
    return leading_true(before * next_rates[None, :cap] > price[None, :cap])


def verify_lengths(survival: np.ndarray, price: np.ndarray, cap: int) -> np.ndarray:
    """[b] verified prefix: the leading positions j <= cap with S_ij > lambda_j."""
    return leading_true(survival[:, :cap] > price[None, :cap])


@dataclass(frozen=True)
class Plan:
    ks: np.ndarray  # [b] verified draft tokens per row
    drafter: np.ndarray  # [b] MODEL or NGRAM
    cap: int  # the longest model draft the plan allows (n-gram rows verify their priced prefix, up to k_max)
    expected_tokens: float  # b + sum of the verified survivals
    step_ms: float  # T(ks)

    def surplus(self, rate: float) -> float:
        return self.expected_tokens - rate * self.step_ms


def prefix_sums(survival: np.ndarray) -> np.ndarray:
    """[b, k_max + 1] sum_{j<=n} S_ij for n = 0..k_max."""
    out = np.zeros((survival.shape[0], survival.shape[1] + 1))
    np.cumsum(survival, axis=1, out=out[:, 1:])
    return out


def plans_by_cap(surv_model: np.ndarray, surv_ngram: np.ndarray | None, next_rates: np.ndarray,
                 prices: np.ndarray, caps: np.ndarray,
                 ngram_prices: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ks, drafter, bought survival), each [len(caps), b], for the caps c with price vectors ``prices[c - 1]``.

    Row i under cap c: ks = min(draft length, verified prefix, c) of the model chain, or the n-gram
    chain's verified prefix where its surplus sum_{j<=k} (S_ij - lambda_j) is larger (module docstring);
    the n-gram chain is priced by ``ngram_prices[c - 1]`` (verification only; default ``prices``). The cap bounds
    the model chain only: an n-gram row drafts nothing on the model, so its prefix is not held to the model rows'
    cap (holding it there made a long proposal raise the cap, and under a high cap the model rows' marginal
    price, shared by every row at c, undercharges drafting that fewer rows pay for).
    """
    ngram_prices = prices if ngram_prices is None else ngram_prices
    b, k_max = surv_model.shape
    rows = np.arange(b)[None, :]
    price = prices[caps - 1][:, None, :]  # [caps, 1, k_max]
    before = np.concatenate([np.ones((b, 1)), surv_model[:, :-1]], axis=1) * next_rates[None, :k_max]
    ks = np.minimum(leading_true3(np.minimum(before, surv_model)[None] > price), caps[:, None])
    tokens = prefix_sums(surv_model)[rows, ks]
    drafter = np.zeros_like(ks)
    if surv_ngram is not None:
        zero = np.zeros((len(caps), 1))
        cum_price = np.concatenate([zero, np.cumsum(prices[caps - 1], axis=1)], axis=1)
        cum_ng = np.concatenate([zero, np.cumsum(ngram_prices[caps - 1], axis=1)], axis=1)
        idx = np.arange(len(caps))[:, None]
        ks_ng = leading_true3(surv_ngram[None] > ngram_prices[caps - 1][:, None, :])  # the model's cap not theirs
        tok_ng = prefix_sums(surv_ngram)[rows, ks_ng]
        use_ng = tok_ng - cum_ng[idx, ks_ng] > tokens - cum_price[idx, ks]
        ks, tokens = np.where(use_ng, ks_ng, ks), np.where(use_ng, tok_ng, tokens)
        drafter = use_ng.astype(np.int64)  # NGRAM = 1
    return ks.astype(np.int64), drafter, tokens


def split_caps(ks: np.ndarray, drafter: np.ndarray) -> np.ndarray:
    """[caps] whether each cap's plan (ks, drafter [caps, rows]) splits: an n-gram row verifies more than any model
    row drafts (``tabletune.cost.splits``)."""
    ng = np.where(drafter == NGRAM, ks, -1).max(axis=-1)
    return ng > np.where(drafter == MODEL, ks, 0).max(axis=-1)


def leading_true3(mask: np.ndarray) -> np.ndarray:
    """[caps, b] number of leading True values along the last axis of a [caps, b, n] mask."""
    return np.where(mask.all(axis=2), mask.shape[2], np.argmin(mask, axis=2))


def choose_plan(cost: StepCost, surv_model: np.ndarray, surv_ngram: np.ndarray | None, next_rates: np.ndarray,
                prices_ms: np.ndarray, rate: float, table_k: int, cap_window: int | None = None,
                ngram_prices_ms: np.ndarray | None = None) -> Plan:
    """The plan with the largest surplus E - R T over the caps, the table's uniform ``table_k`` and no
    speculation. ``prices_ms[c - 1]`` is dT(b, c) (``marginal_ms``); the price vector under cap c is R dT(b, c)
    (``ngram_prices_ms``: the n-gram chain's, verification only). Caps are 1..k_max, or table_k +- ``cap_window``
    when given (fewer step costs to evaluate). A uniform plan costs T(b, k) (``StepCost.step_ms``), a mixed one
    T(b; k, d) of ``StepCost.rows_ms`` with d = k on the model rows and d = 0 on the n-gram rows.
    """
    b = surv_model.shape[0]
    cum_m = prefix_sums(surv_model)
    ks_tab = np.full(b, table_k, np.int64)
    model = np.full(b, MODEL, np.int64)
    best = Plan(ks_tab, model, table_k, float(b + cum_m[:, table_k].sum()), cost.step_ms(b, table_k))
    k_max = prices_ms.shape[0]
    lo, hi = (1, k_max) if cap_window is None else (max(table_k - cap_window, 1), min(table_k + cap_window, k_max))
    caps = np.arange(lo, hi + 1)
    ks, drafter, tokens = plans_by_cap(surv_model, surv_ngram, next_rates, rate * prices_ms, caps,
                                       None if ngram_prices_ms is None else rate * ngram_prices_ms)
    # T of every cap's plan at once: the rule of ``StepCost.mixed_ms`` (n-gram rows draft nothing), [caps]
    times = cost.rows_ms(b, active_rows(np.where(drafter == NGRAM, 0, ks), k_max), ks.mean(axis=1))
    times = times + cost.split_ms(b) * split_caps(ks, drafter)
    expected = b + tokens.sum(axis=1)
    i = int(np.argmax(expected - rate * times))
    plan = Plan(ks[i], drafter[i], int(caps[i]), float(expected[i]), float(times[i]))
    if plan.surplus(rate) > best.surplus(rate):
        best = plan
    if table_k > 0:
        zeros = np.zeros(b, np.int64)
        off = Plan(zeros, model, 0, float(b), cost.step_ms(b, 0))
        if off.surplus(rate) > best.surplus(rate):
            best = off
    return best


@dataclass(frozen=True)
class ClassPlans:
    """``choose_plan`` for a batch of b rows planned before drafting, made ahead of the step.

    Before drafting every row's model survival is the same (the estimator's), so under each cap a row's plan
    (k, drafter, bought survival) depends only on its class: the n-gram lookup's match length and proposal
    length. ``class_plans`` computes every class's plan under every cap once (off the critical path); a step's
    plan is then a sum over its class counts, the rule of ``choose_plan`` (the largest surplus among the caps,
    the table's uniform k and no speculation) read from lookups (``StepCost.rows_ms_tables``): one product of
    the counts with ``sums``, two gathers.
    """

    batch_size: int
    rate: float
    caps: np.ndarray  # [n]
    ks: np.ndarray  # [classes, n]
    drafter: np.ndarray  # [classes, n]
    sums: np.ndarray  # [classes, n (tokens) + n (ks) + n k_max (1 where the row drafts position j with the model)]
    verify_ms: np.ndarray  # [b k_max + 1]
    drafting_ms: np.ndarray  # [k_max (b + 1)], position j's row of ``StepCost.rows_ms_tables`` at j (b + 1)
    offsets: np.ndarray  # [n k_max] j (b + 1): where position j's row starts in ``drafting_ms``
    fallback: Plan  # the better of the table's uniform k and no speculation
    plain: Plan  # the plan of a step with no n-gram proposal (every row of class 0)
    split_ms: float = 0.0  # ``StepCost.split_ms(b)``: added to a plan whose n-gram rows outrun its model rows
    # [classes, n] for ``split_caps`` over the classes present: a class's k on the n-gram chain (else -1) and on
    # the model chain (else 0), taken apart once here so that choosing costs two gathers and two maxima
    ngram_ks: np.ndarray | None = None
    model_ks: np.ndarray | None = None

    def choose(self, classes: np.ndarray | None) -> Plan:
        """The plan of a step whose rows have these classes (None: no row has an n-gram proposal)."""
        if classes is None:
            return self.plain
        return self._choose(np.bincount(classes, minlength=self.ks.shape[0]).astype(float), classes)

    def _choose(self, counts: np.ndarray, classes: np.ndarray | None) -> Plan:
        b, n = self.batch_size, len(self.caps)
        summed = counts @ self.sums
        expected, ksum = b + summed[:n], summed[n: 2 * n].astype(np.intp)
        positions = summed[2 * n:].astype(np.intp) + self.offsets  # [n k_max] flat index of (j, a_j)
        times = self.verify_ms[ksum] + self.drafting_ms[positions].reshape(n, -1).sum(axis=1)
        if self.split_ms > 0:  # split_caps over the rows of the classes present
            present = np.flatnonzero(counts)
            times = times + self.split_ms * (self.ngram_ks[present].max(axis=0) > self.model_ks[present].max(axis=0))
        surplus = expected - self.rate * times
        i = int(np.argmax(surplus))
        if surplus[i] <= self.fallback.surplus(self.rate):
            return self.fallback
        if classes is None:
            ks, drafter = np.full(b, self.ks[0, i]), np.full(b, self.drafter[0, i])
        else:
            ks, drafter = self.ks[classes, i], self.drafter[classes, i]
        return Plan(ks, drafter, int(self.caps[i]), float(expected[i]), float(times[i]))


def class_plans(cost: StepCost, batch_size: int, surv_model: np.ndarray, surv_ngram: np.ndarray,
                next_rates: np.ndarray, prices_ms: np.ndarray, ngram_prices_ms: np.ndarray, rate: float,
                table_k: int, cap_window: int | None = None,
                tables: tuple[np.ndarray, np.ndarray] | None = None) -> ClassPlans:
    """Every class's plan under every cap (``plans_by_cap``): ``surv_model`` [k_max] the model survival of any row,
    ``surv_ngram`` [classes, k_max] the n-gram survival of each class (class 0 and every class without a
    proposal: zeros); prices and caps as ``choose_plan``; ``tables``: ``cost.rows_ms_tables(b, k_max)`` if the
    caller keeps them."""
    b, k_max = batch_size, prices_ms.shape[0]
    lo, hi = (1, k_max) if cap_window is None else (max(table_k - cap_window, 1), min(table_k + cap_window, k_max))
    caps = np.arange(lo, hi + 1)
    classes = surv_ngram.shape[0]
    surv_m = np.broadcast_to(surv_model[None, :], (classes, k_max))
    ks, drafter, tokens = plans_by_cap(surv_m, surv_ngram, next_rates, rate * prices_ms, caps, rate * ngram_prices_ms)
    drafted = np.where(drafter == NGRAM, 0, ks)  # [n, classes]
    active = drafted[:, :, None] >= np.arange(1, k_max + 1)  # [n, classes, k_max]
    sums = np.concatenate([tokens.T, ks.T, active.transpose(1, 0, 2).reshape(classes, -1)], axis=1).astype(float)
    verify, drafting = tables if tables is not None else cost.rows_ms_tables(b, k_max)
    cum = prefix_sums(surv_model[None, :])[0]
    fallback = Plan(np.full(b, table_k, np.int64), np.full(b, MODEL, np.int64), table_k,
                    float(b + b * cum[table_k]), cost.step_ms(b, table_k))
    if table_k > 0:
        off = Plan(np.zeros(b, np.int64), np.full(b, MODEL, np.int64), 0, float(b), cost.step_ms(b, 0))
        if off.surplus(rate) > fallback.surplus(rate):
            fallback = off
    out = ClassPlans(b, float(rate), caps, np.ascontiguousarray(ks.T), np.ascontiguousarray(drafter.T),
                     np.ascontiguousarray(sums), verify, drafting.reshape(-1),
                     np.tile(np.arange(k_max) * (b + 1), len(caps)), fallback, fallback, cost.split_ms(b),
                     np.ascontiguousarray(np.where(drafter == NGRAM, ks, -1).T),
                     np.ascontiguousarray(np.where(drafter == MODEL, ks, 0).T))
    plain_counts = np.zeros(classes)
    plain_counts[0] = b
    return dataclasses.replace(out, plain=out._choose(plain_counts, None))
