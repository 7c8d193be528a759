"""The event loop of ``Simulator.run``: one iteration per decode step (see ``simulator`` for the model).

A step reads top-down in ``_Run.step``: decide, draft, verify, account. Its random draws (margins, signals, n-gram
lookups and spans) belong to one ``sim.step.StepDraws``, which keeps their order.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tabletune.policies.base import ALWAYS_DRAFT, NGRAM, BatchState, DraftStop, Policy, StepOutcome, draft_stop_of
from tabletune.policies.per_request import features_upto
from tabletune.sim.metrics import RequestLog, SimResult, StepLog
from tabletune.sim.requests import RunningRequests
from tabletune.sim.step import StepDraws


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
        # span state matters only when an n-gram drafter can be chosen (or its lookup is read: ``uses_lookup``)
        uses_lookup = bool(getattr(policy, "uses_lookup", False))
        self.track_ngram = sim.default_drafter == NGRAM or self.uses_features or uses_lookup
        # a stop rule, or a policy that plans on the lookup, decides before drafting (``BatchState.before_drafting``)
        self.stops = self.draft_stop is not ALWAYS_DRAFT
        self.plans_first = self.stops or uses_lookup
        # an engine drafts position by position, then verifies (a split step, ``StepCost.split_ms``), where something
        # is read in between: a stop rule, the drafted signals (else where free rows outrun the model rows). The
        # headroom oracle reads nothing: it knows each draft's fate before drafting, so its plan could run fused
        self.reads_between = ((self.stops or (self.uses_features and sim.default_drafter != NGRAM))
                              and not self.sees_fate)
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

    def _const(self, b: int, value: int) -> np.ndarray:
        """A cached read-only [b] int array filled with value (uniform k, default drafter)."""
        key = (b, value)
        arr = self._consts.get(key)
        if arr is None:
            arr = self._consts[key] = np.full(b, value, np.int64)
            arr.flags.writeable = False
        return arr

    def step(self) -> None:
        """One decode step of the running batch: decide, draft, verify, account."""
        sim, b = self.sim, len(self.reqs)
        draws = StepDraws(sim, self.reqs, self.rng, self.track_ngram, self.uses_features, self._const(b, 0))
        state = draws.state(len(self.steps), self.time_s)
        if self.sees_fate:  # the headroom oracle (``tabletune.sim.oracle``) is told each draft's fate
            self.policy.fate, self.policy.fate_ngram = draws.fates()  # type: ignore[attr-defined]
        # the host time charged: ``host_ms_lookup_step`` on a step decided on the lookup (a policy planning on it,
        # on a step it does not decide ahead: an engine decides such a step after the last read-back)
        host_ms = self.cfg.host_ms_per_step
        if (self.cfg.host_ms_lookup_step is not None and self.plans_first
                and not getattr(self.policy, "decides_ahead", False)):
            host_ms = self.cfg.host_ms_lookup_step
        decision = self.policy.decide(state.before_drafting() if self.plans_first else state)
        # draft
        if decision.ks is None and decision.drafter is None and sim.default_drafter != NGRAM and draws.margin is None:
            k = min(max(int(decision.k), 0), sim.k_max)  # type: ignore[arg-type]
            ks, drafter = self._const(b, k), self._const(b, sim.default_drafter)  # one k, model drafter
            step_ms = sim.cost.step_ms(b, k)
        else:
            ks, drafter, step_ms = self.draft(decision, state, draws.ng_prop)
        # verify
        accepted = draws.accepted(ks, drafter == NGRAM)
        kl = draws.kl(ks)
        # account
        self.finish_step(state, ks, drafter, accepted, kl, step_ms, int(ks.sum()), draws, host_ms)

    def draft(self, decision, state: BatchState, ng_prop: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(k_i verified, drafter per row, step ms) of a per-row decision: a stop rule ends rows' drafts on the
        signals drafted so far; n-gram rows verify at most the lookup's proposals."""
        sim, b, k_max = self.sim, len(self.reqs), self.sim.k_max
        ks = np.minimum(np.maximum(decision.ks_for(b), 0), k_max)
        drafter = decision.drafter if decision.drafter is not None else self._const(b, sim.default_drafter)
        free = None
        if self.plans_first:  # planned before drafting: a stop rule ends the draft row by row, on the signals drafted so far
            # a row given the n-gram chain (beside a model default) takes no model drafting: the lookup proposes
            free = (drafter == NGRAM) & (sim.default_drafter != NGRAM)
            caps = np.where(free, 0, ks)
            drafted = draft_until_stopped(self.draft_stop, state, caps) if self.stops else caps
            ks = np.where(free, ks, drafted)
            # a launch that fixed the model's drafting depth before the plan was made (a plan decided on the
            # device, inside a graph captured at that depth): every model row drafts it, whatever it verifies
            depth = getattr(self.policy, "launch_depth", None)
            if depth is not None:
                drafted = np.where(free, 0, np.maximum(drafted, int(depth)))
        elif self.uses_features and sim.default_drafter != NGRAM:  # it read every position's signals: all drafted
            drafted = self._const(b, k_max)
        else:
            drafted = ks
        is_ng = drafter == NGRAM
        if is_ng.any():
            ks = np.where(is_ng, np.minimum(ks, ng_prop), ks)
        reads = self.reads_between
        step_ms = (sim.cost.mixed_ms(ks, drafted, free, split_extra=not reads) if free is not None
                   else sim.cost.mixed_ms(ks, np.maximum(drafted, ks)))
        positions = int(np.max(drafted, initial=0))
        if reads and positions > 0:
            # split, and read back once before verifying; a stop rule on the host also after every position before
            step_ms += sim.cost.split_ms(b) + sim.cost.read_ms(b)
            if self.stops and not self._stop_on_device(state):
                step_ms += sim.cost.position_read_ms(b) * (positions - 1)
        return ks, drafter, step_ms

    def _stop_on_device(self, state: BatchState) -> bool:
        """Whether an engine evaluates this step's stop rule on the device (the policy gives it as numbers,
        ``device_stop_rule``): then it reads the drafted lengths once, not the signals after every position."""
        rule_of = getattr(self.draft_stop, "device_stop_rule", None)
        return rule_of is not None and rule_of(state) is not None

    def finish_step(self, state: BatchState, ks: np.ndarray, drafter: np.ndarray, accepted: np.ndarray,
                    kl: np.ndarray | None, step_ms: float, num_drafted: int, draws: StepDraws,
                    host_ms: float) -> None:
        reqs, cfg, sim = self.reqs, self.cfg, self.sim
        if cfg.noise_cv > 0:
            sigma2 = np.log1p(cfg.noise_cv ** 2)
            step_ms *= float(np.exp(self.rng.normal(-sigma2 / 2, np.sqrt(sigma2))))
        prefill_ms, self.prefill_ms = self.prefill_ms, 0.0
        total_ms = step_ms + prefill_ms + host_ms
        end_s = self.time_s + total_ms / 1000.0
        tokens = np.minimum(accepted + 1, reqs.out_len - reqs.generated)
        reqs.generated = reqs.generated + tokens
        if sim.replay is not None or sim.ngram_replay is not None:
            reqs.trace_pos = reqs.trace_pos + tokens
        if self.new_first:  # requests that emitted their first tokens in this step
            reqs.first_s = np.where(np.isnan(reqs.first_s), end_s, reqs.first_s)
            self.new_first = False
        draws.advance_spans(tokens)
        fin = reqs.generated >= reqs.out_len
        b = len(ks)
        num_tokens = int(tokens.sum())
        self.steps.append((self.time_s, total_ms, b, num_drafted / b if b else 0.0, num_tokens,
                           num_drafted, int(accepted.sum()) if num_drafted else 0, host_ms))
        finished_ids = self._no_ids
        if fin.any():
            finished_ids = reqs.ids[fin]
            self.done.append((reqs.arrival_s[fin], reqs.first_s[fin], np.full(len(finished_ids), end_s),
                              reqs.generated[fin]))
            reqs.keep(~fin)
        self.policy.observe(StepOutcome(state=state, ks=ks, drafter=drafter, accepted=accepted, step_ms=step_ms,
                                        kl=kl, finished_ids=finished_ids, end_s=end_s,
                                        prefill_ms=prefill_ms))
        self.time_s = end_s

    def idle_until_arrival(self) -> None:
        """Open loop with nothing running: jump to the next arrival."""
        self.time_s = max(self.time_s, self.next_arrival_s)

    def result(self) -> SimResult:
        cols = list(zip(*self.steps)) if self.steps else [[]] * 8
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
