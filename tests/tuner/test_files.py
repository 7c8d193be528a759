"""The run's folder: JSON files without matplotlib, the PNG only when asked, all or nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tabletune.acceptance import AcceptanceProfile
from tabletune.profile import StepProfile
from tabletune.table import DraftTable
from tabletune.tuner import TunePlan, run_plan
from tabletune.tuner.files import FILES, JSON_FILES, predict_gains, write_run

from tuner_fakes import FakeEngine

PLAN = TunePlan(batch_sizes=(1, 4, 16, 64), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2, refine=False,
                close_call_windows=0)


def config(ranges):
    return {"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": ranges}


@pytest.fixture(scope="module")
def outcome():
    return run_plan(FakeEngine(), PLAN, ["p"] * 3, workload="code")


def test_json_files_need_no_matplotlib(tmp_path, outcome, monkeypatch):
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # any import of it now fails
    result, files = write_run(tmp_path / "run", outcome, config)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(JSON_FILES) == sorted(files)
    table = DraftTable.load(files["table.json"])
    assert table == result.table and json.loads(files["table.json"].read_text())["num_speculative_tokens"] == 3
    # T(b, k) = 10 + 0.5 b (k + 1), rates 0.9, 0.8, 50/72: k=3 at b=1, k=1 at b=64 (see test_run)
    assert table.k_for(1) == 3 and table.k_for(64) == 1
    spec = json.loads(files["speculative_config.json"].read_text())
    assert spec["num_speculative_tokens_per_batch_size"] == table.as_lists()
    assert StepProfile.load(files["step_profile.json"]).batch_sizes == [1, 4, 16, 64]
    assert AcceptanceProfile.load(files["acceptance.json"]).select("code").num_drafts == 100


def test_importing_the_tuner_and_cli_loads_no_matplotlib():
    code = ("import sys, tabletune.tuner, tabletune.tuner.files, tabletune.cli, tabletune.plot; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_png_is_drawn_from_the_optimizers_result(tmp_path, outcome):
    drawn = []

    def draw(profile, result, path):
        drawn.append((profile, result))
        path.write_bytes(b"png")

    result, files = write_run(tmp_path / "run", outcome, config, draw_png=draw)
    assert sorted(files) == sorted(FILES) and files["tune.png"].read_bytes() == b"png"
    assert drawn == [(outcome.profile, result)]


def test_failure_leaves_nothing(tmp_path, outcome):
    def broken(ranges):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_run(tmp_path / "run", outcome, broken)
    assert list(tmp_path.iterdir()) == []


def test_rerun_replaces_files_in_an_existing_folder(tmp_path, outcome):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "table.json").write_text("old")
    (tmp_path / "run" / "notes.txt").write_text("mine")
    write_run(tmp_path / "run", outcome, config)
    assert json.loads((tmp_path / "run" / "table.json").read_text())["num_speculative_tokens"] == 3
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_predicted_gains(outcome):
    from tabletune.optimizer import OptimizeOptions, optimize_table

    result = optimize_table(outcome.profile, outcome.rates, OptimizeOptions(k_max=3))
    gains = predict_gains(outcome, result)
    assert gains.vs_best_fixed[1] >= -1e-12  # the optimal table never loses to a fixed k
    assert gains.documented == DraftTable(((1, 16, 3), (17, 32, 3), (33, 64, 3), (65, 128, 1), (129, 512, 0)))
    # at b=64 the documented table runs k=3 (3.12 tokens / 138 ms) where the table runs k=1 (1.9 / 74 ms)
    assert gains.vs_documented[0] > 0 and gains.vs_documented[1] >= -1e-12
