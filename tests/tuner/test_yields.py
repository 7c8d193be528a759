import dataclasses
import json

import pytest

from tabletune.acceptance import AcceptanceCounts
from tabletune.cost import MixedStep
from tabletune.goodput import DraftYield
from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.profile import StepPoint, StepProfile
from tabletune.tuner import TunePlan, run_plan
from tabletune.tuner.checkpoint import Checkpoint
from tabletune.tuner.files import YIELDS_FILE, load_yields, predict_gains, write_run
from tabletune.tuner.run import measure_inputs, run_contexts
from tabletune.tuner.yields import DraftShare, fit_share, measure_yields, yield_from_counts

from tuner_fakes import FakeEngine as FakeStepEngine, profile_from, step_ms


def counts(drafts: list[tuple[int, int]], undrafted: int) -> AcceptanceCounts:
    c = AcceptanceCounts(k_max=4)
    for k, m in drafts:
        c.observe_draft(k, m)
    c.observe_undrafted(undrafted)
    return c


def test_yield_from_counts_hand_worked():
    # 3 drafts accepting 2, 0, 4 tokens and 5 undrafted request-steps: 6 accepted over 8 request-steps
    y = yield_from_counts(4, counts([(4, 2), (4, 0), (4, 4)], 5))
    assert y == DraftYield(4, 1.0 + 6 / 8, 3 / 8)
    assert yield_from_counts(0, counts([], 3)) == DraftYield(0, 1.0, 0.0)


class FakeEngine:
    """Acceptance by k: a short k drafts more often (more steps inside matched spans)."""

    def __init__(self):
        self.asked = []

    def measure_acceptance(self, prompts, k, max_tokens):
        self.asked.append(k)
        return counts([(k, k)] * (10 - k), 2 * k)


def test_measure_yields_runs_every_k_and_the_table_follows_them():
    engine = FakeEngine()
    yields, steps = measure_yields(engine, ["p"], (0, 1, 2, 3), 64)
    assert steps == ()  # this engine records no steps
    assert engine.asked == [1, 2, 3]
    assert [y.draft_rate for y in yields] == pytest.approx([0.0, 9 / 11, 8 / 12, 7 / 13])
    # T(b, k) = 10 + b (1 + k): drafting gets dear with b, so k falls as b grows
    prof = StepProfile(points=tuple(StepPoint(b, k, (10.0 + b * (1 + k),)) for b in (1, 64) for k in range(4)),
                       context_len=0)
    result = optimize_table(prof, (), OptimizeOptions(max_batch=64, yields=yields, draft_share=1.0))
    dense = result.table.dense(64)
    assert dense[1] == 3 and dense[64] < 3
    with pytest.raises(ValueError, match="no draft length is allowed"):
        optimize_table(prof, (), OptimizeOptions(max_batch=64, ks=(0,), yields=yields[1:]))
    with pytest.raises(ValueError):
        DraftYield(2, 3.5, 0.5)


TRUE_SHARE = 0.3


class MatchOnlyEngine(FakeStepEngine):
    """A drafter that proposes only on a match: 20 of 100 request-steps draft, each accepting min(k, 2)
    tokens; the rates alone (a_1 = a_2 = 1) would promise up to k + 1 tokens a step. Its acceptance
    runs' steps cost T(b, k_bar) + f (T(b, k_top) - T(b, k_bar)) with f = TRUE_SHARE."""

    def __init__(self, die_at_k: int | None = None) -> None:
        super().__init__()
        self.asked: list[int] = []
        self.die_at_k = die_at_k
        self.last_k = 0

    def measure_acceptance(self, prompts, k, max_tokens):
        if k == self.die_at_k:
            raise KeyboardInterrupt
        self.asked.append(k)
        self.last_k = k
        return counts([(k, min(k, 2))] * 20, 80)

    def take_mixed_steps(self):
        k = self.last_k
        out = []
        for b in (2, 4, 8):
            for drafting in range(b + 1):  # rows 0..drafting-1 draft k, the others none
                k_top, k_bar = (k if drafting else 0), drafting * k / b
                ms = step_ms(b, k_bar) + TRUE_SHARE * (step_ms(b, k_top) - step_ms(b, k_bar))
                out.append(MixedStep(b, k_top, k_bar, ms))
        return out


PLAN = TunePlan(batch_sizes=(1, 4, 16, 64), ks=(0, 1, 2, 3), steps_per_call=2, min_samples=2,
                close_call_windows=0, recheck_passes=0)


class Unrecorded(MatchOnlyEngine):
    take_mixed_steps = None  # an engine that does not offer its steps


