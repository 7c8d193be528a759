"""StepRecorder._count on hand-made scheduler/runner outputs (no engine): drafts and undrafted steps."""

from types import SimpleNamespace

from tabletune.acceptance import AcceptanceCounts
from tabletune.integrations.vllm.step_hooks import StepRecorder


def test_count_drafts_and_undrafted_request_steps():
    counts = AcceptanceCounts(k_max=3)
    sched = SimpleNamespace(
        num_scheduled_tokens={"a": 4, "b": 1, "c": 30, "d": 1, "e": 1},
        scheduled_spec_decode_tokens={"a": [7, 8, 9]},
        num_invalid_spec_tokens=None,
        scheduled_new_reqs=[SimpleNamespace(req_id="d")],
    )
    runner = SimpleNamespace(
        req_id_to_index={"a": 0, "b": 1, "c": 2, "d": 3, "e": 4},
        sampled_token_ids=[[1, 2], [5], [6], [3], []],
    )
    StepRecorder._count(SimpleNamespace(counts=counts), sched, runner)
    # a: a draft of 3 with 1 accepted; b: decode, no draft -> undrafted; c: prefill chunk;
    # d: a new request; e: sampled nothing (e.g. a chunked prefill step) -> neither
    assert counts.num_drafts == 1 and counts.reached == [1, 1, 0] and counts.accepted == [1, 0, 0]
    assert counts.undrafted == 1 and counts.draft_rate == 0.5
