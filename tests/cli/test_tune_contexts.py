"""``tune --context-lens`` writes one profile per context and a by-context table; ``table`` builds one from
several profiles; ``--resume`` continues an interrupted CLI tune (fake adapter: T grows with the context)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.cli import tune as tune_module
from tabletune.table import ContextTable, DraftTable

FAST = ["--point-budget-s", "0.01", "--num-prompts", "1", "--no-refine", "--close-call-margin", "0",
        "--no-static-check"]
FORMATS = Path(__file__).resolve().parents[2] / "docs" / "formats.md"
ARGS = ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3", "--batch-sizes", "1,16,64", *FAST]


@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "fake_adapter")


def test_context_lens_write_a_by_context_table(tmp_path, fake_engine):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [*ARGS, "--context-lens", "1000,100", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["batch_caps.json", "context-100", "context-1000",
                                                     "sglang_adaptive_config.json", "speculative_config.json",
                                                     "table_by_context.json"]
    table = ContextTable.load(out / "table_by_context.json")
    assert [r.max_context_len for r in table.rows] == [100, 1000]
    for row in table.rows:  # each row is that profile's own 1-D table
        assert row.table == DraftTable.load(out / f"context-{row.max_context_len}" / "table.json")
    # verification costs 10x more at context 1000: shorter drafts there
    assert table.rows[0].table.k_for(64) > table.rows[1].table.k_for(64)
    spec = json.loads((out / "speculative_config.json").read_text())
    assert spec["num_speculative_tokens_per_batch_size"] == table.rows[0].table.as_lists()
    assert json.loads(res.stdout.splitlines()[0]) == table.to_json()
    assert not (tmp_path / "run.partial").exists()

    both = CliRunner().invoke(main, ["table", "--step-times", str(out / "context-1000" / "step_profile.json"),
                                     "--step-times", str(out / "context-100" / "step_profile.json"),
                                     "--acceptance", str(out / "context-100" / "acceptance.json"), "--quiet"])
    assert both.exit_code == 0, both.output
    assert ContextTable.from_json(json.loads(both.stdout)).rows == table.rows


def test_table_refuses_profiles_of_one_context(tmp_path, fake_engine):
    out = tmp_path / "run"
    assert CliRunner().invoke(main, [*ARGS, "--out", str(out)]).exit_code == 0
    profile = str(out / "step_profile.json")
    res = CliRunner().invoke(main, ["table", "--step-times", profile, "--step-times", profile,
                                    "--acceptance", str(out / "acceptance.json")])
    assert res.exit_code == 2 and "context_len" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_resume_after_an_interruption(tmp_path, fake_engine, monkeypatch):
    import fake_adapter

    original = fake_adapter.FakeEngine.measure_step

    def dies_at_b64(self, batch_size, k, num_steps):
        if batch_size == 64:
            raise KeyboardInterrupt
        return original(self, batch_size, k, num_steps)

    out = tmp_path / "run"
    monkeypatch.setattr(fake_adapter.FakeEngine, "measure_step", dies_at_b64)
    assert CliRunner().invoke(main, [*ARGS, "--out", str(out)]).exit_code != 0
    assert not out.exists() and (tmp_path / "run.partial" / "points.jsonl").exists()
    seen = []

    def counting(self, batch_size, k, num_steps):
        seen.append(batch_size)
        return original(self, batch_size, k, num_steps)

    monkeypatch.setattr(fake_adapter.FakeEngine, "measure_step", counting)
    again = CliRunner().invoke(main, [*ARGS, "--out", str(out)])
    assert again.exit_code == 2 and "--resume" in again.stderr
    res = CliRunner().invoke(main, [*ARGS, "--out", str(out), "--resume", str(tmp_path / "run.partial")])
    assert res.exit_code == 0, res.output
    assert set(seen) == {64}  # b=1 and b=16 came from the checkpoint
    assert (out / "table.json").exists() and not (tmp_path / "run.partial").exists()
    gone = CliRunner().invoke(main, [*ARGS, "--out", str(out), "--resume", str(tmp_path / "run.partial")])
    assert gone.exit_code == 2 and "no points.jsonl" in gone.stderr  # removed once the outputs were in place


def test_a_context_that_holds_part_of_the_grid_is_measured_up_to_what_fits(tmp_path, fake_engine, monkeypatch):
    """64 sequences of 1000 tokens do not fit 20,000 KV tokens: context 1000 is measured up to b = 20 (and the
    cap printed), and its row's last k reaches --max-num-seqs; context 100 holds the whole grid."""
    import fake_adapter

    monkeypatch.setattr(fake_adapter, "MEMORY_TOKENS", 20_000)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [*ARGS, "--context-lens", "100,1000", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "context 1000: 64 sequences do not fit (64000 KV tokens, 20000 held): measured up to b=20" in res.stderr
    small = json.loads((out / "context-100" / "step_profile.json").read_text())
    large = json.loads((out / "context-1000" / "step_profile.json").read_text())
    assert sorted({p["batch_size"] for p in small["points"]}) == [1, 16, 64]
    assert sorted({p["batch_size"] for p in large["points"]}) == [1, 16, 20]
    table = ContextTable.load(out / "table_by_context.json")
    assert table.rows[1].table.ranges[-1][1] == 64 and table.rows[0].table.ranges[-1][1] == 64
    assert DraftTable.load(out / "context-1000" / "table.json").ranges[-1][1] == 64
    caps = json.loads((out / "batch_caps.json").read_text())["by_context"]
    assert [(c["context_len"], c["batch_size"], c["max_num_seqs"], c["capped"]) for c in caps] == [
        (100, 64, 64, False), (1000, 20, 64, True)]
    assert caps[1]["numbers"] == "64000 KV tokens, 20000 held" and caps[1]["free_bytes"] is None
    section = FORMATS.read_text().split("## `batch_caps.json`")[1].split("\n## ")[0]
    documented = re.findall(r"^\| `by_context\[\]\.(\w+)`", section, re.MULTILINE)
    assert documented == list(caps[0])  # every field, in the docs' table (docs/formats.md)


def test_a_context_that_holds_no_sequence_is_refused_before_anything_is_measured(tmp_path, fake_engine,
                                                                                  monkeypatch):
    import fake_adapter

    monkeypatch.setattr(fake_adapter, "MEMORY_TOKENS", 500)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [*ARGS, "--context-lens", "100,1000", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1
    assert "--context-lens" in res.stderr and "1000" in res.stderr and "not even one sequence fits" in res.stderr
    assert not out.exists() and not (tmp_path / "run.partial").exists()
