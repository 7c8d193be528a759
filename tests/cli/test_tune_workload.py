"""``tune`` times its grid at the workload's shape and picks the served optimum (fake engine whose step cost
grows with the context and with the n-gram proposer's search: tests/cli/workload_adapter.py)."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.cli import tune as tune_module
from tabletune.profile import StepProfile
from tabletune.table import DraftTable

E_TOKENS = {0: 1.0, 1: 1.9, 2: 2.62, 3: 3.12}  # 1 + sum of prod of the fake's rates 0.9, 0.8, 50/72
SIZES = (1, 16, 32, 64)
OUTPUT_TOKENS = 100


@pytest.fixture
def workload_engine(monkeypatch):
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "workload_adapter")


@pytest.fixture
def prompts(tmp_path):
    """Three prompts of 200, 250 and 300 random letters (text that does not repeat itself)."""
    rng = random.Random(7)
    texts = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)) for n in (250, 200, 300)]
    path = tmp_path / "letters.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, texts


def served_best_k(texts, b: int) -> int:
    import workload_adapter

    return max(range(4), key=lambda k: b * E_TOKENS[k] / workload_adapter.served_step_ms(texts, OUTPUT_TOKENS, b, k))


def tune(tmp_path, prompt_file, *extra):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", ",".join(map(str, SIZES)), "--prompts", str(prompt_file),
                                    "--num-prompts", "3", "--output-tokens", str(OUTPUT_TOKENS),
                                    "--point-budget-s", "0.01", "--no-refine", "--close-call-margin", "0",
                                    "--no-static-check", "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    return out


def test_the_tune_picks_the_served_optimum(tmp_path, prompts, workload_engine):
    prompt_file, texts = prompts
    served = {b: served_best_k(texts, b) for b in SIZES}
    assert served[1] == 3 and served[64] == 0  # drafting pays at b = 1, the search and the context sink it at 64
    out = tune(tmp_path, prompt_file)
    # the median prompt (250 tokens: one byte each) + half of the 100 generated tokens
    assert StepProfile.load(out / "step_profile.json").context_len == 300
    table = DraftTable.load(out / "table.json")
    assert {b: table.k_for(b) for b in SIZES} == served


def test_context_lens_take_quantiles_of_the_prompt_set(tmp_path, prompts, workload_engine):
    prompt_file, _ = prompts
    out = tune(tmp_path, prompt_file, "--context-lens", "p0,p75,400")
    # p0 = 200 + 50; p75: h = 0.75 * 2 = 1.5 -> 250 + 0.5 * (300 - 250) = 275, + 50 = 325; 400 as given
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["context-250", "context-325", "context-400"]


def test_bad_context_lens_are_bad_input(tmp_path, prompts, workload_engine):
    prompt_file, _ = prompts
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--prompts", str(prompt_file),
                                    "--context-lens", "p50,q9", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "q9" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
