"""A healthy `tabletune tune` on vLLM shows no engine warnings or tracebacks unless --verbose (slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


def test_default_run_shows_only_progress_and_results(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tabletune", "tune", "--engine", "vllm", "--model", "tiny-llama", "--k-max", "2",
         "--batch-sizes", "1,2", "--synthetic-acceptance", "0.8,0.7", "--point-budget-s", "0.3", "--num-prompts", "2",
         "--no-refine", "--close-call-margin", "0", "--out", str(out), "--", "--max-model-len", "1024"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in ("Traceback", "WARNING", "Warning", "Chat template", "Triton"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    assert f"wrote {out / 'table.json'}" in proc.stderr
    assert proc.stdout.splitlines()[-1] == f"png: {out / 'tune.png'}"
    fingerprint = json.loads((out / "step_profile.json").read_text())["fingerprint"]
    assert fingerprint["flags"] == "--max-model-len 1024"  # the engine flags after -- are recorded
    assert "static check: skipped (on CPU" in proc.stderr
