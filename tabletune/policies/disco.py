"""DISCO: a classifier decides, after each drafted token, whether to keep drafting.

Source: Mamou et al., "Dynamic Speculation Lookahead Accelerates Speculative Decoding
of Large Language Models" (DISCO, arXiv 2405.04304). After the drafter emits token i
of request r, a classifier scores its features x_i and drafting continues while

    P(accepted | x_i) = sigmoid(w . z_i + c) >= tau,   z_i = (x_i - mu) / sigma

and stops otherwise (the token that fails the test is still verified; drafting stops
after it, as in the paper). The paper trains a feed-forward classifier on the draft
model's top-k probabilities, entropy and position; this version trains a
scikit-learn logistic regression on logged (features, accepted) pairs with the
features of ``disco_model.FEATURES`` (the columns of issue 7's per-token traces) and
picks tau on the training log by the same rule as the threshold variant below
(``disco_model``: the classifier, its training and its JSON file, never a pickle;
scoring needs only numpy).

Threshold variant (Hugging Face transformers' ``assistant_confidence_threshold``,
``AssistedCandidateGenerator``): stop drafting when the draft's top-1 probability
p_i < theta (default 0.4). After each verification it logs p of every drafted token
with label 1 for the accepted ones and 0 for the first rejected one (later tokens were
never tested and are dropped), and retunes theta on the ROC curve of that log:

    theta* = argmin_theta  FPR(theta) + 3 * FNR(theta)

(false positives, rejected tokens that were drafted anyway, cost 1; false negatives,
acceptable tokens that were not drafted, cost 3). It needs >= 6 logged tokens and both
labels, as in transformers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from tabletune.errors import InputError
from tabletune.policies.base import BatchState, Decision, DraftFeatures, PolicyContext, StepOutcome
from tabletune.policies.disco_model import DiscoModel, default_disco_model, roc_threshold, train_disco
from tabletune.policies.per_request import (accepted_mask, default_features, drafter_features, feature_column,
                                            feature_tensor, first_stop, tested_mask)

HF_DEFAULT_THRESHOLD = 0.4


def verified_labels(num_drafted: int, num_accepted: int) -> list[int]:
    """Labels of one verified draft: 1 per accepted token, 0 for the first rejected one.

    Tokens after the first rejection were never tested (censored) and get no label.
    """
    m = min(num_accepted, num_drafted)
    return [1] * m + ([0] if m < num_drafted else [])


class ConfidenceThreshold:
    """transformers' rule: continue while p_top1 >= theta; theta retuned on the ROC log."""

    def __init__(self, threshold: float = HF_DEFAULT_THRESHOLD, retune: bool = True, max_log: int = 4096,
                 retune_every: int = 1) -> None:
        self.threshold = threshold
        self.retune = retune
        self.max_log = max_log
        self.retune_every = retune_every  # transformers retunes after every verification (1)
        self.num_updates = 0
        self.probs: list[float] = []
        self.labels: list[int] = []

    def keep_drafting(self, top1_prob: float) -> bool:
        return top1_prob >= self.threshold

    def observe(self, drafted_probs: Sequence[float], num_accepted: int) -> None:
        """Log one verified draft (p of each drafted token, m accepted) and retune theta."""
        labels = verified_labels(len(drafted_probs), num_accepted)
        self.observe_tested(np.asarray(drafted_probs[: len(labels)], dtype=float), np.asarray(labels))

    def observe_tested(self, probs: np.ndarray, labels: np.ndarray) -> None:
        """Log tested tokens' p and label; retune (transformers keeps the whole log; we keep max_log)."""
        self.probs.extend(np.asarray(probs, dtype=float).tolist())
        self.labels.extend(np.asarray(labels, dtype=int).tolist())
        if len(self.labels) > self.max_log:
            del self.labels[: -self.max_log], self.probs[: -self.max_log]
        self.num_updates += 1
        if self.num_updates % self.retune_every:
            return
        if self.retune and len(self.probs) > 5 and 0 < sum(self.labels) < len(self.labels):
            self.threshold = roc_threshold(self.labels, self.probs)


