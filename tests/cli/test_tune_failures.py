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
from tabletune.integrations.vllm.tuner_engine import refuse_kv
from tabletune.table import DraftTable
from tabletune.tuner.budget import GIB, MemoryPlan, check_memory, kv_cache_bytes

FAST = ["--point-budget-s", "0.01", "--num-prompts", "1", "--no-refine", "--close-call-margin", "0"]


@pytest.fixture
def fake_adapter(monkeypatch):
    """`--engine builtin` runs tests/cli/fake_adapter.py."""
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "fake_adapter")
    import fake_adapter

    return fake_adapter


def builtin_budget(spec) -> None:
    """What the builtin engine checks at start: an 8B-shaped cache that does not fit 10 GiB."""
    kv = kv_cache_bytes(36, 8, 128, 2, spec.max_batch_size + 1, 8192)
    check_memory(MemoryPlan(free_bytes=int(10 * GIB), weights_bytes=0, kv_bytes=kv, workspace_bytes=int(4 * GIB)))


def vllm_kv(spec) -> None:
    """What the vLLM engine checks at start: a cache of 2,000 tokens."""
    refuse_kv(2000, spec.max_batch_size, spec.k_max, spec.context_len, 16, True)


@pytest.mark.parametrize("refuse, text", [(builtin_budget, "GiB is free"), (vllm_kv, "vLLM's cache holds 2000")])
def test_a_tune_that_cannot_fit_exits_2_with_one_line_and_writes_nothing(tmp_path, fake_adapter, monkeypatch,
                                                                          refuse, text):
    monkeypatch.setattr(fake_adapter, "REFUSE_AT_START", refuse)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", "1,16,64", *FAST, "--out", str(out)])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert line.startswith("tabletune: error: --max-num-seqs") and text in line
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no output folder, no checkpoint


def test_refuse_kv_hand_worked():
    # prefix caching: the 1000-token prompt once, + 4 x (384 + 8 x 3 + 16) = 1000 + 1696 = 2696 tokens
    refuse_kv(2696, 4, 2, 1000, 16, True)
    with pytest.raises(Exception, match="need ~2696 KV tokens but vLLM's cache holds 2695"):
        refuse_kv(2695, 4, 2, 1000, 16, True)
    # without it, every request holds the prompt: 4 x (424 + 1000) = 5696
    with pytest.raises(Exception, match="need ~5696 KV tokens"):
        refuse_kv(5695, 4, 2, 1000, 16, False)
    refuse_kv(None, 4, 2, 1000, 16, False)  # vLLM did not say: nothing refused


def test_the_tables_survive_a_failing_static_mode_engine(tmp_path, fake_adapter, monkeypatch):
    monkeypatch.setattr(fake_adapter, "STATIC_FAILS", RuntimeError("static engine crashed"))
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", "1,16,64", *FAST, "--out", str(out)])
    assert res.exit_code == 1 and isinstance(res.exception, RuntimeError)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["step_profile.json", "acceptance.json", "table.json", "speculative_config.json", "tune.png"])
    table = DraftTable.load(out / "table.json")
    assert table.k_for(1) == 3 and table.k_for(64) == 1  # the tuned table, as in a run without the failure
    assert json.loads((out / "speculative_config.json").read_text())["num_speculative_tokens_per_batch_size"] == \
        table.as_lists()
    assert not (tmp_path / "run.partial").exists()
