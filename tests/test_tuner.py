"""The tuner's plan and orchestration, over a fake in-test Engine (the real one: tests/integrations)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from click.testing import CliRunner

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
from tabletune.cli import main
from tabletune.errors import InputError
from tabletune.profile import Fingerprint, StepPoint, StepProfile
from tabletune.table import DraftTable
from tabletune.tune_files import FILES, predict_gains, write_run
from tabletune.tuner import (
    Engine,
    StepSamples,
    TunePlan,
    check_grid,
    geometric_batch_sizes,
    interference_filter,
    measure_points,
    recheck_points,
    refinement_batch_sizes,
    run_plan,
    suspect_points,
)

RATES = (0.9, 0.8, 0.7)


def step_ms(b: int, k: int) -> float:
    """Overhead-bound at small b, compute-bound at large b: T = 10 + 0.5 * b * (k + 1)."""
    return 10.0 + 0.5 * b * (k + 1)


class FakeEngine:
    """Deterministic step times; every ``slow_every``-th sample is 5x (interference)."""

    max_batch_size = 64
    k_max = 3
    context_len = 100

    def __init__(self, slow_every: int = 0) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.slow_every = slow_every
        self.n = 0

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(engine="fake", model="m")

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples:
        self.calls.append((batch_size, k, num_steps))
        out = []
        for _ in range(num_steps):
            self.n += 1
            slow = self.slow_every and self.n % self.slow_every == 0
            out.append(step_ms(batch_size, k) * (5 if slow else 1))
        return StepSamples(tuple(out), tuple([batch_size * (k + 1)] * num_steps))

    def measure_acceptance(self, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceCounts:
        counts = AcceptanceCounts(k_max=k)
        # 100 drafts of k=3 accepting 0/1/2/3 tokens: reached 100, 90, 72; accepted 90, 72, 50
        for m, n in ((0, 10), (1, 18), (2, 22), (3, 50)):
            for _ in range(n):
                counts.observe_draft(k, m)
        return counts

    def close(self) -> None:
        pass


def test_fake_engine_satisfies_protocol():
    assert isinstance(FakeEngine(), Engine)


def test_geometric_batch_sizes():
    assert geometric_batch_sizes(1) == (1,)
    assert geometric_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert geometric_batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    with pytest.raises(ValueError):
        geometric_batch_sizes(0)


def test_check_grid_rejects_batch_above_max_num_seqs():
    check_grid([1, 64], 4, 64)
    with pytest.raises(InputError, match="exceeds max_num_seqs=64"):
        check_grid([1, 128], 4, 64)
    with pytest.raises(InputError, match="k_max"):
        check_grid([1], 0, 64)


def test_interference_filter_keeps_fast_samples():
    samples = [10.0, 10.5, 11.0, 50.0, 12.9, 13.1]
    assert interference_filter(samples, 0.3) == [0, 1, 2, 4]  # floor 10 -> keep <= 13
    assert interference_filter(samples, None) == list(range(6))


def test_measure_points_round_robin_and_stops_when_spread_small():
    engine = FakeEngine()
    plan = TunePlan(batch_sizes=(1, 4), ks=(0, 1, 2), steps_per_call=4, min_samples=8)
    points = measure_points(engine, plan.batch_sizes, plan)
    # constant times: spread 0, so exactly min_samples = 2 calls per point, k round-robin per b
    assert engine.calls == [(1, 0, 4), (1, 1, 4), (1, 2, 4)] * 2 + [(4, 0, 4), (4, 1, 4), (4, 2, 4)] * 2
    by_key = {(p.batch_size, p.k): p for p in points}
    assert by_key[(4, 2)].median_ms == step_ms(4, 2) == 16.0
    assert by_key[(4, 2)].scheduled_tokens == (12,) * 8


def test_measure_points_drops_interference_and_respects_budget():
    engine = FakeEngine(slow_every=3)
    now = [0.0]

    def clock() -> float:
        now[0] += 0.5  # each call "takes" 0.5 s between its two clock reads
        return now[0]

    plan = TunePlan(batch_sizes=(2,), ks=(0,), steps_per_call=3, min_samples=100, point_budget_s=1.0)
    (point,) = measure_points(engine, plan.batch_sizes, plan, clock=clock)
    assert len(engine.calls) == 2  # budget 1 s reached after two 0.5 s calls, min_samples never
    assert point.samples_ms == (step_ms(2, 0),) * 4  # the two 5x samples were dropped


def test_suspect_points_are_rechecked():
    class Contended(FakeEngine):
        def measure_step(self, batch_size, k, num_steps):
            got = super().measure_step(batch_size, k, num_steps)
            hit = (batch_size, k) == (1, 2) and len(self.calls) == 1  # only the first call is slowed
            return StepSamples(tuple(s * 40 for s in got.samples_ms) if hit else got.samples_ms, got.scheduled_tokens)

    engine = Contended()
    plan = TunePlan(batch_sizes=(1, 4), ks=(2, 3), steps_per_call=2, min_samples=2)
    points = measure_points(engine, (1,), TunePlan(batch_sizes=(1,), ks=(2,), steps_per_call=2, min_samples=2))
    points += measure_points(engine, (1, 4), TunePlan(batch_sizes=(1, 4), ks=(3,), steps_per_call=2, min_samples=2))
    assert points[0].median_ms == 40 * step_ms(1, 2)
    assert suspect_points(points, 0.15) == [(1, 2)]  # slower than (1, 3) and (4, 3), which do more work
    fixed = {(p.batch_size, p.k): p for p in recheck_points(engine, points, plan)}
    assert fixed[(1, 2)].median_ms == step_ms(1, 2)  # fresh samples; the 40x ones fail the filter
    assert suspect_points(list(fixed.values()), 0.15) == []


def profile_from(fn, bs=(1, 2, 4, 8, 16, 32, 64), ks=(0, 1, 2, 3)) -> StepProfile:
    return StepProfile(tuple(StepPoint(b, k, (fn(b, k),)) for b in bs for k in ks), context_len=100)


def test_refinement_adds_midpoints_where_k_changes():
    profile = profile_from(step_ms)
    mids = refinement_batch_sizes(profile, RATES, 3)
    # k*(b): goodput ratio k vs k-1 falls as b grows; every midpoint lies strictly between measured b
    assert mids and all(b not in profile.batch_sizes for b in mids)
    flat = profile_from(lambda b, k: 10.0)  # flat cost: k=3 everywhere, nothing to refine
    assert refinement_batch_sizes(flat, RATES, 3) == []


def test_run_plan_and_write_run(tmp_path):
    engine = FakeEngine()
    plan = TunePlan(batch_sizes=(1, 4, 16, 64), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2)
    seen = []
    outcome = run_plan(engine, plan, ["p"] * 3, workload="code", progress=lambda t, f: seen.append(f))
    assert outcome.rates == pytest.approx((0.9, 0.8, 50 / 72))  # reached 100, 90, 72
    assert seen[-1] == 1.0 and seen == sorted(seen)
    config = lambda ranges: {"method": "ngram", "num_speculative_tokens": 3,  # noqa: E731
                             "num_speculative_tokens_per_batch_size": ranges}
    result, files = write_run(tmp_path / "run", outcome, config)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(FILES)
    table = DraftTable.load(files["table.json"])
    assert table == result.table and json.loads(files["table.json"].read_text())["num_speculative_tokens"] == 3
    spec = json.loads(files["speculative_config.json"].read_text())
    assert spec["num_speculative_tokens_per_batch_size"] == table.as_lists()
    assert StepProfile.load(files["step_profile.json"]).batch_sizes == list(outcome.profile.batch_sizes)
    assert AcceptanceProfile.load(files["acceptance.json"]).select("code").num_drafts == 100
    assert table.k_for(1) == 3 and table.k_for(64) < table.k_for(1)  # k shrinks with b
    gains = predict_gains(outcome, result)
    assert gains.vs_best_fixed[1] >= -1e-12  # the optimal table never loses to a fixed k
    assert gains.documented == DraftTable(((1, 16, 3), (17, 32, 3), (33, 64, 3), (65, 128, 1), (129, 512, 0)))


def test_write_run_failure_leaves_nothing(tmp_path):
    outcome = run_plan(FakeEngine(), TunePlan((1, 8), (0, 1), steps_per_call=1, min_samples=1, refine=False), ["p"])

    def broken(ranges):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_run(tmp_path / "run", outcome, broken)
    assert list(tmp_path.iterdir()) == []


def test_tune_cli_bad_input_exits_2_before_any_engine(tmp_path, monkeypatch):
    runner = CliRunner()
    out = str(tmp_path / "o")
    cases = [
        (["--model", "no-such-model"], "unknown model"),
        (["--model", "tiny-llama", "--method", "telepathy"], "unknown method"),
        (["--model", "tiny-llama", "--k-max", "99"], "supports k in"),
        (["--model", "tiny-llama", "--batch-sizes", "1,128", "--max-num-seqs", "64"], "exceeds max_num_seqs"),
        (["--model", "tiny-llama", "--synthetic-acceptance", "0.9,1.5"], "(0, 1]"),
        (["--model", "tiny-llama", "--synthetic-acceptance", "0.9", "--k-max", "3"], "at least k_max=3"),
        (["--model", "tiny-llama", "--method", "eagle3"], "needs a draft model"),
    ]
    for args, text in cases:
        res = runner.invoke(main, ["tune", *args, "--out", out])
        assert res.exit_code == 2, (args, res.output)
        assert text in res.output
    from tabletune import tune_cli

    monkeypatch.setitem(tune_cli.ADAPTERS, "builtin", "tabletune.engine.no_such_adapter")
    res = runner.invoke(main, ["tune", "--engine", "builtin", "--model", "tiny-llama", "--out", out])
    assert res.exit_code == 2 and "not available" in res.output
    assert not (tmp_path / "o").exists()
