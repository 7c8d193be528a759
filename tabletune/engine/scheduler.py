"""Continuous batching over a ``SpecEngine`` driven by any ``tabletune.policies`` policy (docs/engine.md).

Each step, as in the simulator (``tabletune.sim.loop``): the policy ``decide``s one k or a k_i (and a drafter kind)
per row of the running ``BatchState``; the engine runs one ragged step; the policy ``observe``s a ``StepOutcome``.
A policy that reads draft signals (``uses_features``) or ends drafts (``keep_drafting``) runs on an engine with
split steps, whose draft loop drafts one position at a time for the rows still drafting. A stop rule decides first
and its k_i cap the rows; a feature policy without one drafts up to k_max (or ``draft_cap(state)``), then decides.
Positions a row did not draft read as sure rejections; a row is verified on at most what it drafted. A policy that
plans before drafting on the n-gram lookup without a stop rule (``uses_lookup``: ``hybrid-static``, the per-request
controller's default) reads nothing in between, so its step runs fused, as one graph: every row drafts max k_i on
the model chain and row i verifies its own k_i of its own chain. Only where a row on the n-gram chain verifies more
than the longest model draft would the fused graph draft positions no model row needs; that step is split (docs/
engine.md, "Fused or split"). ``split_plans=True`` splits every such plan (only each model row's own positions).

A policy whose next decision needs nothing of a step's outcome (``decides_ahead``: a fixed k, a table, the batch
controller, TurboSpec-style, SGLang-style) decides step t + 1 while the device runs step t, and where that decision
is step t's and no row can finish in step t, step t + 1 is launched before step t's read-back (``launch_ahead``, as
vLLM's async scheduling): the host's work between steps then runs while the device is busy. The flag is read
before each step: the per-request controller's gate sets it for the steps it plans without the lookup.

``cap_rates`` = (a_1, ..., a_K): the forced-rejection cap replays measured conditional acceptance (the first j with
Bernoulli(a_j) = 0 caps a row's accepted count; ``verify`` says why this stays lossless). A request with an
``oracle`` (the target's own greedy continuation) accepts exactly its cap; a step that accepts less means the target
left that path (a bf16 near-tie verified in another batch shape), and its later drafts are not counted.
``fixed_shape`` keeps every step at one bucket, so a shrinking batch does not change the kernels.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tabletune.acceptance import AcceptanceCounts
from tabletune.cost import StepCost
from tabletune.engine.device_stop import DeviceStop
from tabletune.engine.runner import DraftsCopy, SpecEngine, StepResult
from tabletune.policies.base import (NGRAM, AlwaysDraft, BatchState, DraftFeatures, Policy, PolicyContext, StepOutcome,
                                     draft_stop_of)
from tabletune.policies.static_table import StaticTable
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable
from tabletune.token_trace import TokenTrace

STOP_ENTROPY = 10.0  # nats: the entropy of a position not drafted (DraftFeatures past a draft cap)


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    id: int = 0
    oracle: list[int] | None = None  # tokens for the ReplayDrafter (the continuation)
    oracle_stale: bool = False  # a capped step accepted less than its cap: the oracle left the target's path
    trace: tuple[TokenTrace, TokenTrace | None] | None = None  # model and n-gram chain for the traced replay
    trace_offset: int = 0  # the traces' row its first drafted position reads (the replay wraps around them)
    output: list[int] = field(default_factory=list)
    slot: int = -1


@dataclass
class RunStats:
    num_requests: int
    output_tokens: int
    wall_s: float
    num_steps: int
    counts: AcceptanceCounts
    step_batch_sizes: list[int]
    step_ks: list[int]  # the step's k: the longest k_i verified
    step_wall_s: list[float] = field(default_factory=list)  # per step, admissions/prefills before it included
    step_tokens: list[int] = field(default_factory=list)  # tokens emitted by the step
    replaced_at_step: dict[int, int] = field(default_factory=dict)  # request id -> index of the first step without it
    step_admitted: list[int] = field(default_factory=list)  # requests admitted (prefilled) before the step
    step_prefill_s: list[float] = field(default_factory=list)  # wall time of those prefills (inside step_wall_s)
    step_drafts: list[int] = field(default_factory=list)  # sum_i k_i: drafts verified by the step
    # host time the device waited on (from a read to the next launch, prefills aside) and host time run while the
    # device was busy (an observe deferred to the next step's first read), per step
    step_host_critical_s: list[float] = field(default_factory=list)
    step_host_overlapped_s: list[float] = field(default_factory=list)
    # parts of the critical time: the scheduler's own between the read and the next step (outputs, retirements),
    # and the policy's decide (the rest: the step's state, the n-gram lookup, the launch's inputs)
    step_host_bookkeeping_s: list[float] = field(default_factory=list)
    step_host_decide_s: list[float] = field(default_factory=list)
    # per step: the ks verified as asked (n-gram rows capped to their proposal) and the model positions each row
    # drafted (a fused step drafts its longest k for every row; a split one each model row's own, 0 for n-gram
    # rows), for pricing the step by ``StepCost.mixed_ms``; and whether the step split
    step_rows: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    step_split: list[bool] = field(default_factory=list)
    step_ahead: list[bool] = field(default_factory=list)  # launched before the last step's read-back
    # decided on the lookup after the last read-back: a policy that plans first, on a step it does not decide ahead
    # (what the simulator charges ``SimConfig.host_ms_lookup_step``)
    step_looked_up: list[bool] = field(default_factory=list)

    @property
    def step_drafted(self) -> list[int]:
        """Per step, the drafts the rows drafted (fused: rows x the step's k)."""
        return [int(drafted.sum()) for _, drafted in self.step_rows]

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


class StepRecord(NamedTuple):
    """A step's line in ``RunStats``, what its ``StepOutcome`` needs and its tokens for the requests' outputs, kept
    from its read-back until the next step's (``Scheduler._flush``)."""

    stats: RunStats
    running: list[Request]
    res: StepResult
    state: BatchState
    kinds: np.ndarray
    caps: list[int] | None
    asked: np.ndarray
    drafted: np.ndarray
    split: bool
    emitted: np.ndarray
    done: np.ndarray
    n_first: int
    prefill_s: float
    wall_s: float
    step_s: float
    critical_s: float
    overlapped_s: float
    bookkeeping_s: float
    decide_s: float
    ahead: bool
    observed: bool  # observed at once (a policy whose next decision reads it)
    end_s: float  # its read-back's end, from the run's start (the clock of BatchState.time_s)
    looked_up: bool  # decided on the lookup after the last read-back (``RunStats.step_looked_up``)


def steady_throughput(batch_sizes: Sequence[int], wall_s: Sequence[float], tokens: Sequence[int], load: int,
                      start: int = 1) -> float:
    """Tokens / wall over steps ``start`` .. the last step that ran the full load (every step between counts)."""
    full = [i for i, b in enumerate(batch_sizes) if b == load]
    if not full:
        return 0.0
    window = range(min(start, full[-1]) if full[-1] > 0 else 0, full[-1] + 1)
    wall = sum(wall_s[i] for i in window)
    return sum(tokens[i] for i in window) / wall if wall > 0 else 0.0


def draw_caps(rates: Sequence[float], k: int | Sequence[int], n: int, rng: random.Random) -> list[int]:
    """Per row: the first position j (0-based) whose Bernoulli(a_{j+1}) fails, or the row's k."""
    caps = []
    for i in range(n):
        k_i = k if isinstance(k, int) else k[i]
        j = 0
        while j < k_i and rng.random() < rates[min(j, len(rates) - 1)]:
            j += 1
        caps.append(j)
    return caps


def features_of(copy: DraftsCopy | None, n: int, drafted: np.ndarray, k_max: int) -> DraftFeatures:
    """DraftFeatures of n rows from their drafted signals (``SpecEngine.copy_drafts`` of positions 1..j, None
    for j = 0): positions a row did not draft read as sure rejections."""
    sig = np.zeros((n, k_max, 3))
    sig[:, :, 1] = STOP_ENTROPY
    meta = np.zeros((n, 2))
    if copy is not None:
        got, meta = copy.get()
        done = np.arange(copy.k)[None] < drafted[:, None]
        sig[:, : copy.k][done] = got[done]
    return DraftFeatures(sig[..., 0], sig[..., 1], sig[..., 2], meta[:, 0].astype(np.int64),
                         np.minimum(meta[:, 1], drafted).astype(np.int64))


def fused_drafts_more(ks: np.ndarray, ngram_rows: np.ndarray) -> bool:
    """Whether a fused step would draft positions no model row verifies: it drafts max k_i for every row, while a
    split one drafts each model row's own k_i and nothing for the n-gram rows."""
    return bool(ngram_rows.any()) and int(ks[ngram_rows].max()) > int(ks[~ngram_rows].max(initial=0))


def flat_cost(k_max: int, max_batch: int) -> StepCost:
    """A step cost of 1 ms everywhere: the context of policies that read no cost (a fixed k, a table)."""
    points = tuple(StepPoint(b, k, (1.0,)) for b in sorted({1, max_batch}) for k in range(k_max + 1))
    return StepCost(StepProfile(points, context_len=1))


def policy_context(engine: SpecEngine, cost: StepCost | None = None, prior_rates: Sequence[float] = (),
                   ngram_rates: Sequence[float] = (), seed: int = 0) -> PolicyContext:
    """The PolicyContext of a policy on this engine (as ``Simulator.context``): its ks, batch limit, drafter."""
    return PolicyContext(cost=cost or flat_cost(engine.k_max, engine.buckets[-1]),
                         prior_rates=tuple(prior_rates) or (0.5,) * max(engine.k_max, 1), ks=tuple(engine.ks),
                         max_num_seqs=engine.buckets[-1], default_drafter=engine.default_kind, seed=seed,
                         ngram_rates=tuple(ngram_rates))


# ---- step hook: called after each step with its rows, their verified tokens and the finished request ids --------
# (e.g. ``tabletune.drafter.online.OnlineAdapter``: the EAGLE head learning while serving). It runs on the host between
# steps, after the step's read-back; its time counts in the next step's wall time.
StepHook = Callable[[list["Request"], StepResult, np.ndarray], None]


def no_hook(running: list[Request], res: StepResult, finished_ids: np.ndarray) -> None:
    return None


class Scheduler:
    def __init__(self, engine: SpecEngine, policy: Policy | DraftTable, max_num_seqs: int | None = None,
                 cap_rates: Sequence[float] | None = None, seed: int = 0, fixed_shape: bool = False,
                 after_step: StepHook = no_hook, device_stop: bool = True, overlap_observe: bool = True,
                 split_plans: bool = False, launch_ahead: bool = True) -> None:
        self.engine = engine
        if isinstance(policy, DraftTable):
            policy = StaticTable(policy_context(engine), policy.clamped(engine.k_max))
        # overlap_observe: a policy that allows it (``observe_may_lag``) observes step t while step t + 1 runs (just
        # before its first read), so it decides step t + 1 on statistics one step old, as vLLM's async scheduling does
        self.overlap_observe = overlap_observe and bool(getattr(policy, "observe_may_lag", False))
        self._deferred = None
        # the last step's line in the stats, its outcome and its tokens for the requests' outputs, made while the
        # next step runs (``_flush``); what the next step needs of them (lengths, which requests finished) is
        # counted per slot at once
        self._record: StepRecord | None = None
        slots = engine.cache.num_slots + 1
        self._num_out = np.zeros(slots, np.int64)  # tokens each slot's request has generated
        self._num_in = np.zeros(slots, np.int64)  # its prompt length
        self._max_new = np.zeros(slots, np.int64)  # its max_new_tokens
        self._stop_at = np.zeros(slots, np.int64)  # the length it finishes at (max_new_tokens, or the cache's end)
        self._limit = engine.cfg.max_len - engine.k_max - 3  # a request stops once prompt + output reach this
        self._rows = np.zeros(0, np.int64)  # the last step's slots
        # the running batch's (list, slots, their array, request ids), while its requests stay the same
        self._batch: tuple[list[Request], list[int], np.ndarray, np.ndarray] | None = None
        self._in_flight: tuple | None = None  # a step launched ahead: (buffer, ks, kinds, drafted, state)
        self._decided: tuple[BatchState, object] | None = None  # the next step's (state, decision), made ahead
        self._t0 = 0.0  # the run's start (perf_counter)
        self._stopping = False
        self._ahead_step = False  # whether the step just read was launched ahead
        self._looked_up = False  # whether it was decided on the lookup after the last read-back
        self._idle_since: float | None = None
        self._host_s = [0.0, 0.0]  # critical, overlapped
        self._book_s = self._decide_s = 0.0  # parts of the critical time (RunStats.step_host_bookkeeping_s)
        self.after_step = after_step
        self.policy = policy
        self.uses_features = bool(getattr(policy, "uses_features", False))
        self.stop = draft_stop_of(policy)
        # a stop rule, or a policy that plans on the n-gram lookup (``uses_lookup``), decides before drafting; only
        # a stop rule reads anything back between drafted positions
        self.reads_each_position = not isinstance(self.stop, AlwaysDraft)
        self.plans_first = self.reads_each_position or bool(getattr(policy, "uses_lookup", False))
        # a rule the policy can give as numbers (``device_stop_rule``) runs on the device unless device_stop=False
        self.device_stop, self.device_rule = device_stop, getattr(self.stop, "device_stop_rule", lambda state: None)
        # a split step only where something is read between drafting and verifying (a stop rule, the drafted
        # signals), or where asked to (split_plans: a plan's n-gram rows then take no model drafting)
        self.split = self.uses_features or self.reads_each_position or (self.plans_first and split_plans)
        # a plan's step split where its n-gram rows outrun its model drafts (``fused_drafts_more``)
        self.split_longer_lookups = self.plans_first and engine.cfg.split_steps
        if self.split and not engine.cfg.split_steps:
            raise ValueError(f"policy {policy.name} reads draft signals or ends drafts: build the engine with "
                             "split_steps=True")
        self.max_num_seqs = min(max_num_seqs or engine.cfg.max_num_seqs, engine.buckets[-1])
        # launch_ahead: a policy whose next decision needs nothing of a step's outcome (``decides_ahead``: a fixed
        # k, a table, the batch controller, TurboSpec-style, SGLang-style) decides the next step while the device
        # runs this one, and the next step is launched before this one's read-back where the decision is the same,
        # wherever the batch can not change (``_read_launching_ahead``), as under vLLM's async scheduling; only
        # where nothing else is decided on the host between steps (no caps drawn, no step hook, no split step).
        # ``decides_ahead`` is read before each step (``_ahead_now``): a policy that plans on the lookup says so
        # for the steps it plans without it, and is then given none.
        self.launch_ahead = (launch_ahead and self.overlap_observe and not cap_rates and after_step is no_hook
                             and not self.split and not self.uses_features)
        self.cap_rates = list(cap_rates) if cap_rates else None
        self.rng = random.Random(seed)
        # fixed_shape: every step of a run runs the bucket of its first full batch, however many rows are still
        # running (a batch shape that never changes; see the module docstring on oracles)
        self.fixed_shape = fixed_shape
        self.counts = AcceptanceCounts(k_max=max(engine.k_max, 1), drafter=engine.drafter.name)

    def _admit(self, req: Request, free: list[int]) -> None:
        req.slot = free.pop()
        e = self.engine
        if req.oracle is not None:
            import torch

            tail = (req.prompt + req.oracle)[: e.cfg.max_len]
            e.oracle[req.slot, : len(tail)] = torch.tensor(tail, device=e.device)
            e.oracle[req.slot, len(tail):] = 0
        if req.trace is not None:
            e.drafter.load(req.slot, len(req.prompt), *req.trace, offset=req.trace_offset)  # a TracedReplayDrafter
        req.output = [e.prefill(req.slot, req.prompt)]
        n = len(req.prompt)
        self._num_out[req.slot], self._num_in[req.slot], self._max_new[req.slot] = 1, n, req.max_new_tokens
        self._stop_at[req.slot] = min(req.max_new_tokens, self._limit - n)

    def _ahead_now(self) -> bool:
        """Whether the policy decides its next step ahead (``decides_ahead``, read now) on this scheduler."""
        return self.launch_ahead and bool(getattr(self.policy, "decides_ahead", False))

    def _done(self, slots: np.ndarray) -> np.ndarray:
        """[rows] whether each slot's request has finished (its generated tokens as counted, emitted or not)."""
        return self._num_out[slots] >= self._stop_at[slots]

    def _features(self, slots: list[int], drafted: np.ndarray, j: int) -> DraftFeatures:
        """The signals of the positions each row drafted (of 1..j) as the policies' DraftFeatures, read now (one
        sync); positions not drafted are sure rejections."""
        copy = self.engine.copy_drafts(slots, j) if j else None
        return self._wait(lambda: features_of(copy, len(slots), drafted, self.engine.k_max))

    def _draft(self, slots: list[int], state: BatchState,
               caps: np.ndarray) -> tuple[np.ndarray, Callable[[], DraftFeatures] | None]:
        """The draft loop: position j + 1 for the rows still drafting (only those run), until every row reached
        its cap or the policy's ``keep_drafting`` stopped it; (positions drafted per row, their features to read
        later: their copy to the host is queued behind the drafting, None for a policy that reads none). Without
        a stop rule on the host, nothing here waits on the device but the device rule's lengths."""
        e, k_max = self.engine, self.engine.k_max
        rule = self.device_rule(state) if self.reads_each_position and self.device_stop else None
        if rule is not None:  # the rule on the device: no host sync until the loop ends
            stop, j, cap = None, 0, int(caps.max(initial=0))
            while j < cap and (stop is None or not stop.done()):
                self._launch()
                e.draft_position([s for s, c in zip(slots, caps) if c > j], j, cap)
                if stop is None:  # the rule first acts after position 1: its set-up runs while the device drafts
                    stop = DeviceStop(e, slots, caps, rule)
                j += 1
                stop.after_position(j)
            copy = e.copy_drafts(slots, j) if self.uses_features and j else None
            drafted = np.zeros(len(slots), np.int64) if stop is None else self._wait(stop.lengths)
        else:
            drafted, active, j = np.zeros(len(slots), np.int64), caps > 0, 0
            while active.any():
                self._launch()
                e.draft_position([slots[i] for i in np.flatnonzero(active)], j, int(caps.max()))
                j += 1
                drafted[active] = j
                active &= drafted < caps
                if active.any() and self.reads_each_position:
                    keep = self.stop.keep_drafting(state, self._features(slots, drafted, j), j, active.copy())
                    active &= np.asarray(keep, bool)
            copy = e.copy_drafts(slots, j) if self.uses_features and j else None
        if not self.uses_features:
            return drafted, None
        return drafted, lambda: features_of(copy, len(slots), drafted, k_max)

    def _draft_cap(self, state: BatchState) -> int:
        """The policy's optional ``draft_cap(state)`` within 0..k_max (k_max without one)."""
        cap = getattr(self.policy, "draft_cap", None)
        return self.engine.k_max if cap is None else min(max(int(cap(state)), 0), self.engine.k_max)

    def step(self, running: list[Request], step: int, now_s: float, min_rows: int):
        """One policy-driven step: (StepResult, state, drafter kinds, forced caps, ks requested, model positions
        drafted per row, whether it split)."""
        e, n = self.engine, len(running)
        if self._batch is None or self._batch[0] is not running or len(self._batch[1]) != n:
            slots = [r.slot for r in running]  # made again only when the batch changed (``run`` drops it)
            rows, ids = np.array(slots, np.int64), np.array([r.id for r in running], np.int64)
            rows.flags.writeable = ids.flags.writeable = False  # shared by the steps of this batch
            self._batch = (running, slots, rows, ids)
        _, slots, rows, ids = self._batch
        self._rows = rows
        self._ahead_step, self._decide_s, self._looked_up = self._in_flight is not None, 0.0, False
        if self._in_flight is not None:  # launched before the last step's read-back, on its inputs, decided then
            buf, ks, kinds_arr, drafted, state = self._in_flight
            self._in_flight = None
            res = self._read_launching_ahead(buf, rows, ks, kinds_arr, drafted, state)
            return res, state, kinds_arr, None, ks, drafted, False
        lookup, drafted, features = None, None, None
        ahead = self._ahead_now()
        if self._decided is not None:  # decided before the last step's read-back (the same rows)
            state, decision = self._decided
            self._decided = None
        else:
            # decided before drafting, the n-gram lookup in hand: it costs no drafter step, so the plan may put
            # rows on that chain
            if self.plans_first and not ahead:
                lookup = e.drafter.host_lookup(rows, self._num_in[rows] + self._num_out[rows])
                self._looked_up = True
            state = BatchState(step=step, time_s=now_s, request_ids=ids,
                               num_generated=self._num_out[rows].copy(),
                               ngram_match_len=None if lookup is None else lookup[0],
                               ngram_num_proposed=None if lookup is None else lookup[1])
            if self.uses_features and not self.plans_first:  # it reads every position, then decides
                drafted, features = self._draft(slots, state, np.full(n, self._draft_cap(state), np.int64))
                state = dataclasses.replace(state, features=self._wait(features))
                features = None
            t_decide = time.perf_counter()
            decision = self.policy.decide(state)
            self._decide_s = time.perf_counter() - t_decide
        ks = self._ks_of(decision, n)
        # rows the plan put on the n-gram chain before drafting: no model draft, they verify the lookup's proposal
        ngram_rows = np.zeros(n, bool)
        if lookup is not None and decision.drafter is not None:
            ngram_rows = (np.asarray(decision.drafter) == NGRAM) & (ks > 0)
            ks = np.where(ngram_rows, np.minimum(ks, lookup[1]), ks)
        split = self.split or (self.split_longer_lookups and fused_drafts_more(ks, ngram_rows))
        if split and drafted is None:  # decided first (a stop rule's k_i cap the rows), then drafted
            caps_model = np.where(ngram_rows, 0, np.minimum(ks, self._draft_cap(state)))
            drafted, features = self._draft(slots, state, caps_model)
            if ngram_rows.any():
                e.lookup_rows([s for s, g in zip(slots, ngram_rows) if g], on_replay=self._launch)
        kinds = decision.drafter.tolist() if decision.drafter is not None else None
        ks = ks if drafted is None else np.where(ngram_rows, ks, np.minimum(ks, drafted))
        caps = draw_caps(self.cap_rates, ks.tolist(), n, self.rng) if self.cap_rates else None
        if drafted is None:  # fused: a plan's n-gram rows verify their chain's proposal, written by the drafter's
            # begin (only a drafter with both chains, ``has_meta``, has a lookup to plan on)
            buf = e.launch(slots, ks, caps, min_rows, kinds, on_replay=self._launch)
            drafted = np.full(n, max(int(ks.max(initial=0)), 0), np.int64)
        else:
            # the verification follows the drafting already queued (with none queued, the host waited until here)
            buf = e.verify_drafted(slots, ks, caps, min_rows, kinds, on_replay=self._launch)
        kinds_arr = np.array(kinds if kinds is not None else [e.default_kind] * n, np.int64)
        if ahead and not split:  # fused: a policy that decides ahead plans on no lookup, reads nothing between
            res = self._read_launching_ahead(buf, rows, ks, kinds_arr, drafted, state)
        else:
            res = self._wait(lambda: e.read(buf, n, e.k_max))
        if features is not None:  # drafted before the plan's verification: read now, for observe (no wait left)
            state = dataclasses.replace(state, features=features())
        return res, state, kinds_arr, caps, ks, drafted, split

    def _ks_of(self, decision, n: int) -> np.ndarray:
        """[n] the decision's k per row, within 0..k_max."""
        if decision.ks is None and decision.k is not None:  # one k for the batch
            return np.full(n, min(max(int(decision.k), 0), self.engine.k_max), np.int64)
        # clipped to 0..k_max (np.clip costs three times this on a row vector: this is the critical path)
        return np.minimum(np.maximum(decision.ks_for(n), 0), self.engine.k_max).astype(np.int64, copy=False)

    def _read_launching_ahead(self, buf, rows: np.ndarray, ks: np.ndarray, kinds_arr: np.ndarray,
                              drafted: np.ndarray, state: BatchState) -> StepResult:
        """Read a fused step, the next one decided and launched first where it may go (``launch_ahead``): the
        step's results' copy is queued, then, while the device runs the step, the deferred work of the steps
        before and the next step's decision (on a state one step old); a decision equal to this one replays the
        same graph on the same inputs (``relaunch``), and the host then waits for the copy while the device runs
        that next step; another is kept for the next step, launched after the read as usual. It may go where no
        row can finish in this step (each row's tokens so far plus k + 1 stay short of its end): the next step
        has the same rows."""
        e = self.engine
        copy = e.copy_out(buf, len(rows))
        if not self._stopping and bool(np.all(self._num_out[rows] + (int(ks.max(initial=0)) + 1)
                                              < self._stop_at[rows])):
            self._flush_pending()
            t = time.perf_counter()
            if not self._ahead_now():  # the observe just flushed turned it off: the next step plans on the lookup
                self._host_s[1] += time.perf_counter() - t
                return self._wait(copy.get)
            nxt = BatchState(step=state.step + 1, time_s=t - self._t0, request_ids=state.request_ids,
                             num_generated=self._num_out[rows].copy())
            decision = self.policy.decide(nxt)
            if decision.drafter is None and np.array_equal(self._ks_of(decision, len(rows)), ks):
                e.relaunch(buf, on_replay=self._launch)
                self._in_flight = (buf, ks, kinds_arr, drafted, nxt)
            else:
                self._decided = (nxt, decision)
            self._host_s[1] += time.perf_counter() - t
        return self._wait(copy.get)

    def _launch(self) -> None:
        """The host is about to queue device work: the time since the last read was on the critical path."""
        if self._idle_since is not None:
            self._host_s[0] += time.perf_counter() - self._idle_since
            self._idle_since = None

    def _flush_pending(self) -> None:
        """The last step's deferred work (``_flush``), its time overlapped while the device is busy."""
        if self._deferred is not None or self._record is not None:
            now = time.perf_counter()
            busy = self._idle_since is None
            self._launch()
            self._flush()
            self._host_s[0 if not busy else 1] += time.perf_counter() - now

    def _wait(self, read):
        """A blocking read: a deferred observe runs first (overlapped while the device is busy), then the read;
        from its end the host is on the critical path until the next launch."""
        self._flush_pending()
        out = read()
        if self._in_flight is None:  # else the device runs the step launched ahead
            self._idle_since = time.perf_counter()
        return out

    def _flush(self) -> None:
        """The last step's deferred work: its line in the stats and its outcome, its tokens into the requests'
        outputs, then a deferred observe."""
        if self._record is not None:
            self._flush_record()
        if self._deferred is not None:
            self.policy.observe(self._deferred)
            self._deferred = None

    def _steps_run(self, stats: RunStats) -> int:
        """Steps run so far: those in the stats and the one whose line waits in ``_record``."""
        return len(stats.step_batch_sizes) + (self._record is not None)

    def _outcome(self) -> StepOutcome:
        """The last step's ``StepOutcome`` (from ``_record``)."""
        r = self._record
        return StepOutcome(state=r.state, ks=r.res.out[:, 1], drafter=r.kinds, accepted=r.res.out[:, 0],
                           step_ms=r.step_s * 1e3, finished_ids=r.state.request_ids[r.done], end_s=r.end_s,
                           prefill_ms=r.prefill_s * 1e3)

    def _flush_record(self) -> None:
        """The last step's tokens into the requests' outputs, its ``StepOutcome`` unless observed already (observed
        now, or deferred: overlap_observe; a hook gets the step's rows, their outputs emitted), its line in the
        stats."""
        r = self._record
        self._emit(r.running, r.res, r.caps, r.asked)
        if not r.observed:
            outcome = self._outcome()
            if self.overlap_observe:
                self._deferred = outcome
            else:
                self.policy.observe(outcome)
            self.after_step(r.running, r.res, outcome.finished_ids)
        self._record = None
        stats, verified = r.stats, r.res.out[:, 1]
        stats.step_batch_sizes.append(len(r.running))
        stats.step_ks.append(int(verified.max()))
        stats.step_drafts.append(int(verified.sum()))
        stats.step_rows.append((r.asked, r.drafted))
        stats.step_split.append(r.split)
        stats.step_ahead.append(r.ahead)
        stats.step_looked_up.append(r.looked_up)
        stats.step_admitted.append(r.n_first)
        stats.step_prefill_s.append(r.prefill_s)
        stats.step_wall_s.append(r.wall_s)
        stats.step_tokens.append(r.n_first + int(r.emitted.sum()))
        stats.step_host_critical_s.append(r.critical_s)
        stats.step_host_overlapped_s.append(r.overlapped_s)
        stats.step_host_bookkeeping_s.append(r.bookkeeping_s)
        stats.step_host_decide_s.append(r.decide_s)

    def run(self, requests: Sequence[Request], stop: Callable[[RunStats], bool] | None = None) -> RunStats:
        """Serve the requests, at most max_num_seqs at a time (a closed loop of that load): all of them, or until
        ``stop(stats)`` says so after a step (a measurement window that is complete). ``stop`` sees the lines of
        the steps before that step (a step's line is written while the next step runs), so the run it stops
        serves one step more; the stats returned hold every step served."""
        waiting = deque(requests)
        min_rows = min(self.max_num_seqs, len(requests)) if self.fixed_shape else 0
        running: list[Request] = []
        free = list(range(self.engine.cache.num_slots))[::-1]
        stats = RunStats(len(requests), 0, 0.0, 0, self.counts, [], [])
        t0 = self._t0 = time.perf_counter()
        t_prev = t0
        done = np.zeros(0, bool)  # per running request, after the last step
        while waiting or running:
            if done.any():  # retire first, so a finished request is replaced in the same step
                for req in (r for r, d in zip(running, done) if d):
                    free.append(req.slot)
                    stats.replaced_at_step[req.id] = self._steps_run(stats)
                running = [r for r, d in zip(running, done) if not d]
                self._batch = None
            n_first = 0  # prefills emit each request's first token
            critical = self._host_s[0]
            self._launch()  # prefills: device work with their own reads
            self._book_s = self._host_s[0] - critical
            t_adm = time.perf_counter()
            while waiting and len(running) < self.max_num_seqs:
                req = waiting.popleft()
                self._admit(req, free)
                running.append(req)
                self._batch = None
                n_first += 1
            t_adm = time.perf_counter() - t_adm if n_first else 0.0
            if self._in_flight is None:
                self._idle_since = time.perf_counter()
            done = np.zeros(len(running), bool)
            if not running:
                continue
            t_step = time.perf_counter()
            res, state, kinds, caps, asked, drafted, split = self.step(running, self._steps_run(stats),
                                                                       t_step - t0, min_rows)
            # the critical path holds only what the next step needs: each row's tokens generated, and who finished
            rows, accepted = self._rows, res.out[:, 0]
            emitted = np.minimum(accepted + 1, self._max_new[rows] - self._num_out[rows])
            self._num_out[rows] += emitted
            done = self._done(rows)
            t_now = time.perf_counter()
            ran = running[:]  # admissions append to ``running`` before the flush
            # the step's line in the stats waits for the next read (``_flush``, while the device runs the next
            # step), and so does its outcome unless the next decision needs it: a policy that observes at once
            # (observed here), or a hook (all of it here). So ``stop`` sees the stats of the steps before this one,
            # and a run it stops runs one step more.
            observe_now = not self.overlap_observe and self.after_step is no_hook
            self._record = StepRecord(stats, ran, res, state, kinds, caps, asked, drafted, split, emitted, done,
                                      n_first,
                                      t_adm, t_now - t_prev, t_now - t_step, self._host_s[0], self._host_s[1],
                                      self._book_s, self._decide_s, self._ahead_step, observe_now, t_now - t0,
                                      self._looked_up)
            self._host_s = [0.0, 0.0]
            t_prev = t_now
            if observe_now:
                self.policy.observe(self._outcome())
            elif self.after_step is not no_hook:
                self._flush_record()
            if self._stopping or (stop is not None and stop(stats)):
                self._stopping = True  # a step launched ahead is still read and counted
                if self._in_flight is None:
                    break
        self._stopping, self._decided = False, None
        self._flush()
        stats.wall_s = time.perf_counter() - t0
        stats.output_tokens = sum(len(r.output) for r in requests)
        stats.num_steps = len(stats.step_batch_sizes)
        return stats

    def _emit(self, running: list[Request], res, caps: list[int] | None, asked: np.ndarray) -> None:
        """Append each row's emitted tokens and count its draft (a row asked for k >= 1 that had none to verify, an
        n-gram row without a match, counts as undrafted)."""
        ms, ks = res.out[:, 0], res.out[:, 1]  # int64: the step's output rows
        if caps is not None:  # a capped step that accepted less than its cap left the oracle's path
            short = ms < np.minimum(np.asarray(caps, np.int64), ks)
            for i in np.flatnonzero(short):
                if running[i].oracle is not None:
                    running[i].oracle_stale = True
        stale = np.fromiter((r.oracle_stale for r in running), bool, len(running))
        counted = (ks > 0) & ~stale
        self.counts.observe_drafts(ks[counted], ms[counted])
        self.counts.observe_undrafted(int(((ks == 0) & (np.asarray(asked) > 0)).sum()))
        for req, new in zip(running, res.tokens):
            req.output.extend(new[: req.max_new_tokens - len(req.output)])
