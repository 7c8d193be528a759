"""Static or dynamic: the decision from the table's gain and the table mechanism's measured cost."""

from __future__ import annotations

import json

import pytest

from tabletune.goodput import expected_tokens
from tabletune.optimizer import optimize_table
from tabletune.profile import StepPoint
from tabletune.tuner.static_check import NoSpecPoint, StaticDecision, StaticPoint, check_batch_sizes, decide_static

from tuner_fakes import RATES, profile_from, step_ms


def decision(speedup: float, min_gain: float = 0.0):
    profile = profile_from(step_ms)
    result = optimize_table(profile, RATES)
    k = result.best_single_k
    sizes = (1, 8, 64)
    static = [StepPoint(b, k, (step_ms(b, k) / (1 + speedup),) * 3) for b in sizes]
    return result, decide_static(result, static, {b: step_ms(b, k) for b in sizes}, min_gain)


def test_hand_worked_point():
    result, d = decision(0.25)
    p1 = d.points[0]
    k = d.k
    table_k = result.table.k_for(1)
    table_goodput = expected_tokens(RATES, table_k) / step_ms(1, table_k) * 1000
    static_goodput = expected_tokens(RATES, k) / (step_ms(1, k) / 1.25) * 1000
    assert p1.dynamic_cost == pytest.approx(0.25)
    assert p1.vs_static == pytest.approx(table_goodput / static_goodput - 1)
    assert (1 + p1.vs_static) * (1 + p1.dynamic_cost) == pytest.approx(1 + p1.table_gain)


def test_recommends_static_only_when_the_mechanism_costs_more_than_the_table_gains():
    _, free = decision(0.0)
    assert free.mean_dynamic_cost == pytest.approx(0.0) and free.mean_table_gain > 0
    assert not free.recommend_static and "recommend the table" in free.summary()
    _, costly = decision(0.5)
    assert costly.mean_dynamic_cost == pytest.approx(0.5) and costly.recommend_static
    assert f"recommend static k={costly.k}" in costly.summary()
    gain = free.mean_table_gain  # a cost just below / above the table's gain flips the decision
    assert not decision(gain * 0.8)[1].recommend_static
    assert decision(gain * 1.2)[1].recommend_static


def test_plain_decoding_is_priced_against_the_table():
    profile = profile_from(step_ms)
    result = optimize_table(profile, RATES)
    k, sizes = result.best_single_k, (1, 8, 64)
    static = [StepPoint(b, k, (step_ms(b, k),) * 3) for b in sizes]
    plain = [StepPoint(b, 0, (step_ms(b, 0) / 2,) * 3) for b in sizes]  # FULL graphs halve k = 0's step
    d = decide_static(result, static, {b: step_ms(b, k) for b in sizes}, no_spec_points=plain)
    b = 64
    table_k = result.table.k_for(b)
    table_goodput = b * expected_tokens(RATES, table_k) / step_ms(b, table_k) * 1000
    assert d.no_spec[-1].vs_table == pytest.approx(b / (step_ms(b, 0) / 2) * 1000 / table_goodput - 1)
    assert [p.batch_size for p in d.no_spec] == [1, 8, 64] and d.no_spec[-1].static_ms == step_ms(b, 0) / 2
    assert "no speculation (no table) vs the table:" in d.summary()
    with pytest.raises(ValueError, match="k = 0"):
        decide_static(result, static, {b: step_ms(b, k) for b in sizes}, no_spec_points=static)


@pytest.mark.parametrize("gains, start", [
    ((-0.5, 0.1, 0.2), 8),  # pays from b = 8 on
    ((0.1, -0.1, 0.2), 64),  # a loss between: only the last range counts
    ((-0.5, -0.1, -0.2), None),
    ((), None),  # not checked
])
def test_no_speculation_from_the_smallest_b_of_the_last_winning_range(gains, start):
    checked = (StaticPoint(1, 1.0, 1.0, 0.0, 0.0, 0.0),)
    d = StaticDecision(3, checked, 0.0, tuple(NoSpecPoint(b, 1.0, g) for b, g in zip((1, 8, 64), gains)))
    assert d.no_spec_from == start
    if gains:
        want = f"where the load stays at b >= {start}" if start else "speculation pays at every checked b"
        assert want in d.summary()


def test_check_batch_sizes_spread_over_the_range():
    assert check_batch_sizes([1, 2, 4, 8, 16, 32, 64]) == (1, 8, 64)
    assert check_batch_sizes([4, 1]) == (1, 4)


def test_mixed_k_points_are_a_bug():
    result = optimize_table(profile_from(step_ms), RATES)
    with pytest.raises(ValueError, match="share one k"):
        decide_static(result, [StepPoint(1, 0, (1.0,)), StepPoint(2, 1, (1.0,))], {1: 1.0, 2: 1.0})


@pytest.mark.parametrize("speedup, recommend", [(0.0, "table"), (0.6, "static")])
def test_tune_cli_times_the_static_engine_and_writes_its_decision(tmp_path, monkeypatch, speedup, recommend):
    from click.testing import CliRunner

    from tabletune.cli import main
    from tabletune.cli import tune as tune_module

    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "cli"))
    monkeypatch.setitem(tune_module.ADAPTERS, "builtin", "fake_adapter")
    import fake_adapter

    monkeypatch.setattr(fake_adapter, "STATIC_SPEEDUP", speedup)
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["tune", "--engine", "builtin", "--model", "fake", "--k-max", "3",
                                    "--batch-sizes", "1,16,64", "--point-budget-s", "0.01", "--num-prompts", "1",
                                    "--no-refine", "--close-call-margin", "0", "--context-len", "100", "--out", str(out)])
    assert res.exit_code == 0, res.output
    check = json.loads((out / "static_check.json").read_text())
    assert check["recommend"] == recommend
    assert [p["batch_size"] for p in check["points"]] == [1, 16, 64]
    assert [p["batch_size"] for p in check["no_spec"]] == [1, 16, 64]  # a k = 0 engine of its own
    assert check["mean_dynamic_cost"] == pytest.approx(speedup)
    assert check["static_speculative_config"]["num_speculative_tokens"] == check["k"]
    assert "num_speculative_tokens_per_batch_size" not in check["static_speculative_config"]
    assert f"recommend {'the table' if recommend == 'table' else 'static'}" in res.stderr
