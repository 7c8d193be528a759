"""ControllerHook's per-step bookkeeping, built through its real constructor on a fake vLLM scheduler.

The steps go through the scheduler methods the hook wraps (``make_spec_decoding_stats``,
``update_from_output``), as vLLM calls them; no vLLM import (``hook_fakes``).
"""

from types import SimpleNamespace

from tabletune.controller import Controller, ControllerConfig
from tabletune.controller.table_file import TableFileWatcher
from tabletune.integrations.vllm.table_check import ContextRows
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import ContextTable

from hook_fakes import FakeScheduler, dense, make_hook, step

PROFILE = StepProfile(tuple(StepPoint(b, k, (10 + b * (1 + k),)) for b in (1, 8) for k in range(3)), context_len=0)
BY_CONTEXT = ContextTable.from_json({"by_context": [
    {"max_context_len": 512, "num_speculative_tokens_per_batch_size": [[1, 8, 2]]},
    {"max_context_len": 4096, "num_speculative_tokens_per_batch_size": [[1, 8, 1]]}]})


def quiet(**kw) -> ControllerConfig:
    return ControllerConfig(**{"observe_every_steps": 1000, "explore_fraction": 0, "min_gain": 1e9, **kw})


def test_window_pools_steps_and_counts_undrafted_only_after_k_at_least_1():
    cfg = quiet(observe_every_steps=3, half_life_tokens=1e12, prior_weight=0)
    c = Controller(PROFILE, [0.5, 0.5], cfg)
    hook = make_hook(c)
    step(hook, {"a": 1, "b": 1}, k=0)  # the previous step asked k = 0: nothing could draft
    step(hook, {"a": 1, "b": 1}, k=2)  # still sized by k = 0
    assert c.steps == 0 and hook.window_undrafted == 0
    step(hook, {"a": 3, "b": 1, "c": 1}, k=2, drafts={"a": (2, 1)})  # b and c found no match
    assert hook.windows == 1 and c.steps == 3 and c.batch_hist[2] == 2 and c.batch_hist[3] == 1
    assert (c.draft_rate.drafts, c.draft_rate.undrafted) == (1, 2)
    assert hook.pairs == [] and hook.window == [] and hook.window_undrafted == 0
    assert hook.scheduler.dynamic_sd_lookup == hook.table_lookup and hook.scheduler.outputs == 3
    assert hook.errors == {}


def test_the_constructor_builds_the_draft_check_and_the_state_reports_it():
    hook = make_hook(Controller(PROFILE, [0.5, 0.5], quiet()), FakeScheduler(max_num_seqs=8, num_spec_tokens=2,
                                                                            ranges=[[1, 8, 1]]))
    state = hook.state()
    assert state["table_honoured"] is None and state["k_mismatch_steps"] == 0
    assert hook.check.stretch == 32  # the default: one loud verdict after 32 mismatching steps in a row
    step(hook, {"a": 1}, k=1)
    for _ in range(32):  # the table asks k = 1, the runner drafts 2 (vLLM's V2 runner ignoring the table)
        step(hook, {"a": 3}, k=1, drafts={"a": (2, 1)})
    assert hook.state()["table_honoured"] is False and hook.snapshot()["table_honoured"] is False
    assert hook.state()["k_mismatch_steps"] == 32 and hook.errors == {}


def test_by_context_rows_pick_the_lookup_until_the_controller_installs_a_table():
    hook = make_hook(Controller(PROFILE, [0.5, 0.5], quiet()), FakeScheduler(max_num_seqs=8, num_spec_tokens=2))
    hook.rows = ContextRows(BY_CONTEXT, hook.lookup_for_ranges)
    hook.scheduler.requests = {"a": SimpleNamespace(num_computed_tokens=100),
                               "b": SimpleNamespace(num_computed_tokens=3000)}
    step(hook, {"a": 1}, 2)
    assert hook.scheduler.dynamic_sd_lookup[1] == 2 and hook.rows.row == 0  # context 100: the first row
    step(hook, {"a": 3, "b": 3}, 1, {"a": (2, 2), "b": (2, 0)})  # mean context 1550: the second row
    assert hook.scheduler.dynamic_sd_lookup[2] == 1 and hook.state()["context_row"] == 1
    hook.set_table([[1, 8, 2]])  # an installed table replaces the rows, whatever the context
    step(hook, {"a": 3, "b": 3}, 1, {"a": (1, 1), "b": (1, 0)})
    assert hook.scheduler.dynamic_sd_lookup == dense([[1, 8, 2]], 8, 2) and hook.errors == {}


def test_a_pinned_table_is_not_overridden_by_the_rows(tmp_path):
    hook = make_hook(Controller(PROFILE, [0.5, 0.5], quiet()), FakeScheduler(max_num_seqs=8, num_spec_tokens=2))
    hook.rows = ContextRows(BY_CONTEXT, hook.lookup_for_ranges)
    hook.watcher = TableFileWatcher(tmp_path / "table.json", 2, poll_s=0)
    hook.scheduler.requests = {"b": SimpleNamespace(num_computed_tokens=3000)}
    step(hook, {"b": 1}, 2)
    assert hook.scheduler.dynamic_sd_lookup[1] == 1  # context 3000: the second row
    (tmp_path / "table.json").write_text("[[1, 8, 2]]")
    step(hook, {"b": 1}, 2)
    assert hook.controller.pinned and hook.scheduler.dynamic_sd_lookup[1] == 2  # the operator's k, not the row's