def test_run_plan_measures_every_k_below_the_draft_rate_and_predicts_the_gain_it_can_deliver(tmp_path):
    engine = MatchOnlyEngine()
    outcome = run_plan(engine, PLAN, ["p"])
    assert engine.asked == [3, 1, 2]  # k_max first, then the shorter k
    assert [y.k for y in outcome.yields] == [0, 1, 2, 3]
    assert [y.tokens_per_step for y in outcome.yields] == pytest.approx([1.0, 1.2, 1.4, 1.4])
    assert [y.draft_rate for y in outcome.yields] == pytest.approx([0.0, 0.2, 0.2, 0.2])
    # f fitted to the runs' own steps (those with some rows drafting less than the longest)
    assert outcome.draft_share.source == "fitted" and outcome.draft_share.value == pytest.approx(TRUE_SHARE)
    assert outcome.draft_share.fitted_steps == 3 * (1 + 3 + 7)
    result, _ = write_run(tmp_path / "run", outcome, lambda ranges: {"ranges": ranges})
    # b = 1: k = 2 gives 1.4 tokens a step at T_q = 0.8 T(1, 0) + 0.2 T(1, 2) = 10.7 ms (f plays no part)
    assert result.table.k_for(1) == 2
    assert result.predictions[0].goodput == pytest.approx(1.4 * 1000 / (0.8 * step_ms(1, 0) + 0.2 * step_ms(1, 2)))
    gains = predict_gains(outcome, result)
    assert gains.vs_best_fixed[1] >= 0.0 and gains.vs_best_fixed[0] < 0.05  # never below the best fixed k
    # the rates model would have promised E[tokens | 3] = 3 a step, 2.6x k=0 at b = 1
    naive = optimize_table(outcome.profile, outcome.rates, OptimizeOptions(k_max=3)).predictions[0]
    assert naive.goodput / naive.fixed_goodput[0] > 2.5
    assert result.predictions[0].goodput / result.predictions[0].fixed_goodput[0] < 1.4
    saved = json.loads((tmp_path / "run" / YIELDS_FILE).read_text())
    assert saved["draft_share"] == pytest.approx(TRUE_SHARE) and saved["draft_share_source"] == "fitted"
    assert [y["k"] for y in saved["yields"]] == [0, 1, 2, 3]
    assert load_yields(tmp_path / "run" / YIELDS_FILE) == (outcome.yields, outcome.draft_share.value)
    # the operator's f wins; an engine that records nothing gets the padded default
    assert run_plan(MatchOnlyEngine(), dataclasses.replace(PLAN, draft_share=0.8), ["p"]).draft_share.value == 0.8
    assert run_plan(Unrecorded(), PLAN, ["p"]).draft_share == DraftShare(1.0, 0, "default")


def test_fit_share_needs_rows_that_drafted_less_than_the_longest():
    prof = profile_from(step_ms)
    uniform = [MixedStep(4, 2, 2.0, step_ms(4, 2)), MixedStep(4, 0, 0.0, step_ms(4, 0))]
    assert fit_share(prof, uniform) == DraftShare(1.0, 0, "default")
    padded = [MixedStep(4, 3, 1.5, step_ms(4, 3)), MixedStep(8, 2, 0.5, step_ms(8, 2))]
    fitted = fit_share(prof, padded)
    assert (fitted.source, fitted.fitted_steps) == ("fitted", 2)
    assert fitted.value == pytest.approx(1.0) and fitted.level == pytest.approx(1.0)
    beyond = [MixedStep(4, 5, 1.0, 99.0)]  # a draft longer than the profile's k: no T to compare with
    assert fit_share(prof, beyond).source == "default"


def test_a_drafter_that_always_drafts_gets_no_per_k_runs(tmp_path):
    engine = MatchOnlyEngine()
    engine.measure_acceptance = lambda prompts, k, max_tokens: engine.asked.append(k) or counts([(k, 1)] * 20, 0)
    outcome = run_plan(engine, PLAN, ["p"])
    assert engine.asked == [3] and outcome.yields == ()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / YIELDS_FILE).write_text("{}")  # a previous run's
    write_run(tmp_path / "run", outcome, lambda ranges: {"ranges": ranges})
    assert not (tmp_path / "run" / YIELDS_FILE).exists()


def test_yield_runs_are_checkpointed_and_not_repeated_on_resume(tmp_path):
    settings = {"model": "m"}
    cp = Checkpoint.open(tmp_path / "cp", settings, resume=False)
    with pytest.raises(KeyboardInterrupt):
        run_contexts(MatchOnlyEngine(die_at_k=2), PLAN, ["p"], [100], checkpoint=cp)
    engine = MatchOnlyEngine()
    resumed = run_contexts(engine, PLAN, ["p"], [100], checkpoint=Checkpoint.open(tmp_path / "cp", settings, True))[0]
    assert engine.asked == [2]  # k = 3 and k = 1 came from the checkpoint, with their steps
    whole = run_plan(MatchOnlyEngine(), PLAN, ["p"])
    assert resumed.yields == whole.yields and resumed.draft_share == whole.draft_share


@pytest.mark.parametrize("drafts, undrafted, per_k", [(19, 1, False),  # q = 19 / 20 = 0.95: at the threshold
                                                       (94, 5, True),  # q = 94 / 99 = 0.9495: just below
                                                       (20, 0, False)])
def test_the_draft_rate_threshold_at_its_boundary(drafts, undrafted, per_k):
    """Per-k runs when q < plan.yields_below_draft_rate (0.95 by default); q = 0.95 itself needs none."""
    assert PLAN.yields_below_draft_rate == 0.95
    engine = MatchOnlyEngine()
    engine.measure_acceptance = lambda prompts, k, max_tokens: engine.asked.append(k) or counts(
        [(k, 1)] * drafts, undrafted)
    inputs = measure_inputs(engine, PLAN, ["p"], "w")
    assert engine.asked == ([3, 1, 2] if per_k else [3])  # k = 0 drafts nothing: no run
    assert bool(inputs.yields) == per_k
