"""The modes that merged scripts keep as flags start and write what they did before (tiny runs, committed inputs)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_acceptance_table_eagle_prints_the_held_out_table(capsys):
    import acceptance_table

    assert acceptance_table.main(["--eagle"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| workload | T | prompts | drafts | a_1 |")
    assert lines[2].startswith("| code | 0 | 164 | 8440 | 0.644 |")


def test_acceptance_table_measure_runs_one_command_per_workload_and_temperature(monkeypatch):
    import acceptance_table

    calls = []
    monkeypatch.setattr(acceptance_table.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    acceptance_table.measure(["early-exit"], num_prompts=2, max_new_tokens=8, exit_layer=20)
    assert len(calls) == 10
    assert calls[0][calls[0].index("--drafter") + 1] == "early-exit"
    assert calls[0][-2:] == ["--exit-layer", "20"]


def test_policies_sim_host_ms_writes_one_row_per_policy(tmp_path):
    import policies_sim

    out = str(tmp_path / "host")
    assert policies_sim.main(["--host-ms", "--repeats", "1", "--measured-steps", "5", "--warmup-steps", "2",
                              "--loads", "4", "--policies", "fixed:3,tabletune", "--out", out]) == 0
    got = json.loads(Path(out + ".json").read_text())
    assert got["schema"] == "tabletune.policy_host_ms"
    assert [(r["policy"], r["workload"], r["load"]) for r in got["rows"]] == [("fixed:3", "code", 4),
                                                                              ("tabletune", "code", 4)]


def test_engine_serving_sim_agreement_reads_the_committed_run(tmp_path):
    pytest.importorskip("torch")
    import engine_serving

    out = str(tmp_path / "agreement")
    assert engine_serving.main(["--sim-agreement", "--serving", str(RESULTS / "engine_serving.json"),
                                "--duration", "1", "--seeds", "1", "--out", out]) == 0
    got = json.loads(Path(out + ".json").read_text())
    measured = json.loads((RESULTS / "engine_serving.json").read_text())
    assert len(got["rows"]) == len(measured["runs"])
    assert Path(out + ".md").read_text().startswith("# Simulator vs built-in engine serving")
