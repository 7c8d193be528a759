"""Controller: config validation, exploration bound, hysteresis, convergence, safety."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
from tabletune.controller import Controller, ControllerConfig, StepObservation, prior_rates
from tabletune.errors import InputError
from tabletune.optimizer import evaluate_table, optimize_table
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import VLLM_DOCUMENTED_DIV4_RANGES, DraftTable


def make_profile() -> StepProfile:
    """T(b, k) = 10 + 0.5 b (1 + 0.6 k) ms: drafting gets costlier as the batch grows."""
    points = [StepPoint(b, k, (10 + 0.5 * b * (1 + 0.6 * k),)) for b in (1, 2, 4, 8, 16, 32, 64) for k in range(5)]
    return StepProfile(points=tuple(points), context_len=0)


PROFILE = make_profile()
TRUE = [0.9, 0.85, 0.8, 0.75]
OTHER = [0.3, 0.3, 0.3, 0.3]


def simulate(c: Controller, rates, batch_size: int, steps: int, rng: random.Random, t0: float = 0.0,
             step_s: float = 0.01) -> float:
    now = t0
    for _ in range(steps):
        k = c.k_for(batch_size)
        drafts = []
        for _ in range(batch_size):
            m = 0
            while m < k and rng.random() < rates[m]:
                m += 1
            drafts.append((k, m))
        now += step_s
        c.observe(StepObservation.from_drafts(batch_size, k, drafts, time_s=now, k_max=c.k_max))
        c.maybe_rebuild(now)
    return now


def worst_share(table: DraftTable, rates) -> float:
    """min over b of goodput(table) / goodput(optimal table), both under the true rates."""
    opt = optimize_table(PROFILE, rates)
    got = evaluate_table(PROFILE, rates, table, PROFILE.max_batch_size, opt.ks)
    return min(g.goodput / o.goodput for g, o in zip(got, opt.predictions))


# ---- config ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,field", [
    ({"prior_weight": -1}, "prior_weight"),
    ({"half_life_tokens": 10, "half_life_s": 1}, "half_life"),
    ({"half_life_s": 0}, "half_life_s"),
    ({"explore_fraction": 0.9}, "explore_fraction"),
    ({"min_gain": -0.1}, "min_gain"),
    ({"k_max": 0}, "k_max"),
    ({"ks": ()}, "ks"),
    ({"rebuild_every_steps": 0}, "rebuild_every_steps"),
])
def test_config_rejects(kwargs, field):
    with pytest.raises(InputError) as exc:
        ControllerConfig(**kwargs)
    assert exc.value.field == field


def test_config_defaults_and_json():
    assert ControllerConfig().half_life_tokens == 2000.0
    cfg = ControllerConfig.from_json({"half_life_s": 5, "ks": [0, 2], "prior_workload": "code"})
    assert cfg.half_life_tokens is None and cfg.half_life_s == 5 and cfg.ks == (0, 2)
    with pytest.raises(InputError, match="unknown option"):
        ControllerConfig.from_json({"halflife": 3})
    with pytest.raises(InputError, match="must be a number"):
        ControllerConfig.from_json({"min_gain": "big"})


def test_prior_rates_from_profile_and_padding():
    counts = AcceptanceCounts(k_max=2, workload="code", reached=[10, 8], accepted=[8, 4])
    profile = AcceptanceProfile([counts, AcceptanceCounts(k_max=1, workload="chat", reached=[1], accepted=[1])])
    assert prior_rates(profile, 4, workload="code") == [0.8, 0.5, 0.5, 0.5]
    with pytest.raises(InputError):
        prior_rates(profile, 4)  # two entries, none chosen
    assert prior_rates([1.0, 0.0], 2) == [1.0, 1e-3]


# ---- behaviour ---------------------------------------------------------------------------

def test_initial_table_is_the_prior_optimum_and_state_keys():
    c = Controller(PROFILE, TRUE)
    assert c.table == optimize_table(PROFILE, TRUE).table
    state = c.state()
    for key in ("table", "acceptance", "installs", "steps", "explore_steps", "ignored"):
        assert key in state
    assert state["acceptance"] == TRUE and state["installs"] == 0


def test_converges_from_mistuned_start_at_every_batch_size():
    start = DraftTable.from_ranges(VLLM_DOCUMENTED_DIV4_RANGES).clamped(4)
    assert worst_share(start, TRUE) < 0.9
    c = Controller(PROFILE, OTHER, ControllerConfig(), table=start)
    simulate(c, TRUE, 16, 1500, random.Random(1))
    assert c.installs >= 1
    assert worst_share(c.table, TRUE) >= 0.98
    assert max(abs(a - t) for a, t in zip(c.estimator.rates(), TRUE)) < 0.05


def test_workload_switch_reconverges():
    c = Controller(PROFILE, TRUE, ControllerConfig(half_life_tokens=2000))
    rng = random.Random(2)
    now = simulate(c, TRUE, 8, 500, rng)
    before = c.installs
    simulate(c, OTHER, 8, 1500, rng, t0=now)
    assert c.installs > before
    assert worst_share(c.table, OTHER) >= 0.98


def test_hysteresis_min_interval_and_gain():
    c = Controller(PROFILE, TRUE, ControllerConfig(min_install_interval_s=100, rebuild_interval_s=0, warmup_drafts=0,
                                                   rebuild_every_steps=1), table=DraftTable.fixed(0))
    obs = StepObservation.from_drafts(4, 4, [(4, 4)] * 4)
    c.observe(obs)
    assert c.maybe_rebuild(1.0) is not None
    c.set_table([[1, 64, 0]], now_s=2.0)
    c.observe(obs)
    assert c.maybe_rebuild(50.0) is None  # within the minimum interval
    assert c.maybe_rebuild(103.0) is not None
    # at the optimum with noise-free counts (expected values under TRUE) it never installs
    d = Controller(PROFILE, TRUE, ControllerConfig(rebuild_interval_s=0, warmup_drafts=0, explore_fraction=0))
    surv = [1.0, 0.9, 0.9 * 0.85, 0.9 * 0.85 * 0.8]  # P(reach j) for a draft of length 4
    exact = StepObservation(4, 4, 4, tuple(4 * s for s in surv), tuple(4 * s * a for s, a in zip(surv, TRUE)),
                            (4.0,) * 4)
    for i in range(200):
        d.observe(exact)
        assert d.maybe_rebuild(float(i)) is None
    assert d.installs == 0 and d.estimator.rates() == pytest.approx(TRUE)


def test_rebuilds_are_amortised_over_steps():
    c = Controller(PROFILE, OTHER, ControllerConfig(rebuild_interval_s=0, min_install_interval_s=0, warmup_drafts=0,
                                                    rebuild_every_steps=10, explore_fraction=0), table=DraftTable.fixed(0))
    evals = 0
    for i in range(100):
        c.observe(StepObservation.from_drafts(4, 4, [(4, i % 5)] * 4))
        before = c._last_eval_s
        c.maybe_rebuild(float(i))
        evals += c._last_eval_s != before
    assert evals <= 10


def test_bad_observations_are_ignored():
    c = Controller(PROFILE, TRUE)
    before = c.estimator.rates()
    assert not c.observe(StepObservation(4, 4, 4, (4.0, 4, 4, 4), (math.nan, 0, 0, 0), (4.0, 4, 4, 4)))
    assert not c.observe(StepObservation(4, 4, 4, (4.0, 4, 4, 4), (-4.0, 0, 0, 0), (4.0, 4, 4, 4)))
    assert c.estimator.rates() == before and c.steps == 0
    assert c.state()["ignored"] == {"nan": 1, "negative": 1}


def test_set_table_validates():
    c = Controller(PROFILE, TRUE)
    with pytest.raises(InputError):
        c.set_table([[2, 8, 1]])  # does not start at 1
    with pytest.raises(InputError):
        c.set_table([[1, 8, 9]])  # k above k_max
    assert c.set_table([[1, 8, 2], [9, 64, 0]]).as_lists() == [[1, 8, 2], [9, 64, 0]]
    assert c.installs == 1


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 0.5), st.integers(1, 400), st.integers(1, 64))
def test_exploration_is_bounded(fraction, steps, batch_size):
    c = Controller(PROFILE, OTHER, ControllerConfig(explore_fraction=fraction), table=DraftTable.fixed(0))
    ks = [c.k_for(batch_size) for _ in range(steps)]
    explored = sum(k == c.k_max for k in ks)
    # no evidence ever arrives here, so evidence-driven exploration runs once per observation window
    window = c.config.observe_every_steps
    assert c.evidence_explore_steps == (0 if fraction == 0 else -(-steps // window))
    assert explored == c.explore_steps <= fraction * steps + 1 + c.evidence_explore_steps
    assert set(ks) <= {0, c.k_max}


def test_evidence_driven_exploration_stops_once_position_k_plus_1_has_evidence():
    cfg = ControllerConfig(explore_fraction=0.01, observe_every_steps=4, explore_min_evidence=20)
    c = Controller(PROFILE, OTHER, cfg, table=DraftTable.fixed(0))
    assert [c.explore_next(64) for _ in range(8)] == [True, False, False, False, True, False, False, False]
    c.observe(StepObservation.from_drafts(64, 4, [(4, 2)] * 64, time_s=0.0))  # 64 drafts reached position 1
    assert not any(c.explore_next(64) for _ in range(40))  # only credit (0.01 a step) remains
    assert c.evidence_explore_steps == 2
    off = Controller(PROFILE, OTHER, ControllerConfig(explore_fraction=0.0), table=DraftTable.fixed(0))
    assert not any(off.explore_next(64) for _ in range(100))


def test_no_exploration_where_table_drafts_k_max():
    c = Controller(PROFILE, TRUE, ControllerConfig(explore_fraction=0.5), table=DraftTable.fixed(4))
    assert [c.k_for(2) for _ in range(10)] == [4] * 10
    assert c.explore_steps == 0


def test_memory_is_bounded():
    c = Controller(PROFILE, TRUE, ControllerConfig(min_install_interval_s=0, rebuild_interval_s=0))
    for i in range(100):
        c.set_table([[1, 64, i % 3]], now_s=float(i))
    assert len(c.history) == 16
    c.observe(StepObservation.from_drafts(10_000, 1, [(1, 1)]))  # batch above max_batch is clamped
    assert len(c.batch_hist) == PROFILE.max_batch_size + 1


def test_pooled_window_counts_every_step_and_matches_per_step_evidence():
    """observe(obs, batch_sizes) of n steps' drafts = n per-step observations, up to in-window decay."""
    rng = random.Random(3)
    steps = [[(4, rng.randint(0, 4)) for _ in range(b)] for b in (3, 5, 8, 2)]
    cfg = ControllerConfig(half_life_tokens=1e9)  # no decay: the two must agree exactly
    per_step, pooled = Controller(PROFILE, TRUE, cfg), Controller(PROFILE, TRUE, cfg)
    for drafts in steps:
        per_step.observe(StepObservation.from_drafts(len(drafts), 4, drafts, k_max=4))
    pooled.observe(StepObservation.from_drafts(2, 4, [d for s in steps for d in s], k_max=4), [3, 5, 8, 2])
    assert pooled.steps == per_step.steps == 4 and pooled.drafts == per_step.drafts == 18
    assert pooled.batch_hist == per_step.batch_hist and pooled.last_batch_size == 2
    assert pooled.estimator.rates() == pytest.approx(per_step.estimator.rates())
    assert pooled.estimator.evidence() == pytest.approx(per_step.estimator.evidence())


