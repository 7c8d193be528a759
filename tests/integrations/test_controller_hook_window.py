"""ControllerHook's per-step bookkeeping on hand-made scheduler outputs (no engine, no vLLM import)."""

from types import SimpleNamespace

from tabletune.controller import Controller, ControllerConfig
from tabletune.integrations.vllm.controller_hook import ControllerHook
from tabletune.integrations.vllm.metrics import CumulativeDrafts
from tabletune.profile import StepPoint, StepProfile

PROFILE = StepProfile(tuple(StepPoint(b, k, (10 + b * (1 + k),)) for b in (1, 8) for k in range(3)), context_len=0)


def bare_hook(controller: Controller) -> ControllerHook:
    hook = object.__new__(ControllerHook)  # skip __init__: it wraps a real vLLM scheduler
    hook.controller, hook.scheduler = controller, SimpleNamespace(dynamic_sd_lookup=None)
    hook.table_lookup, hook.explore_lookup = ["table"], ["explore"]
    hook.pairs, hook.window, hook.window_undrafted, hook.windows, hook.last_k = [], [], 0, 0, 0
    hook.errors = {}
    hook.totals, hook._next_publish_s = CumulativeDrafts(controller.k_max), 0.0
    return hook


def step(hook, tokens: dict, k: int, drafts=()) -> None:
    hook.pairs.extend(drafts)  # what the make_spec_decoding_stats wrapper collects
    hook._step(SimpleNamespace(num_scheduled_tokens=tokens, num_spec_tokens_to_schedule=k))


def test_window_pools_steps_and_counts_undrafted_only_after_k_at_least_1():
    cfg = ControllerConfig(observe_every_steps=3, half_life_tokens=1e12, explore_fraction=0, min_gain=1e9,
                           prior_weight=0)
    c = Controller(PROFILE, [0.5, 0.5], cfg)
    hook = bare_hook(c)
    step(hook, {"a": 1, "b": 1}, k=0)  # the previous step asked k = 0: nothing could draft
    step(hook, {"a": 1, "b": 1}, k=2)  # still sized by k = 0
    assert c.steps == 0 and hook.window_undrafted == 0
    step(hook, {"a": 3, "b": 1, "c": 1}, k=2, drafts=[(2, 1)])  # b and c found no match
    assert hook.windows == 1 and c.steps == 3 and c.batch_hist[2] == 2 and c.batch_hist[3] == 1
    assert (c.draft_rate.drafts, c.draft_rate.undrafted) == (1, 2)
    assert hook.pairs == [] and hook.window == [] and hook.window_undrafted == 0
    assert hook.scheduler.dynamic_sd_lookup == ["table"]


def test_by_context_rows_and_the_draft_check_on_hand_made_steps():
    from tabletune.integrations.vllm.table_check import ContextRows, DraftCheck
    from tabletune.table import ContextTable

    cfg = ControllerConfig(observe_every_steps=1000, explore_fraction=0, min_gain=1e9)
    hook = bare_hook(Controller(PROFILE, [0.5, 0.5], cfg))
    table = ContextTable.from_json({"by_context": [
        {"max_context_len": 512, "num_speculative_tokens_per_batch_size": [[1, 8, 2]]},
        {"max_context_len": 4096, "num_speculative_tokens_per_batch_size": [[1, 8, 1]]}]})
    hook.rows = ContextRows(table, lambda ranges: [0] + [ranges[0][2]] * 8)
    hook.check = DraftCheck(k_max=2, stretch=2)
    hook.scheduler.requests = {"a": SimpleNamespace(num_computed_tokens=100),
                               "b": SimpleNamespace(num_computed_tokens=3000)}

    def run(tokens, k, drafts):
        hook._step(SimpleNamespace(num_scheduled_tokens=tokens, num_spec_tokens_to_schedule=k,
                                   scheduled_spec_decode_tokens=drafts))

    run({"a": 1}, 2, {})
    assert hook.scheduler.dynamic_sd_lookup[1] == 2 and hook.rows.row == 0  # context 100: the first row
    run({"a": 3, "b": 3}, 1, {"a": [7, 7], "b": [7, 7]})  # mean context 1550: the second row
    assert hook.scheduler.dynamic_sd_lookup[2] == 1 and hook.rows.row == 1
    run({"a": 3, "b": 3}, 1, {"a": [7, 7], "b": [7, 7]})  # table k 1, yet 2 tokens drafted: two in a row
    run({"a": 3, "b": 3}, 1, {"a": [7, 7], "b": [7, 7]})
    assert hook.check.state() == {"table_honoured": False, "k_mismatch_steps": 2}
