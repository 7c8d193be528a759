"""A stand-in for vLLM's Scheduler at the edge: the few attributes ``ControllerHook`` reads and wraps.

The hook under test is built through its real constructor (``ControllerHook(scheduler, controller,
expand)``), so its wiring (the draft check, the wrapped methods, the lookups) runs as in vLLM. Only the
scheduler is fake, and ``dense`` replaces vLLM's ``build_dynamic_sd_schedule_lookup`` (the same
expansion, ``DraftTable.dense``) so that these tests never import vLLM.
"""

from __future__ import annotations

from types import SimpleNamespace

from tabletune.controller import Controller
from tabletune.integrations.vllm.controller_hook import ControllerHook
from tabletune.table import DraftTable


def dense(ranges: list[list[int]], max_batch: int, num_spec_tokens: int) -> list[int]:
    """vLLM's dense lookup of a table (index b holds k; index 0 unused)."""
    return DraftTable.from_ranges(ranges).dense(max_batch, num_spec_tokens)


class FakeScheduler:
    """What the hook touches on vLLM's Scheduler; ``update_from_output`` does nothing of its own."""

    def __init__(self, max_num_seqs: int = 64, num_spec_tokens: int = 4,
                 ranges: list[list[int]] | None = None) -> None:
        self.scheduler_config = SimpleNamespace(max_num_seqs=max_num_seqs)
        self.num_spec_tokens = num_spec_tokens
        ranges = ranges if ranges is not None else [[1, max_num_seqs, num_spec_tokens]]
        self.vllm_config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens_per_batch_size=ranges),
            parallel_config=SimpleNamespace(data_parallel_rank=0))
        self.dynamic_sd_lookup = dense(ranges, max_num_seqs, num_spec_tokens)
        self.requests: dict[str, SimpleNamespace] = {}
        self.outputs = 0

    def make_spec_decoding_stats(self, stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                                 request_id):
        return stats

    def update_from_output(self, scheduler_output, model_runner_output):
        self.outputs += 1
        return {}


def make_hook(controller: Controller, scheduler: FakeScheduler | None = None) -> ControllerHook:
    scheduler = scheduler or FakeScheduler(max_num_seqs=controller.max_batch, num_spec_tokens=controller.k_max)
    return ControllerHook(scheduler, controller, dense)


def step(hook: ControllerHook, tokens: dict[str, int], k: int, drafts: dict[str, tuple[int, int]] | None = None,
         proposed: dict[str, int] | None = None) -> None:
    """One engine step through the wrapped scheduler methods, as vLLM calls them.

    ``tokens``: scheduled tokens per request; ``k``: the k the scheduler picked for the next drafts;
    ``drafts``: (drafted, accepted) per request verified this step; ``proposed``: draft tokens each request
    carries into this step (default: those of ``drafts``).
    """
    drafts = drafts or {}
    sched = hook.scheduler
    for rid, (n, m) in drafts.items():
        sched.make_spec_decoding_stats(None, n, m, 0, rid)
    proposed = proposed if proposed is not None else {rid: n for rid, (n, _) in drafts.items()}
    out = SimpleNamespace(num_scheduled_tokens=tokens, num_spec_tokens_to_schedule=k,
                          scheduled_spec_decode_tokens={rid: [7] * n for rid, n in proposed.items()})
    sched.update_from_output(out, None)
