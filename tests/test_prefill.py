"""Prefill cost and the closed-loop throughput with it (tabletune/prefill.py), by hand."""

import json
from pathlib import Path

import pytest

from tabletune.errors import InputError
from tabletune.prefill import PrefillCost, prefill_from_samples, served_tok_s
from tabletune.profile import StepPoint, StepProfile

TUNES = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_served_throughput_by_hand_one_request_at_k0():
    # b = 1, k = 0: a decode step 10 ms (G = 100 tok/s, E = 1), each request L = 4 tokens, prefill 30 ms.
    # A request: its prefill step (10 + 30 ms, 1 token) and 3 decode steps (30 ms): 4 tokens in 70 ms.
    assert served_tok_s(100.0, 1.0, 4, 30.0) == pytest.approx(4 / 0.070)


def test_served_throughput_by_hand_with_drafts():
    # the same step at k with E = 2 tokens a request-step (G = 200 tok/s): the prefill step (40 ms, 1 token),
    # then 3 tokens at 2 a step = 1.5 steps of 10 ms: 4 tokens in 55 ms
    assert served_tok_s(200.0, 2.0, 4, 30.0) == pytest.approx(4 / 0.055)
    # so the prefill pulls k / k=0 from 2.00x (decode only) to 1.27x
    assert served_tok_s(200.0, 2.0, 4, 30.0) / served_tok_s(100.0, 1.0, 4, 30.0) == pytest.approx(70 / 55)


def test_served_throughput_at_load_b_counts_one_prefill_per_request():
    # b = 4, k = 0, T(4, 0) = 20 ms: G = 200 tok/s. L = 100, P = 250 ms. N requests: 100 N / 4 steps of
    # 20 ms (every row-step, prefill rows included, is one token at k = 0) + 250 N ms: 0.75 s per request
    assert served_tok_s(200.0, 1.0, 100, 250.0) == pytest.approx(100 / 0.75)
    assert served_tok_s(200.0, 1.0, 100, 0.0) == pytest.approx(200.0)  # no prefill: the decode goodput


def test_served_throughput_refuses_impossible_inputs():
    with pytest.raises(ValueError, match="P=-1"):
        served_tok_s(100.0, 1.0, 4, -1.0)
    with pytest.raises(ValueError, match="E_k=0.5"):
        served_tok_s(100.0, 0.5, 4, 1.0)


def test_prefill_is_each_prompts_step_over_a_decode_step():
    cost = prefill_from_samples([130.0, 230.0, 25.0], 30.0, [100, 200, 15])
    assert cost.prefill_ms == pytest.approx(100.0)  # 100, 200 and 0 (not slower than a decode step)
    assert (cost.num_prompts, cost.mean_prompt_tokens, cost.decode_step_ms) == (3, 105.0, 30.0)


def test_profile_round_trips_its_prefill(tmp_path):
    cost = PrefillCost(prefill_ms=276.4, num_prompts=64, mean_prompt_tokens=180.5, decode_step_ms=27.8)
    StepProfile((StepPoint(1, 0, (30.0,)),), 207, prefill=cost).save(tmp_path / "s.json")
    assert StepProfile.load(tmp_path / "s.json").prefill == cost


def test_a_profile_without_prefill_loads_with_none(tmp_path):
    StepProfile((StepPoint(1, 0, (30.0,)),), 207).save(tmp_path / "s.json")
    assert "prefill" not in json.loads((tmp_path / "s.json").read_text())
    assert StepProfile.load(tmp_path / "s.json").prefill is None
    # and a committed tune from before the field
    assert StepProfile.load(TUNES / "tune_smollm2_code" / "step_profile.json").prefill is None


def test_a_bad_prefill_field_names_file_field_and_value(tmp_path):
    obj = StepProfile((StepPoint(1, 0, (30.0,)),), 207).to_json()
    obj["prefill"] = {"prefill_ms": "slow", "num_prompts": 4, "mean_prompt_tokens": 10, "decode_step_ms": 3}
    (tmp_path / "s.json").write_text(json.dumps(obj))
    with pytest.raises(InputError, match="s.json: field 'prefill.prefill_ms' = 'slow'"):
        StepProfile.load(tmp_path / "s.json")
    obj["prefill"] = {"prefill_ms": -5, "num_prompts": 4, "mean_prompt_tokens": 10, "decode_step_ms": 3}
    (tmp_path / "s.json").write_text(json.dumps(obj))
    with pytest.raises(InputError, match="field 'prefill'"):
        StepProfile.load(tmp_path / "s.json")


def test_the_prefill_fields_are_the_documented_ones():
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text()
    section = doc.split("## StepProfile (`step_profile.json`)")[1].split("\n## ")[0]
    documented = re.findall(r"^\| `prefill\.(\w+)`", section, re.MULTILINE)
    assert documented == list(PrefillCost(1.0, 1, 1.0, 1.0).to_json())
