"""SGLang-style: an EMA of accepted length per batch-size bucket, stepped over candidate ks with hysteresis.

Source: SGLang's adaptive ``speculative_num_steps`` for EAGLE with topk = 1, PR #21599
("[SPEC][1/N] feat: add adaptive speculative_num_steps") and PR #24055 ("[SPEC][5/N]
batchsize-aware support"), file ``python/sglang/srt/speculative/adaptive_spec_params.py``
(with ``adaptive_step_router.py`` for the bucketing). This is a reimplementation from
those descriptions, not SGLang's code. One k for the whole batch (SGLang's num_steps is
per batch).

Rule (``strategy=ema``, SGLang's default strategy):

* Buckets. A batch of b requests belongs to the bucket with the largest lower bound
  <= b (bisect_right - 1 over the bounds, after padding b up to a captured CUDA-graph
  size; here the profile's measured batch sizes stand in for the captured sizes).
  PR #24055's defaults: b in [1, 64): ks (1, 3, 7), hysteresis up 0.0, down -0.25;
  [64, 128): ks (1, 2, 5), up 0.0, down 0.0; [128, inf): ks (1, 2, 6), up -0.1, down +0.25.
  Each bucket has its own EMA, its own current k and its own batch counter.
* EMA. After each verify step of a bucket, with m_i the accepted draft tokens of request
  i (bonus token excluded), alpha = 0.2:

      ema <- (1 - alpha) * ema + alpha * mean_i(m_i),      ema starts at k_start - 1

* Hysteresis. The first ``warmup`` = 10 steps of a bucket only update the EMA; after that,
  every ``interval`` = 5 steps, with ks = c_0 < c_1 < ... and current k = c_i:
  step down while  ema <= c_{i-1} - 0.5 + down  (repeatedly); if it did not step down,
  step up while    ema >  c_i - 0.5 + up.
  So with ks (1, 3, 7): 1 -> 3 once ema > 0.5, 3 -> 1 once ema <= 0.25, 3 -> 7 once
  ema > 2.5, 7 -> 3 once ema <= 2.25. The gap between the up and the down threshold of a
  pair (0.25 tokens at the default) is the margin inside which k never switches.

Rule (``strategy=throughput``, the throughput-aware strategy of SGLang's open PR #28045,
``throughput_aware_spec_params.py``): per position j, the survival p_j = share of the
step's requests with m_i > j, averaged over the last ``window`` = 20 steps that drafted
position j (shared by every bucket); positions never drafted are extrapolated
geometrically from the known ones. Every ``interval`` = 10 steps, once every position
< current k has a full window, each candidate k of the batch's bucket is scored

      score(k) = E[tokens | k drafted] / T(b, k),     E[tokens | k] = 1 + sum_{j<k} p_j

with T the offline step-time profile (SGLang profiles its own at start-up), and the
best one replaces the current k only if score(best) > (1 + 0.1) * score(current)
(``pick_best_step_with_hysteresis``; the PR's controller as read calls the plain
argmax, which is ``score_margin=0``). Going down clears the windows above the new k.

Assumed where the sources leave it open: k_start = 3 (SGLang starts at the server's
``speculative_num_steps``; a bucket whose candidates lack it starts at its middle
candidate); the up-step is skipped after a down-step (the later form of the rule; the
first PR checked both); candidates missing from the allowed ks map to the nearest
allowed k below.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.errors import InputError
from tabletune.policies.base import BatchState, Decision, PolicyContext, StepOutcome, nearest_k


@dataclass(frozen=True)
class Bucket:
    """One batch-size range [lower_bs, next bucket's lower_bs): its candidate ks and hysteresis."""

    lower_bs: int
    ks: tuple[int, ...]
    up: float = 0.0  # added to the step-up threshold c_i - 0.5
    down: float = -0.25  # added to the step-down threshold c_{i-1} - 0.5


#: PR #24055's default buckets.
DEFAULT_BUCKETS = (Bucket(1, (1, 3, 7), 0.0, -0.25), Bucket(64, (1, 2, 5), 0.0, 0.0), Bucket(128, (1, 2, 6), -0.1, 0.25))


@dataclass(frozen=True)
class SglangConfig:
    buckets: tuple[Bucket, ...] = DEFAULT_BUCKETS
    strategy: str = "ema"  # "ema" (PRs #21599, #24055) or "throughput" (PR #28045)
    k_start: int = 3
    ema_alpha: float = 0.2
    warmup: int = 10  # steps per bucket before the first decision (ema)
    interval: int = 0  # steps between decisions; 0: 5 for ema, 10 for throughput
    window: int = 20  # steps per position (throughput)
    score_margin: float = 0.1  # a challenger must beat the current score by this share (throughput)

    def __post_init__(self) -> None:
        if self.strategy not in ("ema", "throughput"):
            raise InputError("--policy", "sglang.strategy", self.strategy, "choose 'ema' or 'throughput'")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha must lie in (0, 1], got {self.ema_alpha}")
        if self.warmup < 0 or self.interval < 0 or self.window < 1 or self.score_margin < 0:
            raise ValueError("warmup and interval must be >= 0, window >= 1, score_margin >= 0")
        bounds = [b.lower_bs for b in self.buckets]
        if not bounds or bounds != sorted(set(bounds)) or any(not b.ks for b in self.buckets):
            raise ValueError(f"buckets need increasing lower bounds and candidate ks, got {self.buckets}")

    @property
    def every(self) -> int:
        return self.interval or (5 if self.strategy == "ema" else 10)


def bucket_index(batch_size: int, lower_bounds: tuple[int, ...], padded_sizes: tuple[int, ...] = ()) -> int:
    """The bucket of a batch: pad b up to the next padded size (if any), then bisect_right - 1 (floor 0)."""
    if padded_sizes:
        i = bisect.bisect_left(padded_sizes, batch_size)
        if i < len(padded_sizes):
            batch_size = padded_sizes[i]
    return max(bisect.bisect_right(lower_bounds, batch_size) - 1, 0)


def ema_update(ema: float, accepted: np.ndarray, alpha: float) -> float:
    """ema' = (1 - alpha) * ema + alpha * mean(accepted); accepted counts draft tokens, bonus excluded."""
    return (1.0 - alpha) * ema + alpha * float(np.mean(accepted))


def hysteresis_step(ema: float, k: int, ks: tuple[int, ...], up: float, down: float) -> int:
    """The next k: step down while ema <= c_{i-1} - 0.5 + down; else step up while ema > c_i - 0.5 + up."""
    i = ks.index(k)
    start = i
    while i > 0 and ema <= ks[i - 1] - 0.5 + down:
        i -= 1
    if i == start:
        while i < len(ks) - 1 and ema > ks[i] - 0.5 + up:
            i += 1
    return ks[i]


def survival_by_position(accepted: np.ndarray, k: int) -> np.ndarray:
    """[k] p_j = share of requests with more than j accepted draft tokens, j = 0..k-1."""
    m = np.asarray(accepted)
    return np.array([float(np.mean(m > j)) for j in range(k)])


def expected_tokens(rates: list[float | None], k: int) -> float | None:
    """E[tokens | k drafted] = 1 + sum_{j<k} p_j; a missing p_j is extrapolated geometrically.

    With known p_0..p_{n-1} (n >= 2), a = (p_{n-1} / p_0)^(1 / (n - 1)) and the missing
    p_j = min(p_last, p_last * a); with one known rate, p_j = p_0 (so at k = 1 any p_0 makes a
    long k look as good per position as the first; SGLang's rule, kept). None if none is known.
    """
    known: list[float] = []
    for j in range(k):
        p = rates[j] if j < len(rates) else None
        if p is None:
            if not known:
                return None
            if len(known) == 1 or known[0] <= 0:
                p = known[0] if len(known) == 1 else 0.0
            else:
                a = (known[-1] / known[0]) ** (1.0 / (len(known) - 1))
                p = max(0.0, min(known[-1], known[-1] * a))
        known.append(p)
    return 1.0 + sum(known)


def best_k_with_margin(scores: dict[int, float | None], current: int, margin: float) -> int:
    """argmax score (first of ties), kept at ``current`` unless score(best) > (1 + margin) score(current)."""
    valid = {k: s for k, s in scores.items() if s is not None}
    if not valid:
        return current
    best = max(valid, key=lambda k: (valid[k], -k))
    now = valid.get(current)
    if best == current or now is None or now <= 0 or valid[best] > now * (1.0 + margin):
        return best
    return current


@dataclass
class _Slot:
    """One bucket's running state (ema strategy)."""

    k: int
    ema: float
    steps: int = 0


class SglangPolicy:
    """SGLang-style adaptive num_steps: one k per batch from its bucket's EMA (or throughput score)."""

    name: ClassVar[str] = "sglang"
    uses_features: ClassVar[bool] = False
    observe_may_lag: ClassVar[bool] = True  # observe updates its bucket's EMA and k from the outcome alone
    decides_ahead: ClassVar[bool] = True  # its k needs the batch size and what it learnt, nothing of the last step

    def __init__(self, ctx: PolicyContext, strategy: str = "ema", k_start: int = 3, ema_alpha: float = 0.2,
                 warmup: int = 10, interval: int = 0, window: int = 20, score_margin: float = 0.1) -> None:
        self.ctx = ctx
        allowed = tuple(sorted(k for k in ctx.ks if k > 0)) or (0,)
        buckets = tuple(Bucket(b.lower_bs, tuple(sorted({nearest_k(k, allowed) for k in b.ks})), b.up, b.down)
                        for b in DEFAULT_BUCKETS)
        self.cfg = SglangConfig(buckets, strategy, k_start, ema_alpha, warmup, interval, window, score_margin)
        self.bounds = tuple(b.lower_bs for b in buckets)
        self.padded = tuple(sorted(ctx.cost.profile.batch_sizes))
        self.slots = [_Slot(k := self._start(b.ks), float(k - 1)) for b in buckets]
        self.k = self._start(buckets[0].ks)  # throughput strategy: one current k
        self.windows: list[deque[float]] = [deque(maxlen=window) for _ in range(max(allowed))]
        self.steps = 0
        self.label = "sglang" if strategy == "ema" else "sglang-throughput"

    def _start(self, ks: tuple[int, ...]) -> int:
        return self.cfg.k_start if self.cfg.k_start in ks else ks[len(ks) // 2]

    def bucket(self, batch_size: int) -> int:
        return bucket_index(batch_size, self.bounds, self.padded)

    def decide(self, state: BatchState) -> Decision:
        if self.cfg.strategy == "ema":
            return Decision.batch(self.slots[self.bucket(state.batch_size)].k)
        if self.steps > 0 and self.steps % self.cfg.every == 0 and self._warm(self.k):
            self._rescore(state.batch_size)
        return Decision.batch(self.k)

    def observe(self, outcome: StepOutcome) -> None:
        b = len(outcome.accepted)
        if b == 0:
            return
        if self.cfg.strategy == "throughput":
            k = int(outcome.ks.max())
            for j, p in enumerate(survival_by_position(outcome.accepted, min(k, len(self.windows)))):
                self.windows[j].append(float(p))
            self.steps += 1
            return
        bucket = self.buckets[self.bucket(b)]
        slot = self.slots[self.bucket(b)]
        if slot.k > 0:
            slot.ema = ema_update(slot.ema, outcome.accepted, self.cfg.ema_alpha)
        slot.steps += 1
        if slot.steps > self.cfg.warmup and (slot.steps - self.cfg.warmup) % self.cfg.every == 0:
            slot.k = hysteresis_step(slot.ema, slot.k, bucket.ks, bucket.up, bucket.down)

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return self.cfg.buckets

    def _warm(self, k: int) -> bool:
        return all(len(self.windows[j]) >= self.cfg.window for j in range(min(k, len(self.windows))))

    def _rescore(self, batch_size: int) -> None:
        rates = [float(np.mean(w)) if w else None for w in self.windows]
        scores = {}
        for k in self.buckets[self.bucket(batch_size)].ks:
            e = expected_tokens(rates, k)
            scores[k] = None if e is None else e / self.ctx.cost.step_ms(batch_size, k)
        best = best_k_with_margin(scores, self.k, self.cfg.score_margin)
        if best < self.k:
            for w in self.windows[best:]:
                w.clear()
        self.k = best
