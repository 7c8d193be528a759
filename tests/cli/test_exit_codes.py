"""Through the real entry point (a subprocess): bad input exits 2 with one line; a bug exits 1 with its traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

RATES = "0.8,0.75,0.7,0.65,0.6,0.55,0.5"

# replace one library function with one that raises, then run `python -m tabletune` as a user would
INJECT = """
import runpy, sys
import tabletune.cli.table as cmd

def broken(*args, **kwargs):
    raise {exc}("injected bug")

cmd.smooth_within_noise = broken  # the default table
sys.argv = ["tabletune", *sys.argv[1:]]
runpy.run_module("tabletune", run_name="__main__", alter_sys=True)
"""


def tabletune(*args: str, inject: str | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter; PYTHONPATH is inherited, so it imports this tree."""
    cmd = [sys.executable, "-c", INJECT.format(exc=inject), *args] if inject else [sys.executable, "-m", "tabletune",
                                                                                  *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_bad_profile_field_exits_2_with_one_line_and_no_output(tmp_path):
    src = tmp_path / "p.csv"
    src.write_text("batch_size,k,step_ms\n1,0,2\n2,0,-3\n")
    out = tmp_path / "t.json"
    proc = tabletune("table", "--step-times", str(src), "--acceptance", RATES, "--output", str(out))
    assert proc.returncode == 2
    assert proc.stderr == f"tabletune: error: {src}: field 'step_ms (line 3)' = -3.0: must be positive\n"
    assert proc.stdout == "" and not out.exists()


def test_missing_profile_file_exits_2(tmp_path):
    missing = tmp_path / "nope.json"
    proc = tabletune("table", "--step-times", str(missing), "--acceptance", RATES)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"tabletune: error: {missing}: field '<file>'") and "cannot read" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_bad_flag_value_exits_2_with_one_line(starter_8b):
    proc = tabletune("table", "--step-times", str(starter_8b), "--acceptance", RATES, "--max-batch", "0")
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("tabletune: error: Invalid value for '--max-batch': 0 is not in the range x>=1.")


def test_unknown_subcommand_exits_2_with_one_line():
    proc = tabletune("tabel")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "No such command 'tabel'" in proc.stderr


@pytest.mark.parametrize("exc", ["RuntimeError", "ValueError", "KeyError"])
def test_a_bug_exits_1_with_its_traceback_and_no_output(starter_8b, tmp_path, exc):
    """ValueError and KeyError too: only InputError is bad input."""
    out = tmp_path / "t.json"
    proc = tabletune("table", "--step-times", str(starter_8b), "--acceptance", RATES, "--output", str(out),
                     inject=exc)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    message = "'injected bug'" if exc == "KeyError" else "injected bug"  # KeyError shows its key's repr
    assert proc.stderr.rstrip().splitlines()[-1] == f"{exc}: {message}"
    assert "tabletune: error" not in proc.stderr
    assert not out.exists()
