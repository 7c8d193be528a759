"""`make test-slow`: tools/run_slow_tests.sh runs every slow file, also after a failure, and names the failing ones."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "run_slow_tests.sh"

SLOW = "import pytest\n\npytestmark = pytest.mark.slow\n\n\ndef test_it():\n    assert {}\n"


def test_every_slow_file_runs_and_the_failing_ones_are_named(tmp_path):
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "test_a_fails.py").write_text(SLOW.format("1 == 2"))
    (tests / "test_b_passes.py").write_text(SLOW.format("True"))
    # named by the search (the marker in a comment), but no slow test: pytest exits 5, which is no failure
    (tests / "sub" / "test_c_none.py").write_text("# pytest.mark.slow\n\n\ndef test_fast():\n    pass\n")
    (tests / "helper_slow.py").write_text(SLOW.format("1 == 2"))  # not a test file: not run
    proc = subprocess.run(["bash", str(SCRIPT), sys.executable, "tests"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    ran = [line[3:] for line in out.splitlines() if line.startswith("== tests/")]
    assert ran == ["tests/sub/test_c_none.py", "tests/test_a_fails.py", "tests/test_b_passes.py"]
    assert "1 failed" in out and "1 passed" in out and "1 deselected" in out
    summary = out[out.index("== 1 of 3 slow test files failed:"):].splitlines()
    assert summary[1:] == ["   tests/test_a_fails.py (exit 1)"]


def test_all_passing_exits_zero(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ok.py").write_text(SLOW.format("True"))
    proc = subprocess.run(["bash", str(SCRIPT), sys.executable, "tests"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "== all 1 slow test files passed", proc.stdout


def test_the_makefile_runs_the_script():
    recipe = (ROOT / "Makefile").read_text().split("\ntest-slow:")[1].split("\n\n")[0]
    assert "tools/run_slow_tests.sh $(BIN)/python tests" in recipe
