"""The event loop of ``Simulator.run``: one iteration per decode step (see ``simulator`` for the model)."""

from __future__ import annotations

from collections import deque

import numpy as np

from tabletune.policies.base import (ALWAYS_DRAFT, NGRAM, BatchState, DraftFeatures, DraftStop, Policy, StepOutcome,
                                     draft_stop_of)
from tabletune.policies.per_request import features_upto
from tabletune.sim import acceptance as acc
from tabletune.sim import ngram
from tabletune.sim.metrics import RequestLog, SimResult, StepLog
from tabletune.sim.requests import RunningRequests


class _Run:
    """Mutable state of one run."""

    def __init__(self, sim, policy: Policy) -> None:
        self.sim, self.policy, self.cfg = sim, policy, sim.config
        # three independent streams (common random numbers across policies): request attributes
        # in id order, arrival times, and per-step acceptance draws
        self.rng = np.random.default_rng([self.cfg.seed, 0])
        self.rng_req = np.random.default_rng([self.cfg.seed, 1])
        self.rng_arrival = np.random.default_rng([self.cfg.seed, 2])
        self.reqs = RunningRequests(sim.k_max)
        self.queue: deque[dict] = deque()  # open loop: waiting single requests
        self.next_id = 0
        self.time_s = 0.0
        self.prefill_ms = 0.0
        self.next_arrival_s = 0.0
        self.steps: list[tuple] = []
        self.done: list[tuple] = []
        self.uses_features = bool(getattr(policy, "uses_features", False))
        self.draft_stop = draft_stop_of(policy)
        self.sees_fate = bool(getattr(policy, "sees_fate", False))
        # span state matters only when an n-gram drafter can be chosen
        self.track_ngram = sim.default_drafter == NGRAM or self.uses_features
        self._consts: dict[tuple[int, int], np.ndarray] = {}
        self._no_ids = np.zeros(0, np.int64)
        self.new_first = False  # some running request has not emitted a token yet
        self.external = False  # a fleet routes arrivals into ``queue`` (``tabletune.sim.fleet``)

    # ---- arrivals and admission ---------------------------------------------

    def add(self, n: int, *, charge_prefill: bool = True) -> None:
        if n <= 0:
            return
        new = self.sim.new_requests(n, self.time_s, self.rng_req, self.next_id)
        self.next_id += n
        if charge_prefill:
            self.prefill_ms += float(new["prompt_len"].sum()) * self.cfg.prefill_ms_per_token
        self.reqs.extend(new)
        self.new_first = True

    def admit(self) -> None:
        cfg = self.cfg
        if self.external:
            pass
        elif cfg.arrival_rate is None:
            self.add(cfg.load - len(self.reqs), charge_prefill=self.time_s > 0)
            return
        while not self.external and self.next_arrival_s <= self.time_s:  # Poisson arrivals up to now
            self.queue.append(self.sim.new_requests(1, self.next_arrival_s, self.rng_req, self.next_id))
            self.next_id += 1
            self.next_arrival_s += self.rng_arrival.exponential(1.0 / cfg.arrival_rate)
        while self.queue and len(self.reqs) < cfg.max_num_seqs:
            new = self.queue.popleft()
            self.prefill_ms += float(new["prompt_len"].sum()) * cfg.prefill_ms_per_token
            self.reqs.extend(new)
            self.new_first = True

    # ---- one step --------------------------------------------------------------

    def state(self, margin: np.ndarray | None, ng_prop: np.ndarray, ng_len: np.ndarray,
              replayed: tuple[np.ndarray, ...] | None = None) -> BatchState:
        features = None
        if replayed is not None and self.uses_features:
            features = DraftFeatures(*replayed, ng_len, ng_prop)
        elif self.uses_features:
            noise = self.sim._w["signal_noise"][self.reqs.widx][:, None]
            top1, entropy, margin12, _ = acc.confidence_features(margin, noise, self.rng)
            features = DraftFeatures(top1, entropy, margin12, ng_len, ng_prop)
        lookup = (ng_len, ng_prop) if self.track_ngram else (None, None)
        return BatchState(len(self.steps), self.time_s, self.reqs.ids, self.reqs.generated, features, *lookup)

    def _const(self, b: int, value: int) -> np.ndarray:
        """A cached read-only [b] int array filled with value (uniform k, default drafter)."""
        key = (b, value)
        arr = self._consts.get(key)
        if arr is None:
            arr = self._consts[key] = np.full(b, value, np.int64)
            arr.flags.writeable = False
        return arr

    def step(self) -> None:
        reqs, sim, rng = self.reqs, self.sim, self.rng
        b, k_max = len(reqs), sim.k_max
        ng_ok = None
        if self.track_ngram and sim.ngram_replay is not None:  # proposals and outcomes from the n-gram trace
            ng_ok, ng_prop, ng_len = sim.ngram_replay.window(reqs.trace_pos, k_max)
        elif self.track_ngram:
            ng_prop, ng_len = ngram.propose(reqs.span_left, reqs.match_len,
                                            sim._w["spurious_match_prob"][reqs.widx], k_max, rng)
        else:
            ng_prop = ng_len = self._const(b, 0)
        replayed = None
        if sim.replay is not None:  # outcomes and signals from traces; a margin of +-1 encodes accept/reject
            ok, *replayed = sim.replay.window(reqs.trace_pos, k_max)
            margin = np.where(ok, 1.0, -1.0)
        else:
            margin = acc.draw_margins(reqs.logits, rng) if self.uses_features else None
        state = self.state(margin, ng_prop, ng_len, replayed)
        if self.sees_fate:  # the headroom oracle (``tabletune.sim.oracle``) is told each draft's fate
            self.policy.fate = (margin > 0).cumprod(axis=1).sum(axis=1)  # type: ignore[attr-defined]
            self.policy.fate_ngram = (None if ng_ok is None else  # type: ignore[attr-defined]
                                      np.minimum(ng_ok.cumprod(axis=1).sum(axis=1), ng_prop))
        stops = self.draft_stop is not ALWAYS_DRAFT
        # a stop rule decides before drafting (no model signal yet; ``BatchState.before_drafting``)
        decision = self.policy.decide(state.before_drafting() if stops else state)
        if decision.ks is None and decision.drafter is None and sim.default_drafter != NGRAM and margin is None:
            self.uniform_step(state, min(max(int(decision.k), 0), k_max))  # type: ignore[arg-type]
            return
        ks = np.minimum(np.maximum(decision.ks_for(b), 0), k_max)
        drafter = decision.drafter if decision.drafter is not None else self._const(b, sim.default_drafter)
        free = None
        if stops:  # the draft ends row by row (``DraftStop``), on the signals drafted so far
            # a row given the n-gram chain (beside a model default) takes no model drafting: the lookup proposes
            free = (drafter == NGRAM) & (sim.default_drafter != NGRAM)
            drafted = draft_until_stopped(self.draft_stop, state, np.where(free, 0, ks))
            ks = np.where(free, ks, drafted)
        elif self.uses_features and sim.default_drafter != NGRAM:  # it read every position's signals: all drafted
            drafted = self._const(b, k_max)
        else:
            drafted = ks
        is_ng = drafter == NGRAM
        if is_ng.any():
            ks = np.where(is_ng, np.minimum(ks, ng_prop), ks)
        width = int(ks.max()) if b else 0
        accepted = self._const(b, 0)
        if width > 0:
            if margin is None:
                margin = acc.draw_margins(reqs.logits[:, :width], rng)
            m = margin[:, :width]
            if is_ng.any():
                ng_m = (np.where(ng_ok[:, :width], 1.0, -1.0) if ng_ok is not None
                        else ngram.margins(reqs.span_left, ng_len, width, rng))
                m = np.where(is_ng[:, None], ng_m, m)
            accepted = acc.accepted_count(m, ks)
        kl = None
        if self.uses_features and margin is not None and sim.replay is None:
            kl = acc.kl_divergence(margin, rng)
            kl[np.arange(k_max)[None, :] >= ks[:, None]] = np.nan
        step_ms = (sim.cost.mixed_ms(ks, drafted, free) if free is not None
                   else sim.cost.mixed_ms(ks, np.maximum(drafted, ks)))
        self.finish_step(state, ks, drafter, accepted, kl, step_ms, int(ks.sum()))

    def uniform_step(self, state: BatchState, k: int) -> None:
        """Fast path: one k for every request, model drafter, no features."""
        b = len(self.reqs)
        if k > 0:
            ok = acc.draw_margins(self.reqs.logits[:, :k], self.rng) > 0
            accepted = ok.cumprod(axis=1).sum(axis=1)  # leading run of accepted positions
        else:
            accepted = self._const(b, 0)
        ks = self._const(b, k)
        self.finish_step(state, ks, self._const(b, self.sim.default_drafter), accepted, None,
                         self.sim.cost.step_ms(b, k), k * b)

    def finish_step(self, state: BatchState, ks: np.ndarray, drafter: np.ndarray, accepted: np.ndarray,
                    kl: np.ndarray | None, step_ms: float, num_drafted: int) -> None:
        reqs, cfg, sim = self.reqs, self.cfg, self.sim
        if cfg.noise_cv > 0:
            sigma2 = np.log1p(cfg.noise_cv ** 2)
            step_ms *= float(np.exp(self.rng.normal(-sigma2 / 2, np.sqrt(sigma2))))
        total_ms = step_ms + self.prefill_ms + cfg.host_ms_per_step
        self.prefill_ms = 0.0
        end_s = self.time_s + total_ms / 1000.0
        tokens = np.minimum(accepted + 1, reqs.out_len - reqs.generated)
        reqs.generated = reqs.generated + tokens
        if sim.replay is not None or sim.ngram_replay is not None:
            reqs.trace_pos = reqs.trace_pos + tokens
        if self.new_first:  # requests that emitted their first tokens in this step
            reqs.first_s = np.where(np.isnan(reqs.first_s), end_s, reqs.first_s)
            self.new_first = False
        if self.track_ngram:
            w = sim._w
            reqs.span_left, reqs.match_len = ngram.advance(
                reqs.span_left, reqs.match_len, tokens, w["span_start_prob"][reqs.widx],
                w["span_mean_len"][reqs.widx], self.rng)
        fin = reqs.generated >= reqs.out_len
        b = len(ks)
        num_tokens = int(tokens.sum())
        self.steps.append((self.time_s, total_ms, b, num_drafted / b if b else 0.0, num_tokens,
                           num_drafted, int(accepted.sum()) if num_drafted else 0))
        finished_ids = self._no_ids
        if fin.any():
            finished_ids = reqs.ids[fin]
            self.done.append((reqs.arrival_s[fin], reqs.first_s[fin], np.full(len(finished_ids), end_s),
                              reqs.generated[fin]))
            reqs.keep(~fin)
        self.policy.observe(StepOutcome(state=state, ks=ks, drafter=drafter, accepted=accepted, step_ms=step_ms,
                                        kl=kl, finished_ids=finished_ids))
        self.time_s = end_s

    def idle_until_arrival(self) -> None:
        """Open loop with nothing running: jump to the next arrival."""
        self.time_s = max(self.time_s, self.next_arrival_s)

    def result(self) -> SimResult:
        cols = list(zip(*self.steps)) if self.steps else [[]] * 7
        steps = StepLog(*(np.array(c, dtype=float) for c in cols))
        if self.done:
            parts = [np.concatenate(x) for x in zip(*self.done)]
        else:
            parts = [np.zeros(0)] * 4
        requests = RequestLog(*parts)
        name = getattr(self.policy, "label", None) or getattr(self.policy, "name", type(self.policy).__name__)
        return SimResult(policy=str(name), duration_s=self.time_s, steps=steps, requests=requests)


