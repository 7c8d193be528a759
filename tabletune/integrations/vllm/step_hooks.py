"""Hooks on an in-process vLLM ``EngineCore``: time each step, count drafts per step.

``EngineCore.step_fn`` (schedule + execute + update) and ``post_step`` (fetch
the next drafts) are what the engine-core busy loop of ``vllm serve`` runs per
step; the recorder wraps both on the instance and times from the start of one
to the end of the other. ``Scheduler.schedule`` is wrapped to see what each
step scheduled, and ``Scheduler.update_from_output`` to count drafted and
accepted tokens per request exactly as vLLM's ``SpecDecodingStats`` does
(accepted = sampled tokens - 1).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tabletune.acceptance import AcceptanceCounts


@dataclass(frozen=True)
class StepRecord:
    step_ms: float
    cpu_ms: float  # CPU time of this process (all threads) during the step
    thread_ms: float  # CPU time of the engine-core thread during the step
    wait_ms: float  # run-queue wait of the engine-core thread (runnable while another process ran)
    num_reqs: int
    scheduled_tokens: int
    num_spec_tokens: int  # the k the scheduler chose for this step (drafts proposed after it)
    has_prefill: bool
    drafts_per_req: tuple[int, ...]  # draft tokens verified per request in this step


def _runqueue_ns(tid: int) -> int:
    """Nanoseconds this thread spent runnable but not running (``/proc/.../schedstat``, field 2)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _has_prefill(out) -> bool:
    """New requests, or any request scheduled for more than 1 + its draft tokens."""
    if out.scheduled_new_reqs:
        return True
    spec = out.scheduled_spec_decode_tokens
    return any(n != 1 + len(spec.get(req_id, ())) for req_id, n in out.num_scheduled_tokens.items())


class StepRecorder:
    """Install once per EngineCore; ``records`` collects steps while ``recording`` is on."""

    def __init__(self, core) -> None:
        self.core = core
        self.records: list[StepRecord] = []
        self.recording = False
        self.counts: AcceptanceCounts | None = None  # set to count drafts
        self._last = None
        self._t0 = self._c0 = self._th0 = 0.0
        self._main = threading.get_native_id()
        self._w0 = 0
        self._wrap(core)

    def _wrap(self, core) -> None:
        sched = core.scheduler
        schedule, update = sched.schedule, sched.update_from_output
        step_fn, post_step = core.step_fn, core.post_step

        def timed_schedule(*args, **kwargs):
            self._last = out = schedule(*args, **kwargs)
            return out

        def counted_update(scheduler_output, model_runner_output):
            if self.counts is not None:
                self._count(scheduler_output, model_runner_output)
            return update(scheduler_output, model_runner_output)

        def timed_step_fn():
            self._last = None
            self._w0 = _runqueue_ns(self._main)
            self._t0 = time.perf_counter()
            self._c0 = time.process_time()
            self._th0 = time.thread_time()
            return step_fn()

        def timed_post_step(model_executed: bool) -> None:
            post_step(model_executed=model_executed)
            t1, c1, th1 = time.perf_counter(), time.process_time(), time.thread_time()
            if self.recording and self._last is not None and self._last.total_num_scheduled_tokens > 0:
                wait_ms = (_runqueue_ns(self._main) - self._w0) / 1e6
                self.records.append(self._record(self._last, (t1 - self._t0) * 1e3, (c1 - self._c0) * 1e3,
                                                 (th1 - self._th0) * 1e3, wait_ms))

        sched.schedule = timed_schedule
        sched.update_from_output = counted_update
        core.step_fn = timed_step_fn
        core.post_step = timed_post_step

    @staticmethod
    def _record(out, step_ms: float, cpu_ms: float, thread_ms: float, wait_ms: float) -> StepRecord:
        spec = out.scheduled_spec_decode_tokens
        return StepRecord(
            step_ms=step_ms,
            cpu_ms=cpu_ms,
            thread_ms=thread_ms,
            wait_ms=wait_ms,
            num_reqs=len(out.num_scheduled_tokens),
            scheduled_tokens=out.total_num_scheduled_tokens,
            num_spec_tokens=out.num_spec_tokens_to_schedule,
            has_prefill=_has_prefill(out),
            drafts_per_req=tuple(len(spec.get(r, ())) for r in out.num_scheduled_tokens),
        )

    def _count(self, scheduler_output, model_runner_output) -> None:
        """vLLM's rule: drafts = scheduled spec tokens, accepted = sampled tokens - 1.

        A request decoding one token with no draft (the n-gram drafter found no match)
        counts as an undrafted request-step (``AcceptanceCounts.draft_rate``).
        """
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        if not sampled:
            return
        invalid = scheduler_output.num_invalid_spec_tokens or {}
        spec = scheduler_output.scheduled_spec_decode_tokens
        new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            if req_id not in index or not sampled[index[req_id]]:
                continue
            draft = spec.get(req_id)
            if draft:
                self.counts.observe_draft(len(draft) - invalid.get(req_id, 0), len(sampled[index[req_id]]) - 1)
            elif num_tokens == 1 and req_id not in new:
                self.counts.observe_undrafted()