class DiscoPolicy:
    """DISCO per request: draft while the classifier (or transformers' threshold) says continue.

    Variants:

    * ``classifier`` (default): a classifier trained offline. ``model=FILE`` loads saved
      coefficients; without it, ``profiles/policies/disco-sim.json`` (trained on the
      simulator's stated confidence model, pooled over the workload presets, by
      ``python -m tabletune.sim.traces``). Its log has no n-gram match length, so it
      uses the first four features; a model scores the features it names.
    * ``online``: starts with the threshold rule, logs every tested token's
      (features, accepted), trains the classifier once ``warmup_tokens`` are logged and
      refits every ``refit_steps`` steps on the latest ``max_log`` tokens (it follows a
      workload switch).
    * ``threshold``: transformers' ``assistant_confidence_threshold`` rule with its ROC
      retuning, every ``retune_every`` steps (transformers retunes after every
      verification of its single sequence; here one step verifies a whole batch).
    """

    name: ClassVar[str] = "disco"
    uses_features: ClassVar[bool] = True

    def __init__(self, ctx: PolicyContext, variant: str = "classifier", model: str | None = None,
                 threshold: float = HF_DEFAULT_THRESHOLD, warmup_tokens: int = 2000, refit_steps: int = 250,
                 max_log: int = 20000, retune_every: int = 10, tau: float | None = None) -> None:
        if variant not in ("classifier", "online", "threshold"):
            raise InputError("--policy", "disco.variant", variant, "choose 'classifier', 'online' or 'threshold'")
        self.ctx = ctx
        self.variant = variant
        self.hf = ConfidenceThreshold(threshold, retune=True, retune_every=retune_every)
        self.model: DiscoModel | None = None
        if model:
            self.model = DiscoModel.load(model)
        elif variant == "classifier":
            self.model = default_disco_model()
        if tau is not None and self.model is not None:  # a threshold fit for speed (DISCO's own choice)
            if not 0.0 <= tau <= 1.0:
                raise InputError("--policy", "disco.tau", tau, "must lie in [0, 1]")
            self.model = dataclasses.replace(self.model, threshold=float(tau))
        self.warmup_tokens, self.refit_steps, self.max_log = warmup_tokens, refit_steps, max_log
        self.log_x: list[np.ndarray] = []
        self.log_y: list[np.ndarray] = []
        self.num_logged = 0
        self.steps_since_fit = 0
        self._x: np.ndarray | None = None
        self._keep_all: np.ndarray | None = None

    def keep(self, x: np.ndarray) -> np.ndarray:
        """[...] keep-drafting tests of features x [..., 5]: P(accepted | x) >= tau (or p_top1 >= theta)."""
        if self.variant != "threshold" and self.model is not None:
            d = len(self.model.features)
            flat = x[..., :d].reshape(-1, d)
            return (self.model.accept_prob(flat) >= self.model.threshold).reshape(x.shape[:-1])
        return x[..., 0] >= self.hf.threshold

    def decide(self, state: BatchState) -> Decision:
        """k_i = the first position whose test fails (``first_stop``); without features yet, the cap k_max
        (the draft then stops through ``keep_drafting``, to the same lengths)."""
        self._keep_all = None
        if state.features is None:
            self._x = None
            return Decision.per_request(np.full(state.batch_size, self.ctx.k_max, np.int64))
        x = feature_tensor(default_features(state, self.ctx, self.name))[:, : self.ctx.k_max]  # [b, K, 5]
        self._x = x
        self._keep_all = self.keep(x)  # [b, K]: keep_drafting reads it when the signals came with the state
        return Decision.per_request(first_stop(self._keep_all))

    def keep_drafting(self, state: BatchState, features: DraftFeatures, j: int, active: np.ndarray) -> np.ndarray:
        """Draft position j + 1 where position j passes the test (DISCO stops after the token that fails)."""
        if self._keep_all is not None:
            return active & self._keep_all[:, j - 1]
        f = drafter_features(features, self.ctx)
        if self._x is None or self._x.shape[1] < j:  # decided without features: log what was drafted
            self._x = feature_tensor(f)
        return active & self.keep(feature_column(f, j))

    def observe(self, outcome: StepOutcome) -> None:
        if self._x is None:
            return
        x, self._x = self._x, None
        k_max = x.shape[1]  # positions whose features were seen (every verified one)
        tested = tested_mask(np.minimum(outcome.ks, k_max), outcome.accepted, k_max)
        labels = accepted_mask(outcome.accepted, k_max)[tested]
        if self.variant == "threshold" or self.model is None:
            self.hf.observe_tested(x[:, :, 0][tested], labels)
        if self.variant != "online":
            return
        self.log_x.append(x[tested])
        self.log_y.append(labels.astype(np.int8))
        self.num_logged += int(tested.sum())
        self.steps_since_fit += 1
        if self.num_logged >= self.warmup_tokens and (self.model is None or self.steps_since_fit >= self.refit_steps):
            self._refit()

    def _refit(self) -> None:
        xs = np.concatenate(self.log_x)[-self.max_log:]
        ys = np.concatenate(self.log_y)[-self.max_log:]
        self.log_x, self.log_y = [xs], [ys]
        self.steps_since_fit = 0
        if 0 < ys.sum() < len(ys):
            self.model = train_disco(xs, ys, trained_on="online log")
