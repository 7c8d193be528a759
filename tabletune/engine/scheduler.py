"""Continuous batching over a ``SpecEngine``: admit up to max_num_seqs, prefill, step, retire.

Each step runs every running sequence with one k, the draft table's k for the
current batch size (a fixed k is the one-range table). After the step the host
appends the emitted tokens, counts acceptance per position (vLLM's meaning: see
``tabletune.acceptance``), and frees finished slots.

With ``cap_rates`` = (a_1, ..., a_K) the forced-rejection cap replays measured
conditional acceptance: for each row the host draws the first j with
Bernoulli(a_j) = 0 and caps the accepted count there (``verify`` says why this
stays lossless).

A request with an ``oracle`` (the ReplayDrafter's continuation) accepts exactly its
cap while the oracle is the target's own greedy path. A step that accepts less
means the target left that path (in bf16 a near-tie can round the other way when the
same position is verified inside a different batch shape): from that step on the
request's drafts no longer follow the caps, and they are not counted. ``fixed_shape``
keeps every step at one bucket, so that a shrinking batch does not change the shapes
(and the kernels) that verify each position.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tabletune.acceptance import AcceptanceCounts
from tabletune.engine.runner import SpecEngine
from tabletune.table import DraftTable


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    id: int = 0
    oracle: list[int] | None = None  # tokens for the ReplayDrafter (the continuation)
    oracle_stale: bool = False  # a capped step accepted less than its cap: the oracle left the target's path
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
    step_ks: list[int]
    step_wall_s: list[float] = field(default_factory=list)  # per step, admissions/prefills before it included
    step_tokens: list[int] = field(default_factory=list)  # tokens emitted by the step
    replaced_at_step: dict[int, int] = field(default_factory=dict)  # request id -> index of the first step without it
    step_admitted: list[int] = field(default_factory=list)  # requests admitted (prefilled) before the step
    step_prefill_s: list[float] = field(default_factory=list)  # wall time of those prefills (inside step_wall_s)

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def steady_throughput_tok_s(self, load: int) -> float:
        """Tokens / second of the closed loop before it drains, prefills included.

        Window: from the second step (the first carries the initial prefill of the whole
        load, which a steady loop, and the simulator's, never sees at once) to the last step
        that ran the full load; every step in between counts, with its admissions.
        """
        return steady_throughput(self.step_batch_sizes, self.step_wall_s, self.step_tokens, load)


def steady_throughput(batch_sizes: Sequence[int], wall_s: Sequence[float], tokens: Sequence[int], load: int,
                      start: int = 1) -> float:
    """Tokens / wall over steps ``start`` .. the last step that ran the full load (every step between counts)."""
    full = [i for i, b in enumerate(batch_sizes) if b == load]
    if not full:
        return 0.0
    window = range(min(start, full[-1]) if full[-1] > 0 else 0, full[-1] + 1)
    wall = sum(wall_s[i] for i in window)
    return sum(tokens[i] for i in window) / wall if wall > 0 else 0.0


def draw_caps(rates: Sequence[float], k: int, n: int, rng: random.Random) -> list[int]:
    """Per row: the first position j (0-based) whose Bernoulli(a_{j+1}) fails, or k."""
    caps = []
    for _ in range(n):
        j = 0
        while j < k and rng.random() < rates[min(j, len(rates) - 1)]:
            j += 1
        caps.append(j)
    return caps


class Scheduler:
    def __init__(self, engine: SpecEngine, table: DraftTable, max_num_seqs: int | None = None,
                 cap_rates: Sequence[float] | None = None, seed: int = 0, fixed_shape: bool = False) -> None:
        self.engine = engine
        self.table = table.clamped(engine.k_max)
        self.max_num_seqs = min(max_num_seqs or engine.cfg.max_num_seqs, engine.buckets[-1])
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
        req.output = [e.prefill(req.slot, req.prompt)]

    def _done(self, req: Request) -> bool:
        limit = self.engine.cfg.max_len - self.engine.k_max - 3
        return len(req.output) >= req.max_new_tokens or len(req.prompt) + len(req.output) >= limit

    def run(self, requests: Sequence[Request]) -> RunStats:
        """Serve all requests, at most max_num_seqs at a time (a closed loop of that load)."""
        waiting = deque(requests)
        min_rows = min(self.max_num_seqs, len(requests)) if self.fixed_shape else 0
        running: list[Request] = []
        free = list(range(self.engine.cache.num_slots))[::-1]
        steps_b, steps_k, walls, toks = [], [], [], []
        replaced: dict[int, int] = {}
        admitted, prefill_s = [], []
        t0 = time.perf_counter()
        t_prev = t0
        while waiting or running:
            still = []
            for req in running:  # retire first, so a finished request is replaced in the same step
                if self._done(req):
                    free.append(req.slot)
                    replaced[req.id] = len(steps_b)
                else:
                    still.append(req)
            running = still
            n_first = 0  # prefills emit each request's first token
            t_adm = time.perf_counter()
            while waiting and len(running) < self.max_num_seqs:
                req = waiting.popleft()
                self._admit(req, free)
                running.append(req)
                n_first += 1
            t_adm = time.perf_counter() - t_adm if n_first else 0.0
            if not running:
                continue
            b = len(running)
            k = min(self.table.k_for(b), self.engine.k_max)
            caps = draw_caps(self.cap_rates, k, b, self.rng) if self.cap_rates and k > 0 else None
            ms, emitted = self.engine.step([r.slot for r in running], k, caps, min_rows)
            steps_b.append(b)
            steps_k.append(k)
            admitted.append(n_first)
            prefill_s.append(t_adm)
            n_tok = n_first
            for i, (req, m, out) in enumerate(zip(running, ms, emitted)):
                if caps is not None and req.oracle is not None and m < caps[i]:
                    req.oracle_stale = True
                if k > 0 and not req.oracle_stale:
                    self.counts.observe_draft(k, m)
                new = out[: req.max_new_tokens - len(req.output)]
                n_tok += len(new)
                req.output.extend(new)
            t_now = time.perf_counter()
            walls.append(t_now - t_prev)
            toks.append(n_tok)
            t_prev = t_now
        wall = time.perf_counter() - t0
        out_tokens = sum(len(r.output) for r in requests)
        return RunStats(len(requests), out_tokens, wall, len(steps_b), self.counts, steps_b, steps_k, walls, toks,
                        replaced, admitted, prefill_s)