def test_observe_every_steps_is_validated():
    for bad in (0, 2.5):
        with pytest.raises(InputError, match="observe_every_steps"):
            ControllerConfig(observe_every_steps=bad)


def test_draft_rate_from_prior_and_live_observations():
    """q starts at the prior profile's draft rate and follows observed undrafted request-steps."""
    from tabletune.optimizer import OptimizeOptions

    counts = AcceptanceCounts(k_max=4, reached=[100, 90, 77, 61], accepted=[90, 77, 61, 46], drafted=[100] * 4,
                              num_drafts=100, undrafted=300)
    off = Controller(PROFILE, AcceptanceProfile([counts]))
    assert off.draft_rate.rate == pytest.approx(0.25) and off.current_options().draft_rate == 1.0  # opt-in
    c = Controller(PROFILE, AcceptanceProfile([counts]),
                   ControllerConfig(prior_weight=50, rebuild_interval_s=0, min_install_interval_s=0,
                                    rebuild_every_steps=1, explore_fraction=0, min_gain=0, model_draft_rate=True))
    assert c.state()["draft_rate"] == pytest.approx(0.25)
    assert Controller(PROFILE, TRUE, ControllerConfig(draft_rate_prior=0.4)).draft_rate.rate == pytest.approx(0.4)
    with pytest.raises(InputError, match="draft_rate_prior"):
        ControllerConfig(draft_rate_prior=1.5)
    with pytest.raises(InputError, match="model_draft_rate"):
        ControllerConfig.from_json({"model_draft_rate": 1})
    q_table = optimize_table(PROFILE, c.estimator.prior, OptimizeOptions(max_batch=64, k_max=4, draft_rate=0.25))
    assert c.table == q_table.table  # the start table is the q-aware optimum
    for i in range(40):  # every request-step drafts now: q -> 1
        c.observe(StepObservation.from_drafts(8, 4, [(4, 4)] * 8, k_max=4, undrafted=0))
        c.maybe_rebuild(float(i))
    assert c.draft_rate.rate > 0.85
    assert c.table == optimize_table(PROFILE, c.estimator.rates(),
                                     OptimizeOptions(max_batch=64, k_max=4, draft_rate=c.draft_rate.rate)).table
