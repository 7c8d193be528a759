"""``attach()``: what the plugin builds from ``TABLETUNE_PROFILE`` on a (fake) vLLM scheduler.

A tune over several context lengths writes ``context-<N>/`` folders and ``table_by_context.json``
(``tabletune.tuner.files.write_runs``); the plugin must read the by-context table, give the controller
the smallest context's profile, and install each step's row.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
from tabletune.integrations.vllm import controller_hook
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import ContextRow, ContextTable, DraftTable

from hook_fakes import FakeScheduler, dense, step

CONTEXTS = (512, 4096)


def tune_folder(root, contexts=CONTEXTS):
    """The layout ``tabletune tune --context-lens 512,4096`` writes (profiles slower at longer contexts)."""
    for i, n in enumerate(contexts):
        sub = root / f"context-{n}"
        sub.mkdir(parents=True)
        StepProfile(tuple(StepPoint(b, k, ((10 + 5 * i) + b * (1 + k),)) for b in (1, 8) for k in range(3)),
                    context_len=n).save(sub / "step_profile.json")
        counts = AcceptanceCounts(k_max=2, num_drafts=100, reached=[100, 70], accepted=[70, 40], drafted=[100, 100])
        AcceptanceProfile([counts]).save(sub / "acceptance.json")
    table = ContextTable((ContextRow(contexts[0], DraftTable.from_ranges([[1, 8, 2]])),
                          ContextRow(contexts[1], DraftTable.from_ranges([[1, 8, 1]]))))
    (root / "table_by_context.json").write_text(json.dumps(table.to_json()))
    return root


def attach(monkeypatch, folder):
    monkeypatch.setenv(controller_hook.PROFILE_ENV, str(folder))
    monkeypatch.setenv(controller_hook.OPTIONS_ENV, '{"explore_fraction": 0, "min_gain": 1e9}')
    monkeypatch.delenv(controller_hook.TABLE_FILE_ENV, raising=False)
    monkeypatch.delenv("TABLETUNE_METRICS_DIR", raising=False)
    return controller_hook.attach(FakeScheduler(max_num_seqs=8, num_spec_tokens=2), expand=dense)


def test_attach_reads_the_by_context_table_and_the_smallest_contexts_profile(monkeypatch, tmp_path):
    hook = attach(monkeypatch, tune_folder(tmp_path / "tune"))
    assert hook is not None and hook.scheduler._tabletune_hook is hook
    assert hook.controller.profile.context_len == 512
    assert hook.controller.profile.source.endswith("context-512/step_profile.json")
    assert hook.rows is not None and [r.max_context_len for r in hook.rows.table.rows] == [512, 4096]
    hook.scheduler.requests = {"a": SimpleNamespace(num_computed_tokens=3000)}
    step(hook, {"a": 1}, 2)
    assert hook.state()["context_row"] == 1 and hook.scheduler.dynamic_sd_lookup == dense([[1, 8, 1]], 8, 2)
    hook.scheduler.requests = {"a": SimpleNamespace(num_computed_tokens=100)}
    step(hook, {"a": 1}, 2)
    assert hook.state()["context_row"] == 0 and hook.scheduler.dynamic_sd_lookup == dense([[1, 8, 2]], 8, 2)
    assert hook.errors == {}


def test_attach_without_a_by_context_table_uses_the_folder_itself(monkeypatch, tmp_path):
    tune_folder(tmp_path / "tune", contexts=(1024, 2048))
    one = tmp_path / "tune" / "context-1024"
    hook = attach(monkeypatch, one)
    assert hook.rows is None and hook.controller.profile.context_len == 1024
