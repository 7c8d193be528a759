"""Simulation results: per-step log, per-request log, and the summary metrics.

Conventions:

* throughput_tok_s = output tokens emitted by decode steps / simulated time of the run
  (the run starts at 0 and ends when the last step that started before ``duration_s`` ends);
* mean_k = mean over steps of the batch's mean verified draft length;
* acceptance = accepted draft tokens / verified draft tokens (bonus tokens excluded);
* TPOT = (finish - first decode step end) / (output tokens - 1) per finished request;
  latency = finish - arrival (queueing and prefill included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class StepLog:
    start_s: np.ndarray  # [steps] step start time
    step_ms: np.ndarray  # [steps] step time including prefill piggy-backed on it
    batch_size: np.ndarray  # [steps]
    mean_k: np.ndarray  # [steps] mean verified draft length over the batch
    tokens: np.ndarray  # [steps] output tokens emitted
    drafted: np.ndarray  # [steps] draft tokens verified
    accepted: np.ndarray  # [steps] draft tokens accepted
    host_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [steps] host time charged (in step_ms)


@dataclass(frozen=True)
class RequestLog:
    arrival_s: np.ndarray  # [finished]
    first_token_s: np.ndarray  # [finished]
    finish_s: np.ndarray  # [finished]
    num_tokens: np.ndarray  # [finished]


@dataclass(frozen=True)
class SimResult:
    policy: str
    duration_s: float  # simulated time covered (end of the last step)
    steps: StepLog
    requests: RequestLog

    @property
    def num_steps(self) -> int:
        return len(self.steps.step_ms)

    @property
    def throughput_tok_s(self) -> float:
        return float(self.steps.tokens.sum()) / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def mean_k(self) -> float:
        return float(self.steps.mean_k.mean()) if self.num_steps else 0.0

    @property
    def acceptance(self) -> float:
        drafted = float(self.steps.drafted.sum())
        return float(self.steps.accepted.sum()) / drafted if drafted else 0.0

    @property
    def tpot_ms(self) -> float:
        r = self.requests
        ok = r.num_tokens > 1
        if not ok.any():
            return float("nan")
        per = (r.finish_s[ok] - r.first_token_s[ok]) * 1000.0 / (r.num_tokens[ok] - 1)
        return float(per.mean())

    def latency_s(self, q: float) -> float:
        if len(self.requests.finish_s) == 0:
            return float("nan")
        return float(np.percentile(self.requests.finish_s - self.requests.arrival_s, q))

    def window_throughput(self, window_s: float) -> np.ndarray:
        """Output tokens/s in consecutive windows [i*w, (i+1)*w), by step end time."""
        ends = self.steps.start_s + self.steps.step_ms / 1000.0
        num = int(np.ceil(self.duration_s / window_s - 1e-9))
        idx = np.minimum((ends // window_s).astype(int), num - 1)
        tokens = np.bincount(idx, weights=self.steps.tokens, minlength=num)
        return tokens / window_s

    def summary(self) -> dict:
        """JSON-able metrics; undefined ones (no finished request) are None."""
        out = self._summary()
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in out.items()}

    def _summary(self) -> dict:
        return {
            "policy": self.policy,
            "throughput_tok_s": round(self.throughput_tok_s, 3),
            "mean_k": round(self.mean_k, 4),
            "steps": self.num_steps,
            "acceptance": round(self.acceptance, 4),
            "tokens_per_step_per_request": round(
                float(self.steps.tokens.sum()) / max(float(self.steps.batch_size.sum()), 1.0), 4),
            "mean_batch_size": round(float(self.steps.batch_size.mean()) if self.num_steps else 0.0, 3),
            "tpot_ms": round(self.tpot_ms, 4),
            "latency_p50_s": round(self.latency_s(50), 4),
            "latency_p90_s": round(self.latency_s(90), 4),
            "latency_p99_s": round(self.latency_s(99), 4),
            "finished_requests": int(len(self.requests.finish_s)),
            "duration_s": round(self.duration_s, 4),
        }
