"""Continuous-batching discrete-event serving simulator (pure numpy).

Each event is one decode step of the running batch (every running request verifies
its draft and emits accepted + 1 tokens, vLLM's continuous batching):

1. admit waiting requests up to ``max_num_seqs``; their prefill, prompt_len *
   ``prefill_ms_per_token`` (a stated simple model: chunked prefill piggy-backed on the
   next decode step), is added to that step's time;
2. the policy decides the draft lengths (``tabletune.policies.base``);
3. acceptance is drawn (``tabletune.sim.step``: ``acceptance``, ``ngram``), or
   replayed with its signals from measured traces (``tabletune.sim.replay``; n-gram
   proposals and outcomes too, with ``ngram_replay``);
4. the step takes ``StepCost.mixed_ms(ks)`` (= T(b, k) for a uniform k) times a
   mean-one lognormal noise of coefficient of variation ``noise_cv``;
5. each request emits min(accepted + 1, tokens left) tokens; finished requests leave;
   the policy observes the outcome.

Load: closed loop (``load`` requests always open; a finished one is replaced at once,
and the run starts with them prefilled) or open loop (Poisson arrivals at
``arrival_rate`` requests/s, starting empty). Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabletune.cost import StepCost
from tabletune.policies.base import Policy, PolicyContext
from tabletune.sim import acceptance as acc
from tabletune.sim import ngram
from tabletune.sim.loop import run_loop
from tabletune.sim.metrics import SimResult
from tabletune.sim.replay import NgramStreams, TraceStreams
from tabletune.sim.workload import Schedule


@dataclass(frozen=True)
class SimConfig:
    duration_s: float = 60.0
    load: int = 32  # closed loop: open requests
    arrival_rate: float | None = None  # open loop: Poisson requests/s (load is then ignored)
    max_num_seqs: int = 128
    prefill_ms_per_token: float = 0.02
    noise_cv: float = 0.0
    seed: int = 0
    host_ms_per_step: float = 0.0  # the policy's host time a step (decide, stops, observe), charged serially
    # charged instead on a step decided on the n-gram lookup (a policy that plans on it, on a step it does not decide
    # ahead: ``decides_ahead`` False when asked); None: host_ms_per_step on every step
    host_ms_lookup_step: float | None = None

    def __post_init__(self) -> None:
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.arrival_rate is None and not 1 <= self.load <= self.max_num_seqs:
            raise ValueError(f"load must lie in 1..max_num_seqs={self.max_num_seqs}, got {self.load}")
        if self.arrival_rate is not None and self.arrival_rate <= 0:
            raise ValueError(f"arrival_rate must be > 0, got {self.arrival_rate}")
        if (self.noise_cv < 0 or self.prefill_ms_per_token < 0 or self.host_ms_per_step < 0
                or (self.host_ms_lookup_step is not None and self.host_ms_lookup_step < 0)):
            raise ValueError("noise_cv, prefill_ms_per_token, host_ms_per_step and host_ms_lookup_step must be >= 0")


class Simulator:
    def __init__(self, cost: StepCost, schedule: Schedule, config: SimConfig, *,
                 default_drafter: int = 0, replay: TraceStreams | None = None,
                 ngram_replay: NgramStreams | None = None) -> None:
        self.cost, self.schedule, self.config = cost, schedule, config
        self.default_drafter = default_drafter
        self.replay = replay  # model drafter outcomes and signals from traces (``tabletune.sim.replay``)
        self.ngram_replay = ngram_replay  # n-gram proposals and outcomes from a trace, instead of the span model
        self.k_max = min(schedule.k_max, cost.k_max)
        ws = schedule.workloads
        self.thetas = [acc.calibrate_logits(w.rates[: self.k_max], w.heterogeneity) for w in ws]
        self._w = {name: np.array([getattr(w, name) for w in ws], dtype=float)
                   for name in ("span_start_prob", "span_mean_len", "spurious_match_prob", "signal_noise")}

    def context(self, prior_rates: tuple[float, ...] | None = None, ks: tuple[int, ...] | None = None,
                seed: int | None = None, prior_draft_rate: float = 1.0) -> PolicyContext:
        """A PolicyContext for this simulation (prior: the first workload's rates unless given)."""
        first = self.schedule.workloads[0]
        return PolicyContext(
            cost=self.cost,
            prior_rates=tuple(prior_rates if prior_rates is not None else first.rates[: self.k_max]),
            ks=tuple(ks if ks is not None else [k for k in self.cost.ks if k <= self.k_max]),
            max_num_seqs=self.config.max_num_seqs,
            default_drafter=self.default_drafter,
            seed=self.config.seed if seed is None else seed,
            ngram_rates=ngram.calibration_rates(first.span_mean_len),
            prior_draft_rate=prior_draft_rate,
        )

    def new_requests(self, n: int, time_s: float, rng: np.random.Generator, next_id: int) -> dict[str, np.ndarray]:
        """n requests arriving at time_s. ``rng`` is the request stream: it is consumed in request-id
        order (3 variates per request), so request i gets the same draws under every policy."""
        i = self.schedule.index_at(time_s)
        w = self.schedule.workloads[i]
        z, u_out, u_prompt = rng.standard_normal(n), rng.random(n), rng.random(n)
        out_len = _geometric(u_out, w.output_len_mean) if w.output_len is None else np.full(n, w.output_len)
        prompt_len = _geometric(u_prompt, w.prompt_len_mean) if w.prompt_len_mean > 0 else np.zeros(n, np.int64)
        streams = self.replay if self.replay is not None else self.ngram_replay
        ids = np.arange(next_id, next_id + n, dtype=np.int64)
        trace_pos = streams.first_positions(ids, rng) if streams is not None else np.zeros(n, np.int64)
        return {
            "ids": ids,
            "widx": np.full(n, i, np.int64),
            "logits": self.thetas[i][None, :] + w.heterogeneity * z[:, None],
            "out_len": out_len.astype(np.int64),
            "generated": np.zeros(n, np.int64),
            "arrival_s": np.full(n, time_s),
            "first_s": np.full(n, np.nan),
            "span_left": np.zeros(n, np.int64),
            "match_len": np.zeros(n, np.int64),
            "prompt_len": prompt_len,
            "trace_pos": trace_pos.astype(np.int64),
        }

    def run(self, policy: Policy) -> SimResult:
        return run_loop(self, policy)


def _geometric(u: np.ndarray, mean: float) -> np.ndarray:
    """Geometric on 1, 2, ... with the given mean, by inversion of uniforms u."""
    if mean <= 1.0:
        return np.ones(len(u), np.int64)
    return np.ceil(np.log1p(-u) / np.log1p(-1.0 / mean)).clip(min=1).astype(np.int64)
