"""TapOut-style: UCB1 over parameter-free stopping rules.

Source: Sridhar et al., "TapOut: A Bandit-Based Approach to Dynamic Speculative
Decoding" (arXiv 2511.02017). A multi-armed bandit picks, for each drafting round of
a request, one of several training-free stop rules; the rule then decides after each
drafted token whether to keep drafting; the round's outcome rewards the arm.

Arms (each sees the drafted token's top-1 prob p1, top-2 prob p2 = p1 - margin and
entropy H in nats; the token that fails a rule is still verified, drafting stops after it):

* ``max-confidence``: continue while p1 >= 1/2 (the top token outweighs all others).
* ``svip``: SVIP-style entropy bound (Zhang et al., arXiv 2411.18462). The acceptance
  of a token is 1 - TV(p, q) and Pinsker gives TV <= sqrt(KL / 2); with the draft
  entropy standing in for KL, continue while 1 - sqrt(H / 2) >= 1/2, i.e. H <= 1/2.
* ``adaedl``: AdaEDL-style (Agrawal et al., arXiv 2410.18351): the same lower bound
  1 - sqrt(H / 2), against an adaptive threshold: continue while
  1 - sqrt(H / 2) >= lambda, lambda = 1 - a_ema, a_ema the running (EMA, 0.9) rate of
  accepted tokens among those tested. High acceptance lowers the bar.
* ``logit-margin``: continue while p1 - p2 >= 1 - p1 (the lead over the runner-up
  exceeds all the mass outside the top token).

The constants (1/2, the Pinsker factor, the EMA weight) are what this "-style" version
assumes; the paper's arms are parameter-free in the same sense (fixed by their
derivation, not tuned). Reward of a round with k drafted and m accepted (blend of
accepted length and acceptance rate, both in [0, 1]):

    r = 1/2 * m / k_max + 1/2 * m / k

UCB1 (Auer et al. 2002): play each arm once, then argmax_a  r_bar_a + sqrt(2 ln N / n_a).
In a batch every request picks an arm in turn; a pick counts as a pull at once
(n_a += 1) and its reward arrives after the step, so one step's picks spread over arms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from tabletune.errors import InputError
from tabletune.policies.base import BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.per_request import default_features, drafter_features, first_stop

ARMS = ("max-confidence", "svip", "adaedl", "logit-margin")


def svip_bound(entropy):
    """Acceptance lower bound 1 - sqrt(H / 2) (Pinsker, entropy as the KL stand-in); floats or arrays."""
    return 1.0 - np.sqrt(np.maximum(entropy, 0.0) / 2.0)


# keep-drafting tests (p1, margin, entropy, lambda) -> bool; each works on floats and on arrays
RULES: dict[str, Callable] = {
    "max-confidence": lambda p1, margin, h, lam: p1 >= 0.5,
    "svip": lambda p1, margin, h, lam: svip_bound(h) >= 0.5,
    "adaedl": lambda p1, margin, h, lam: svip_bound(h) >= lam,
    "logit-margin": lambda p1, margin, h, lam: margin >= 1.0 - p1,
}


def round_reward(num_drafted: int, num_accepted: int, k_max: int) -> float:
    """r = m / (2 k_max) + m / (2 k); 0 for an empty draft."""
    if num_drafted <= 0:
        return 0.0
    return 0.5 * num_accepted / k_max + 0.5 * num_accepted / num_drafted


@dataclass
class Ucb1:
    """UCB1 over a fixed set of arms, rewards in [0, 1]."""

    num_arms: int
    pulls: list[int] = field(default_factory=list)
    reward_sum: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pulls = self.pulls or [0] * self.num_arms
        self.reward_sum = self.reward_sum or [0.0] * self.num_arms

    def score(self, arm: int) -> float:
        n = self.pulls[arm]
        if n == 0:
            return math.inf
        total = sum(self.pulls)
        return self.reward_sum[arm] / n + math.sqrt(2.0 * math.log(total) / n)

    def pick(self) -> int:
        """argmax score (lowest index on ties); counts the pull now."""
        scores = [self.score(a) for a in range(self.num_arms)]
        arm = scores.index(max(scores))
        self.pulls[arm] += 1
        return arm

    def pick_many(self, n: int) -> np.ndarray:
        """[n] arms of n successive ``pick`` calls (each counted at once), without a Python loop per pick.

        Play each unplayed arm once in index order; after that, while every arm has been played,
        the picks follow the argmax of r_bar_a + sqrt(2 ln N / n_a) with N and n_a updated per pick
        (the same sequence as calling ``pick`` n times).
        """
        out = np.empty(n, np.int64)
        i = 0
        while i < n and 0 in self.pulls:
            out[i] = self.pick()
            i += 1
        if i == n:
            return out
        pulls = list(self.pulls)
        means = [r / p for r, p in zip(self.reward_sum, pulls)]
        total = sum(pulls)
        arms = range(self.num_arms)
        for t in range(i, n):  # plain floats: a few arms, a pick costs about a microsecond
            log_total = 2.0 * math.log(total)
            scores = [means[a] + math.sqrt(log_total / pulls[a]) for a in arms]
            a = scores.index(max(scores))
            out[t] = a
            pulls[a] += 1
            total += 1
        self.pulls = pulls
        return out

    def reward(self, arm: int, r: float) -> None:
        self.reward_sum[arm] += r

    def means(self) -> list[float]:
        return [s / n if n else 0.0 for s, n in zip(self.reward_sum, self.pulls)]


class TapOutPolicy:
    """Per request and step: UCB1 picks a stop rule, the rule sets the draft length."""

    name: ClassVar[str] = "tapout"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, arms: tuple[str, ...] = ARMS, ema: float = 0.9) -> None:
        unknown = [a for a in arms if a not in RULES]
        if unknown or not arms:
            raise InputError("--policy", "tapout.arms", list(arms), f"choose from {list(ARMS)}")
        self.ctx = ctx
        self.arms = tuple(arms)
        self.bandit = Ucb1(len(self.arms))
        self.ema = ema
        self.accept_rate = 0.5  # a_ema, AdaEDL's running acceptance of tested tokens
        self._picks: np.ndarray | None = None
        self._keep_all: np.ndarray | None = None

    @property
    def adaedl_lambda(self) -> float:
        return 1.0 - self.accept_rate

    def keep_matrix(self, arm: str, f: DraftFeatures) -> np.ndarray:
        """[batch_size, k_max] keep-drafting decisions of one arm."""
        k = self.ctx.k_max
        return RULES[arm](f.top1_prob[:, :k], f.margin[:, :k], f.entropy[:, :k], self.adaedl_lambda)

    def keep_picked(self, f: DraftFeatures, cols: slice) -> np.ndarray:
        """[batch_size, len(cols)] each row's picked arm's decisions on the columns ``cols``."""
        tests = np.stack([RULES[arm](f.top1_prob[:, cols], f.margin[:, cols], f.entropy[:, cols], self.adaedl_lambda)
                          for arm in self.arms])  # [arms, b, cols]
        return tests[self._picks, np.arange(len(self._picks))]

    def decide(self, state: BatchState) -> Decision:
        """Each row pulls an arm (UCB1); k_i = the first position its rule fails (k_max without features
        yet: the draft then stops through ``keep_drafting``, to the same lengths)."""
        self._picks = self.bandit.pick_many(state.batch_size)
        self._keep_all = None
        if state.features is None:
            return Decision.per_request(np.full(state.batch_size, self.ctx.k_max, np.int64))
        f = default_features(state, self.ctx, self.name)
        self._keep_all = self.keep_picked(f, slice(0, self.ctx.k_max))  # keep_drafting reads it
        return Decision.per_request(first_stop(self._keep_all))

    def keep_drafting(self, state: BatchState, features: DraftFeatures, j: int, active: np.ndarray) -> np.ndarray:
        """Draft position j + 1 where the row's arm passes position j."""
        if self._picks is None:
            raise ValueError("tapout: keep_drafting before decide (the step's arms are picked in decide)")
        if self._keep_all is not None:
            return active & self._keep_all[:, j - 1]
        f = drafter_features(features, self.ctx)
        return active & self.keep_picked(f, slice(j - 1, j))[:, 0]

    def observe(self, outcome: StepOutcome) -> None:
        if self._picks is None:
            return
        picks, self._picks = self._picks, None
        ks, m = outcome.ks.astype(float), outcome.accepted.astype(float)
        rewards = np.where(ks > 0, 0.5 * m / self.ctx.k_max + 0.5 * m / np.maximum(ks, 1.0), 0.0)  # round_reward
        sums = np.bincount(picks, weights=rewards, minlength=self.bandit.num_arms)
        for arm in range(self.bandit.num_arms):
            self.bandit.reward(arm, float(sums[arm]))
        tested = int(np.minimum(outcome.accepted + 1, outcome.ks).sum())
        if tested > 0:
            rate = float(outcome.accepted.sum()) / tested
            self.accept_rate = self.ema * self.accept_rate + (1.0 - self.ema) * rate
