"""``tabletune tune``: flags to an EngineSpec and a plan, bad input before any engine, a run over a fake adapter."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.cli import tune as tune_module
from tabletune.table import DraftTable

FAST = ["--point-budget-s", "0.01", "--num-prompts", "1", "--no-refine", "--close-call-margin", "0"]


@pytest.fixture
def fake_engine(monkeypatch):
    """`--engine builtin` runs tests/cli/fake_adapter.py."""
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "fake_adapter")


def test_build_spec_defaults_to_the_geometric_grid():
    spec, sizes = tune_module.build_spec("tiny-llama", "ngram", None, 3, 48, None, None, 128, 0)
    assert sizes == (1, 2, 4, 8, 16, 32, 48)
    assert spec.max_batch_size == 48 and spec.k_max == 3 and spec.synthetic_acceptance is None
    spec, sizes = tune_module.build_spec("tiny-llama", "ngram", None, 2, None, "8,1,4,4", "0.9,0.8", 64, 1)
    assert sizes == (1, 4, 8) and spec.max_batch_size == 8 and spec.synthetic_acceptance == (0.9, 0.8)


def test_engine_logs_at_error_unless_verbose():
    assert tune_module.engine_log_env(False) == {"VLLM_LOGGING_LEVEL": "ERROR", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    assert tune_module.engine_log_env(True) == {}


def test_tune_sets_the_engine_logs_at_its_entry(tmp_path, fake_engine):
    import logging
    import os

    args = ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "1", "--batch-sizes", "1", *FAST]
    assert CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")]).exit_code == 0
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR" and logging.getLogger("vllm").level == logging.ERROR
    del os.environ["VLLM_LOGGING_LEVEL"]
    logging.getLogger("vllm").setLevel(logging.NOTSET)
    assert CliRunner().invoke(main, [*args, "--verbose", "--out", str(tmp_path / "b")]).exit_code == 0
    assert "VLLM_LOGGING_LEVEL" not in os.environ and logging.getLogger("vllm").level == logging.NOTSET


@pytest.mark.parametrize("args, text", [
    (["--model", "no-such-model"], "unknown model"),
    (["--model", "tiny-llama", "--method", "telepathy"], "unknown method"),
    (["--model", "tiny-llama", "--k-max", "99"], "supports k in"),
    (["--model", "tiny-llama", "--k-max", "0"], "--k-max: field 'k_max' = 0: must be >= 1"),
    (["--model", "tiny-llama", "--batch-sizes", "1,128", "--max-num-seqs", "64"], "exceeds max_num_seqs"),
    (["--model", "tiny-llama", "--batch-sizes", "1,two"], "'two'"),
    (["--model", "tiny-llama", "--synthetic-acceptance", "0.9,1.5"], "(0, 1]"),
    (["--model", "tiny-llama", "--synthetic-acceptance", "0.9", "--k-max", "3"], "at least k_max=3"),
    (["--model", "tiny-llama", "--method", "eagle3"], "needs a draft model"),
    (["--model", "tiny-llama", "--close-call-margin", "1"], "--close-call-margin"),
    (["--model", "tiny-llama", "--point-budget-s", "0"], "--point-budget-s"),
    (["--model", "tiny-llama", "--prompts", "no-such-set"], "choose one of"),
    (["--model", "tiny-llama", "--policy", "gammatune"], "only the builtin engine measures under a policy"),
])
def test_bad_input_exits_2_before_any_engine(tmp_path, args, text):
    res = CliRunner().invoke(main, ["tune", *args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, (args, res.output)
    assert text in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_missing_adapter_module_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "tabletune.engine.no_such_adapter")
    args = ["tune", "--engine", "builtin", "--model", "tiny-llama", "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "adapter module tabletune.engine.no_such_adapter is not available" in res.stderr


def test_tune_over_a_fake_engine_writes_every_file(tmp_path, fake_engine):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", "1,16,64", *FAST, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["step_profile.json", "acceptance.json", "table.json", "speculative_config.json", "tune.png",
         "static_check.json", "sglang_adaptive_config.json"])
    table = DraftTable.load(out / "table.json")
    # rates 0.9, 0.8, 50/72: E = 1, 1.9, 2.62, 3.12 tokens. b=1: k=3 (3.12 / 12 ms); b=64: k=1 (64 * 1.9 / 74 ms)
    assert table.k_for(1) == 3 and table.k_for(64) == 1
    assert json.loads(res.stdout.splitlines()[0]) == json.loads((out / "table.json").read_text())
    assert res.stdout.splitlines()[1] == f"png: {out / 'tune.png'}"
    spec = json.loads((out / "speculative_config.json").read_text())
    assert spec == {"method": "ngram", "num_speculative_tokens": 3,
                    "num_speculative_tokens_per_batch_size": table.as_lists()}
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"
    sglang = json.loads((out / "sglang_adaptive_config.json").read_text())
    assert [sglang[str(s)]["candidate_steps"] for s, _, _ in table.ranges] == [[k] for _, _, k in table.ranges]
    assert "verdict: the table is worth using over fixed k=" in res.stderr


def test_a_bug_in_the_engine_exits_1_and_writes_no_output(tmp_path, fake_engine, monkeypatch):
    import fake_adapter

    def broken(self, batch_size, k, num_steps):
        raise KeyError("injected")

    monkeypatch.setattr(fake_adapter.FakeEngine, "measure_step", broken)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "2",
                                    "--batch-sizes", "1,2", *FAST, "--out", str(out)])
    assert res.exit_code == 1
    assert isinstance(res.exception, KeyError) and res.exception.args == ("injected",)
    # no output; the checkpoint keeps what was measured (the acceptance pass) for --resume
    assert [p.name for p in tmp_path.iterdir()] == ["run.partial"]
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "run.partial" / "points.jsonl").read_text().splitlines()]
    assert kinds == ["start", "acceptance"]


def test_an_eagle_tune_prints_how_to_serve_it_on_sglang(tmp_path, fake_engine):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--method", "eagle",
                                    "--k-max", "3", "--batch-sizes", "1,16,64", *FAST, "--out", str(out)])
    assert res.exit_code == 0, res.output
    flags = " ".join(res.stderr.split())  # rich wraps long lines
    assert "--speculative-num-steps 3 --speculative-num-draft-tokens 4 --speculative-adaptive" in flags
    assert f"--speculative-adaptive-config {out / 'sglang_adaptive_config.json'}" in flags
