"""benchmarks/policies_sim.py's calibration of hybrid-static's m on the calibration half (a tiny run on the CPU)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import policies_sim  # noqa: E402

from tabletune.sim.replay import load_traces  # noqa: E402


def test_hybrid_m_on_a_tiny_calibration_set():
    """code-edit's n-gram lookups match 2 or 5 tokens: m = 1 and 2 put the same rows on the chain, so do m = 3..5,
    and m = 6, 7 (above the longest match) put none; each group scores alike, and the best m scores 1."""
    cost = policies_sim.h200_cost()
    cal = load_traces([policies_sim.TRACES / "early-exit_code-edit_T0.csv.gz"], half="calibration")
    rates = policies_sim.floor_rates(cal.conditional_rates(cost.k_max))
    choice = policies_sim.hybrid_m(cost, "code-edit", rates, policies_sim.Protocol(), cost.k_max, loads=(1, 8),
                                   duration_s=1.0)
    share = dict(zip(choice.candidates, choice.mean_share))
    assert choice.candidates == tuple(range(1, cost.k_max + 1)) and share[choice.m] == max(share.values()) == 1.0
    assert share[1] == share[2] and share[3] == share[4] == share[5] and share[6] == share[7]
    assert choice.m in (1, 3, 6)  # ties go to the smaller m


def test_calibrated_spec_carries_m_unless_the_spec_sets_one():
    calib = policies_sim.Calibration("code", (0.5,), (0.0,), "disco.json", 0.5, "table.json", 4, (1.0,))
    assert calib.spec("hybrid-static") == "hybrid-static:m=4"
    assert calib.spec("hybrid-static:m=2") == "hybrid-static:m=2"
    assert calib.spec("tabletune") == "tabletune"


def test_policy_specs_split_on_semicolons_else_on_commas_keeping_options_with_their_spec():
    assert policies_sim.split_specs("tabletune,disco") == ["tabletune", "disco"]
    assert policies_sim.split_specs("controller:per-request;controller:per-request,stop=1") == \
        ["controller:per-request", "controller:per-request,stop=1"]
    assert policies_sim.split_specs("controller:per-request,gate=1") == ["controller:per-request,gate=1"]
    assert policies_sim.split_specs("fixed:2,controller:per-request,gate=1,ngram=0,disco:variant=threshold") == \
        ["fixed:2", "controller:per-request,gate=1,ngram=0", "disco:variant=threshold"]


def test_a_grid_cell_is_the_mean_of_its_repeats(tmp_path):
    """Fixed k, policies and the oracle each run over their seeds; a cell is the mean, with each run and the band."""
    out = tmp_path / "grid"
    assert policies_sim.main(["--workloads", "code", "--loads", "2", "--policies", "tabletune", "--warmup-steps", "5",
                              "--warmup-s", "0", "--measured-steps", "20", "--measured-row-steps", "40",
                              "--fixed-repeats", "2",
                              "--policy-repeats", "3", "--out", str(out)]) == 0
    import json

    cells = json.loads(out.with_suffix(".json").read_text())["cells"]
    for c in cells:
        runs = c["sim_tok_s_repeats"]
        assert len(runs) == (2 if c["policy"].startswith("fixed:") else 3), c["policy"]
        assert c["sim_tok_s"] == pytest.approx(sum(runs) / len(runs), abs=0.01)
        assert c["noise_band"] == pytest.approx((max(runs) - min(runs)) / (sum(runs) / len(runs)), abs=1e-4)
    # seeds draw other requests: a policy's runs differ
    assert len(set(next(c for c in cells if c["policy"] == "tabletune")["sim_tok_s_repeats"])) > 1
    assert {c["measured_steps"] for c in cells} == {20}  # 40 row-steps at load 2 is what 20 steps hold


def test_the_window_holds_the_row_steps_at_low_load():
    """500 steps, or 4,000 row-steps where that is more: 4,000 / 2,000 / 1,000 steps at loads 1 / 2 / 4, 500 from
    load 8; 0 row-steps keeps 500 everywhere."""
    protocol = policies_sim.Protocol()
    assert [protocol.window_steps(b) for b in (1, 2, 3, 4, 8, 128)] == [4000, 2000, 1334, 1000, 500, 500]
    assert policies_sim.Protocol(measured_row_steps=0).window_steps(1) == 500
    with pytest.raises(ValueError):
        policies_sim.Protocol(measured_row_steps=-1)


def test_a_gated_cell_records_its_gate():
    """A cell of the gated per-request controller records the gate's D and its pairs (what the live A/B test
    measured, the policy's ``timed`` wrapper seen through); a policy without a gate records neither."""
    from tabletune.controller.mode_gate import Pair
    from tabletune.policies import PolicyContext, make_policy
    from tabletune.policies.timed import timed

    cost = policies_sim.h200_cost()
    ctx = PolicyContext(cost=cost, prior_rates=(0.7,) * cost.k_max, ks=tuple(range(cost.k_max + 1)),
                        ngram_rates=(0.5,) * cost.k_max)
    policy = timed(make_policy("controller:per-request,gate=1", ctx))
    for pair in (Pair(1.2, 1.0), Pair(0.9, 1.0)):
        policy.inner.gate._add(pair)
    # 0.2, then 0.2 + (-0.1 - 0.2) / 1.7
    assert policies_sim.gate_state(policy) == {"gate_difference": 0.0235, "gate_pairs": 2,
                                               "gate_pair_differences": [0.2, -0.1]}
    assert policies_sim.gate_state(timed(make_policy("controller:per-request", ctx))) == {}
    assert policies_sim.gate_state(timed(make_policy("controller", ctx))) == {}
