"""``tabletune table``: formats, options, and bad input (exit 2, one line, no output file)."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.table import DraftTable

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
    base = ["table", "--step-times", str(prof_path), "--acceptance", str(acc_path), "--quiet"]
    plain, modelled = run(base), run([*base, "--model-draft-rate"])
    assert plain.exit_code == 0 and modelled.exit_code == 0
    rates = [0.8, 0.75]
    expect = {q: optimize_table(profile, rates, OptimizeOptions(draft_rate=q)).table.as_lists() for q in (1.0, 0.25)}
    assert expect[1.0] != expect[0.25]  # the case distinguishes the two
    assert json.loads(plain.output)["num_speculative_tokens_per_batch_size"] == expect[1.0]
    assert json.loads(modelled.output)["num_speculative_tokens_per_batch_size"] == expect[0.25]
