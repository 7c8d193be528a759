"""``tabletune tune`` when an engine refuses or fails: what the operator is left with.

* a tune that will not fit (the builtin engine's memory budget, vLLM's KV cache) exits 2 with one line
  and writes nothing, not even its checkpoint;
* a static-mode engine that fails after the tables were written leaves every table in place.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.cli import tune as tune_module
from tabletune.integrations.vllm.timing_requests import kv_batch_cap
from tabletune.table import DraftTable
from tabletune.tuner.budget import GIB, BatchCap, MemoryPlan, kv_cache_bytes, largest_batch

FAST = ["--point-budget-s", "0.01", "--num-prompts", "1", "--no-refine", "--close-call-margin", "0"]


@pytest.fixture
def fake_adapter(monkeypatch):
    """`--engine builtin` runs tests/cli/fake_adapter.py."""
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "fake_adapter")
    import fake_adapter

    return fake_adapter


def builtin_budget(context_len: int, n: int) -> BatchCap:
    """What the builtin engine answers: an 8B-shaped cache of 8,192-token slots that does not fit 10 GiB."""
    per_slot = kv_cache_bytes(36, 8, 128, 2, 1, 8192)
    b = largest_batch(int(10 * GIB), int(12 * GIB), per_slot, n, extra_slots=1)
    plan = MemoryPlan(free_bytes=int(10 * GIB), weights_bytes=0, kv_bytes=(n + 1) * per_slot,
                      workspace_bytes=int(12 * GIB))
    return BatchCap(context_len, b, n, plan.describe())


def vllm_kv(context_len: int, n: int) -> BatchCap:
    """What the vLLM engine answers: a cache of 2,000 tokens, less than one request at the tune's context."""
    return kv_batch_cap(2000, n, 3, 8192, 8000, 384, 16, True)


@pytest.mark.parametrize("cap, text", [(builtin_budget, "GiB is free"), (vllm_kv, "vLLM's cache holds 2000")])
def test_a_tune_that_cannot_fit_exits_2_with_one_line_and_writes_nothing(tmp_path, fake_adapter, monkeypatch,
                                                                          cap, text):
    monkeypatch.setattr(fake_adapter, "CAP", cap)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", "1,16,64", *FAST, "--out", str(out)])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("tabletune: error: --context-lens") and "not even one sequence fits" in line
    assert text in line
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no output folder, no checkpoint


def test_kv_batch_cap_hand_worked():
    # context 1192 = a 1000-token prompt + 384 / 2; prefix caching: the prompt once, + 4 x (384 + 8 x 3 + 16) = 1000 + 1696 = 2696 tokens
    assert kv_batch_cap(2696, 4, 2, 1192, 1000, 384, 16, True).batch_size == 4
    short = kv_batch_cap(2695, 4, 2, 1192, 1000, 384, 16, True)
    assert short.batch_size == 3 and "need ~2696 KV tokens but vLLM's cache holds 2695" in short.numbers
    # without it, every request holds the prompt: 4 x (424 + 1000) = 5696
    alone = kv_batch_cap(5695, 4, 2, 1192, 1000, 384, 16, False)
    assert alone.batch_size == 3 and "need ~5696 KV tokens" in alone.numbers
    assert kv_batch_cap(None, 4, 2, 1192, 1000, 384, 16, False).batch_size == 4  # vLLM did not say: every batch fits


def test_the_tables_survive_a_failing_static_mode_engine(tmp_path, fake_adapter, monkeypatch):
    monkeypatch.setattr(fake_adapter, "STATIC_FAILS", RuntimeError("static engine crashed"))
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", "1,16,64", *FAST, "--out", str(out)])
    assert res.exit_code == 1 and isinstance(res.exception, RuntimeError)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["step_profile.json", "acceptance.json", "table.json", "speculative_config.json", "sglang_adaptive_config.json",
         "tune.png"])
    table = DraftTable.load(out / "table.json")
    assert table.k_for(1) == 3 and table.k_for(64) == 1  # the tuned table, as in a run without the failure
    assert json.loads((out / "speculative_config.json").read_text())["num_speculative_tokens_per_batch_size"] == \
        table.as_lists()
    assert not (tmp_path / "run.partial").exists()
