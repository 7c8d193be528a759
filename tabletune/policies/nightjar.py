"""Nightjar-style: a multi-armed bandit per batch-size bucket over k = 0..K, rewarded by measured tokens/s.

Source: Li et al., "Nightjar: Dynamic Adaptive Speculative Decoding for Large
Language Models Serving", arXiv 2512.22420 (a MAB planner picks the speculative
length per batch size and disables speculation when it does not pay; restarting
speculation has a cost). Rule:

* buckets: b in [2^i, 2^(i+1)) share one bandit;
* arms: the allowed k (0 = speculation off); an arm is held for ``window`` steps and
  its reward is the window's tokens/s, tokens / sum of step times (both measured);
* choice (UCB1 on rewards normalised by the bucket's best mean so far):
  score(k) = mean(k) / best + c * sqrt(ln n / n_k), each arm tried once first;
* switching speculation back on (from k = 0 to k > 0) must beat staying off by
  ``restart_penalty`` (a share of the normalised reward), Nightjar's restart cost.

What this "-style" version assumes: the paper's exact bandit and constants are not
public in detail; UCB1 with c = ``c`` (default 0.1), a 16-step window and a 5% restart
penalty are ours. Draft-model offloading to the CPU is not modelled (the simulator has
no KV-cache pressure), nor is the catch-up cost itself, only its penalty in the choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from tabletune.policies.base import BatchPolicy, BatchState, PolicyContext, StepOutcome


@dataclass
class _Bandit:
    ks: tuple[int, ...]  # the arms: the allowed k
    total: dict[int, float] = field(default_factory=dict)  # sum of window rewards per arm
    count: dict[int, int] = field(default_factory=dict)

    def mean(self, k: int) -> float:
        return self.total[k] / self.count[k]

    def choose(self, c: float, current: int | None, restart_penalty: float) -> int:
        for k in self.ks:
            if self.count.get(k, 0) == 0:
                return k
        n = sum(self.count.values())
        best = max(self.mean(k) for k in self.ks) or 1.0
        scores = {k: self.mean(k) / best + c * math.sqrt(math.log(n) / self.count[k]) for k in self.ks}
        if current == 0:
            scores = {k: s - (restart_penalty if k > 0 else 0.0) for k, s in scores.items()}
        return max(self.ks, key=lambda k: (scores[k], -k))

    def reward(self, k: int, value: float) -> None:
        self.total[k] = self.total.get(k, 0.0) + value
        self.count[k] = self.count.get(k, 0) + 1


class Nightjar(BatchPolicy):
    name: ClassVar[str] = "nightjar"

    def __init__(self, ctx: PolicyContext, window: int = 16, c: float = 0.1, restart_penalty: float = 0.05) -> None:
        super().__init__(ctx)
        if window < 1 or c < 0 or restart_penalty < 0:
            raise ValueError("window must be >= 1, c and restart_penalty >= 0")
        self.window, self.c, self.restart_penalty = int(window), float(c), float(restart_penalty)
        self.bandits: dict[int, _Bandit] = {}
        self.k = max(ctx.ks)
        self.bucket: int | None = None
        self.left = 0  # steps left in the current window
        self._tokens = 0
        self._ms = 0.0
        self.label = "nightjar"

    def k_for(self, state: BatchState) -> int:
        bucket = max(state.batch_size, 1).bit_length() - 1
        if bucket != self.bucket or self.left <= 0:
            self._close_window()
            bandit = self.bandits.setdefault(bucket, _Bandit(tuple(sorted(self.ctx.ks))))
            self.k = bandit.choose(self.c, self.k if bucket == self.bucket else None, self.restart_penalty)
            self.bucket, self.left = bucket, self.window
        self.left -= 1
        return self.k

    def _close_window(self) -> None:
        """Reward the arm held for the (possibly cut short) window that just ended."""
        if self.bucket is not None and self._ms > 0:
            self.bandits[self.bucket].reward(self.k, self._tokens * 1000.0 / self._ms)
        self._tokens, self._ms = 0, 0.0

    def observe(self, outcome: StepOutcome) -> None:
        self._tokens += outcome.num_tokens
        self._ms += outcome.step_ms
