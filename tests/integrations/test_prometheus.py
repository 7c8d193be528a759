"""Prometheus sidecar: parsing vLLM's counters, the drafted-per-position correction, resets, the CLI."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
from tabletune.cli import main
from tabletune.controller import Controller, ControllerConfig
from tabletune.integrations.prometheus import (
    SpecCounters,
    Sidecar,
    drafted_per_position,
    naive_rates,
    parse_metrics,
)
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable

from http_fixture import serve_text

PROFILE = StepProfile(tuple(StepPoint(b, k, (10 + 0.5 * b * (1 + 0.6 * k),))
                            for b in (1, 2, 4, 8, 16, 32, 64) for k in range(5)), context_len=0)


def exposition(drafts: float, tokens: float, accepted: list[float], running: float = 8) -> str:
    """vLLM's /metrics text for one engine (the names and labels vLLM 0.32 exports)."""
    labels = 'engine="0",model_name="m"'
    lines = [
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {tokens}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{j}"}} {a}'
          for j, a in enumerate(accepted)],
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {running}",
    ]
    return "\n".join(lines) + "\n"


def test_parse_metrics():
    c = parse_metrics(exposition(100, 250, [80, 50, 20]))
    assert c == SpecCounters(100.0, 250.0, (80.0, 50.0, 20.0), 8.0)
    assert parse_metrics("# TYPE other counter\nother_total 3\n") is None


def test_drafted_per_position_hand_worked():
    # 100 drafts, 250 tokens, the table schedules k in {1, 3}: mean 2.5 -> 75 drafts of 3, 25 of 1
    assert drafted_per_position(100, 250, [3, 1, 0], 4) == (100, 75, 75, 0)
    # one k throughout: exact
    assert drafted_per_position(10, 30, [3], 4) == (10, 10, 10, 0)
    assert drafted_per_position(0, 0, [3], 2) == (0.0, 0.0)


def test_correction_removes_the_bias_of_the_naive_ratio():
    # 50 drafts of length 1 and 50 of length 3, every position accepted with 0.8:
    # acc_1 = 80, acc_2 = 50 * 0.64 = 32, acc_3 = 50 * 0.512 = 25.6
    accepted = [80.0, 32.0, 25.6]
    naive = naive_rates(100, accepted)
    assert naive[1] == pytest.approx(0.32)  # a survival ratio diluted by the short drafts
    counters = iter([SpecCounters(0, 0, (0, 0, 0)), SpecCounters(100, 200, tuple(accepted))])
    c = Controller(PROFILE, [0.5] * 3, ControllerConfig(k_max=3, prior_weight=0))
    side = Sidecar(c, DraftTable.from_ranges([[1, 8, 3], [9, 64, 1]]))
    assert side.feed(next(counters), 0.0) is None  # the first scrape is the baseline
    obs = side.feed(next(counters), 10.0)
    assert obs.drafted == (100, 50, 50)
    assert c.estimator.rates() == pytest.approx([0.8, 0.8, 0.8])


def test_sidecar_ignores_resets_and_nan():
    c = Controller(PROFILE, [0.5] * 4, ControllerConfig(k_max=4))
    side = Sidecar(c, DraftTable.fixed(4))
    assert side.feed(SpecCounters(100, 400, (50, 25, 12, 6)), 0) is None
    assert side.feed(SpecCounters(200, 800, (100, 50, 24, 12)), 1) is not None
    assert side.feed(SpecCounters(10, 40, (5, 2, 1, 0)), 2) is None  # engine restarted
    assert side.feed(SpecCounters(math.nan, 40, (5, 2, 1, 0)), 3) is None
    assert side.baselines[""].ignored == 2 and c.steps == 1


@pytest.fixture
def metrics_server():
    """A real HTTP /metrics endpoint whose counters grow with each scrape (acceptance 0.9, k = 4)."""
    state = {"n": 0}

    def body(path: str) -> bytes:
        n = state["n"] = state["n"] + 1
        d = 200.0 * n
        return exposition(d, 4 * d, [d * 0.9 ** j for j in range(1, 5)], running=4).encode()

    with serve_text(body) as url:
        yield url + "/metrics"


def test_cli_control_recommends_a_table(tmp_path, metrics_server):
    PROFILE.save(tmp_path / "step_profile.json")
    AcceptanceProfile([AcceptanceCounts(k_max=4, workload="chat", reached=[100, 30, 9, 3],
                                        accepted=[30, 9, 3, 1])]).save(tmp_path / "acceptance.json")
    out = tmp_path / "rec.json"
    result = CliRunner().invoke(main, [
        "control", "--metrics-url", metrics_server, "--profile", str(tmp_path), "--table", "[[1,64,0]]",
        "--k-max", "4", "--max-batch", "64", "--interval-s", "0.01", "--iterations", "6", "--output", str(out),
        "--options", json.dumps({"rebuild_interval_s": 0, "min_install_interval_s": 0})])
    assert result.exit_code == 0, result.output
    assert "(changed)" in result.output
    rec = json.loads(out.read_text())
    assert rec["num_speculative_tokens_per_batch_size"][0][2] == 4  # high acceptance: k = 4 at b = 1


def test_cli_control_bad_input(tmp_path):
    result = CliRunner().invoke(main, ["control", "--metrics-url", "http://127.0.0.1:9/metrics",
                                       "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert "step_profile.json" in result.output
