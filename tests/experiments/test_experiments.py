import csv

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.experiments.report import ExperimentOptions, run_experiments
from tabletune.experiments.runner import Lab, measure_rates
from tabletune.experiments.settings import SETTINGS
from tabletune.profile import StepProfile

TINY = ExperimentOptions(loads=(1, 64), seeds=(0,), duration_s=2.0, fig4b_loads=(16,), fig4b_window_s=4.0,
                         per_request=False, jobs=1)


def test_measured_prior_is_close_to_the_workload_rates(starter_8b):
    lab = Lab(StepProfile.load(starter_8b), duration_s=2.0)
    setting = SETTINGS["eagle"]
    rates = measure_rates(lab.simulator(setting, 16, 5, duration_s=20.0))
    assert rates == pytest.approx(setting.workload.rates, abs=0.06)


def test_all_writes_every_section(starter_8b, tmp_path):
    sections = run_experiments(["all"], str(starter_8b), tmp_path, TINY)
    assert [s.key for s in sections] == ["fig1", "table1", "fig3", "table2", "fig4b"]
    report = (tmp_path / "report.md").read_text()
    for s in sections:
        assert f"## {s.title}" in report
        assert (tmp_path / f"{s.key}.md").exists()
        for f in s.files:
            assert (tmp_path / f).stat().st_size > 0
    rows = list(csv.DictReader((tmp_path / "fig1.csv").open()))
    best = [r for r in rows if r["policy"] == r["best_fixed"]]
    assert best and all(float(r["mean"]) == pytest.approx(1.0) for r in best)
    assert {r["policy"] for r in rows} >= {"fixed:0", "fixed:7", "tabletune"}
    assert set(sections[1].summary) == {"eagle", "draft-model", "ngram-code-edit", "parallel-block", "weak-drafter"}
    assert {"eagle/turbospec", "eagle/nightjar", "eagle/controller"} <= set(sections[2].summary)


def test_parallel_jobs_give_the_same_points(starter_8b, tmp_path):
    serial = Lab(StepProfile.load(starter_8b), duration_s=2.0, jobs=1)
    pooled = Lab(StepProfile.load(starter_8b), duration_s=2.0, jobs=2)
    a = serial.grid("eagle", ["fixed:2", "nightjar"], (1, 32), (0, 1))
    b = pooled.grid("eagle", ["fixed:2", "nightjar"], (1, 32), (0, 1))
    assert a == b


def test_experiment_cli_bad_input_exits_2(starter_8b, tmp_path):
    for args in (["fig1", "--loads", "0,4"], ["fig1", "--seeds", "0"], ["fig3", "--fig3-settings", "nope"],
                 ["fig1", "--step-times", str(tmp_path / "missing.csv")]):
        out = CliRunner().invoke(main, ["experiment", *args, "--out", str(tmp_path / "o"), "--duration", "1"])
        assert out.exit_code == 2, (args, out.output)
    assert not (tmp_path / "o" / "fig1.csv").exists()