def draft_until_stopped(stop: DraftStop, state: BatchState, caps: np.ndarray) -> np.ndarray:
    """[batch_size] tokens drafted when every row drafts position by position until ``stop`` ends it.

    Row i drafts position j while it is active; after position j (the signals of positions 1..j
    only) ``stop.keep_drafting`` says which active rows draft j + 1. A row also stops at its cap
    ``caps[i]`` (the policy's decided length); the loop ends when no row is active.
    """
    drafted = np.zeros(len(caps), np.int64)
    active = caps >= 1
    top = int(caps.max()) if len(caps) else 0
    f = state.features
    for j in range(1, top + 1):
        drafted += active
        if j == top:
            break
        active = active & (caps > j)
        if not active.any():
            break
        active = active & stop.keep_drafting(state, None if f is None else features_upto(f, j), j, active)
    return drafted


def run_loop(sim, policy: Policy) -> SimResult:
    run = _Run(sim, policy)
    if sim.config.arrival_rate is None:
        run.add(sim.config.load, charge_prefill=False)  # warm start: the initial requests are prefilled
    else:
        run.next_arrival_s = run.rng_arrival.exponential(1.0 / sim.config.arrival_rate)
    while run.time_s < sim.config.duration_s:
        run.admit()
        if len(run.reqs) == 0:
            run.idle_until_arrival()
            continue
        run.step()
    return run.result()
