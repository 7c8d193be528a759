"""One tuning run over a fake in-test Engine (the real ones: tests/integrations, tests/engine)."""

from __future__ import annotations

import pytest

from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.tuner import TunePlan, run_plan

from tuner_fakes import FakeEngine, step_ms


def test_run_plan_measures_acceptance_then_the_grid():
    engine = FakeEngine()
    plan = TunePlan(batch_sizes=(1, 4, 16, 64), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2)
    seen = []
    outcome = run_plan(engine, plan, ["p"] * 3, workload="code", command="tabletune tune x",
                       progress=lambda t, f: seen.append(f))
    assert outcome.rates == pytest.approx((0.9, 0.8, 50 / 72))  # reached 100, 90, 72; accepted 90, 72, 50
    assert outcome.acceptance.workload == "code" and outcome.acceptance.num_drafts == 100
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    assert outcome.profile.fingerprint.command == "tabletune tune x"
    assert set(plan.batch_sizes) <= set(outcome.profile.batch_sizes)
    assert set(outcome.refined_batch_sizes) == set(outcome.profile.batch_sizes) - set(plan.batch_sizes)
    assert outcome.profile.step_ms(16, 2) == step_ms(16, 2) == 34.0
    assert outcome.yields == ()  # every request drafted: no per-k acceptance runs


def test_run_plan_table_shrinks_k_with_b():
    plan = TunePlan(batch_sizes=(1, 4, 16, 64), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2)
    outcome = run_plan(FakeEngine(), plan, ["p"])
    table = optimize_table(outcome.profile, outcome.rates, OptimizeOptions(k_max=3)).table
    # b=1: T = 10.5 + 0.5k, E[tokens|3] = 1 + .9 + .72 + .5 = 3.12 over 12 ms beats k=2 (2.62 / 11.5 ms)
    assert table.k_for(1) == 3
    # b=64: T = 42 + 32k; k=0 gives 64/42 = 1.52 tok/ms, k=1 64*1.9/74 = 1.64, k=2 64*2.62/106 = 1.58
    assert table.k_for(64) == 1


def test_run_plan_without_any_verified_draft_is_an_error():
    class Silent(FakeEngine):
        def measure_acceptance(self, prompts, k, max_tokens):
            from tabletune.acceptance import AcceptanceCounts

            return AcceptanceCounts(k_max=k)

    with pytest.raises(RuntimeError, match="no draft was verified"):
        run_plan(Silent(), TunePlan((1,), (0, 1), steps_per_call=1, min_samples=1), ["p"])


def test_run_plan_records_the_prefill_of_an_engine_that_measures_it():
    from tabletune.prefill import PrefillCost

    class Prefilling(FakeEngine):
        def measure_prefill(self, prompts):
            self.prefilled = list(prompts)
            return PrefillCost(prefill_ms=12.5, num_prompts=len(prompts), mean_prompt_tokens=40.0, decode_step_ms=10.0)

    plan = TunePlan(batch_sizes=(1, 4), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2, refine=False)
    engine = Prefilling()
    outcome = run_plan(engine, plan, ["p", "q"])
    assert engine.prefilled == ["p", "q"]  # the workload's own prompts
    assert outcome.profile.prefill == PrefillCost(12.5, 2, 40.0, 10.0)
    assert run_plan(FakeEngine(), plan, ["p"]).profile.prefill is None  # an engine without it: decode-only
