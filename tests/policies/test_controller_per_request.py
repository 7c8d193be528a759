import numpy as np
import pytest
from per_request_helpers import linear_cost, make_state, run_sim

from tabletune.controller.per_request import draft_lengths, marginal_ms, verify_lengths
from tabletune.errors import InputError
from tabletune.policies import make_policy
from tabletune.policies.base import NGRAM, PolicyContext, draft_stop_of
from tabletune.policies.controller import PerRequestController


def test_marginal_cost_read_from_the_step_cost():
    # f = 0: T(b, ks) = T(b, k_bar) = 10 + 4 k_bar at b = 2, so one more token of one row costs 4 / 2 = 2 ms
    assert marginal_ms(linear_cost(per_k_ms=4.0, k_max=3), 2, 2, 3).tolist() == pytest.approx([2.0, 2.0, 2.0])
    # f = 1: the step pays the longest draft; with the other row at cap 1 only positions past 1 cost (4 ms each)
    assert marginal_ms(linear_cost(per_k_ms=4.0, k_max=3, draft_share=1.0), 2, 1, 3).tolist() == \
        pytest.approx([0.0, 4.0, 4.0])
    # an n-gram row (free: no model drafting) pays its verification only: f = 1, T = T0 + D, V = T0 -> 0 ms
    assert marginal_ms(linear_cost(per_k_ms=4.0, k_max=3, draft_share=1.0), 2, 1, 3, free=True).tolist() == \
        pytest.approx([0.0, 0.0, 0.0])
    # f = 0.5: V~(2, k_bar) = 10 + 2 k_bar: one more verified token of one row costs 2 / 2 = 1 ms
    assert marginal_ms(linear_cost(per_k_ms=4.0, k_max=3, draft_share=0.5), 2, 1, 3, free=True).tolist() == \
        pytest.approx([1.0, 1.0, 1.0])
    # a split step's 5 ms extra is the step's, not the token's that makes the n-gram row outrun the cap: same prices
    import dataclasses

    split = dataclasses.replace(linear_cost(per_k_ms=4.0, k_max=3, draft_share=0.5), split_extra=((1, 5.0),))
    assert marginal_ms(split, 2, 1, 3, free=True).tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_rule_stops_where_the_hand_worked_marginal_cost_says():
    # price lambda_j = R dT_j = 0.5 at every j; next-token rate a = .9
    # row 0: S = .9 .8 .6 .4  -> verify while S > .5: 3; draft j+1 while S_j .9 > .5: 1, .81, .72, .54 -> 4
    # row 1: S = .7 .45 .3 .2 -> verify 1; draft: 1 (.9), .63, .405 < .5 stops after 2
    surv = np.array([[0.9, 0.8, 0.6, 0.4], [0.7, 0.45, 0.3, 0.2]])
    price = np.full(4, 0.5)
    assert verify_lengths(surv, price, 4).tolist() == [3, 1]
    assert draft_lengths(surv, np.full(4, 0.9), price, 4).tolist() == [4, 2]
    assert draft_lengths(surv, np.full(4, 0.9), price, 2).tolist() == [2, 2]  # the cap binds
    # a = .6: row 0 drafts .6, .54, .48 -> 2; row 1 .6, .42 -> 1
    assert draft_lengths(surv, np.full(4, 0.6), price, 4).tolist() == [2, 1]


def _policy(rate: float) -> PerRequestController:
    cost = linear_cost(base_ms=10.0, per_k_ms=2.0, k_max=4)  # f = 0, b = 2: every token costs 1 ms
    ctx = PolicyContext(cost=cost, prior_rates=(0.9,) * 4, ks=tuple(cost.ks))
    policy = make_policy("controller:per-request,stop=1,explore_fraction=0", ctx)
    policy.ema_tokens, policy.ema_ms = rate, 1.0  # R = rate tokens per ms
    return policy


def test_policy_drafts_and_verifies_while_the_token_pays():
    # before its first fit the calibration is the estimator's a_j = .9: S_j = .9^j; price R * 1 ms = .7
    # draft j + 1 while .9^j * .9 > .7: .9, .81, .729 yes, .656 no -> 3 tokens; verify while .9^j > .7: 3
    policy = _policy(0.7)
    state = make_state(np.full((2, 4), 0.5))
    assert policy.decide(state).ks.tolist() == [3, 3]
    stop = draft_stop_of(policy)
    active = np.ones(2, bool)
    got = [stop.keep_drafting(state, state.features, j, active).tolist() for j in (1, 2, 3)]
    assert got == [[True, True], [True, True], [False, False]]
    assert stop.keep_drafting(state, state.features, 1, np.array([True, False])).tolist() == [True, False]


def test_rows_with_weaker_signals_stop_earlier():
    # calibrated p = top1 (slope 1, intercepts 0); a = .9; price .7
    # row 0 (top1 .95): S = .95 .9025 .857 .815 -> drafts 4, verifies 4
    # row 1 (top1 .8):  S = .8 .64 .512 .41 -> drafts j + 1 while S_j .9 > .7: .9, .72, .576 -> 2; verifies 1
    policy = _policy(0.7)
    policy.calibration.coef = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    policy.calibration.fits = 1
    state = make_state(np.array([[0.95] * 4, [0.8] * 4]))
    assert policy.decide(state).ks.tolist() == [4, 1]
    active = np.ones(2, bool)
    got = [draft_stop_of(policy).keep_drafting(state, state.features, j, active).tolist() for j in (1, 2, 3)]
    assert got == [[True, True], [True, False], [True, False]]


def test_spelling_and_bad_options():
    cost = linear_cost(k_max=4)
    ctx = PolicyContext(cost=cost, prior_rates=(0.9,) * 4, ks=tuple(cost.ks))
    assert isinstance(make_policy("controller:per-request", ctx), PerRequestController)
    assert not isinstance(make_policy("controller", ctx), PerRequestController)
    with pytest.raises(InputError):
        make_policy("controller:per-request,memory=1", ctx)


def test_rows_choose_their_drafter_and_length_in_the_simulator():
    """The decision picks each row's drafter; the lengths it verifies differ within a step (its drafts
    stop row by row through keep_drafting, so the verified lengths are the outcome's, not the caps)."""
    seen, verified = [], []
    result, policy = run_sim("controller:per-request", workload="code-edit", load=8, duration_s=2.0,
                             recorder=lambda d, s: seen.append((d.ks.copy(), d.drafter.copy())),
                             observer=lambda o: verified.append(o.ks.copy()))
    assert result.throughput_tok_s > 0
    drafter = np.concatenate([d for _, d in seen])
    assert (drafter == 1).any() and (drafter == 0).any()  # copyable spans go to the n-gram chain
    assert any(len(set(k.tolist())) > 1 for k in verified)  # lengths differ within a step


def test_the_estimator_learns_the_model_chain_from_model_rows_only():
    # row 1 took the n-gram chain and had 3 accepted: the model drafter's a_j must not count it; the same step
    # with row 1 undrafted gives the same estimate
    from per_request_helpers import make_outcome

    with_ngram, without = _policy(0.7), _policy(0.7)
    state = make_state(np.full((2, 4), 0.5))
    with_ngram.decide(state), without.decide(state)
    with_ngram.observe(make_outcome(state, [2, 3], [0, 3], drafter=[0, 1]))
    without.observe(make_outcome(state, [2, 0], [0, 0]))
    rates = with_ngram.controller.estimator.rates()
    assert rates == pytest.approx(without.controller.estimator.rates())
    assert rates[0] < 0.9  # the model row's rejection at position 1 moved it down from the prior


@pytest.mark.parametrize("workload,draft_rows", [("code-edit", "active"), ("chat", "active"), ("chat", "batch")])
def test_the_plans_made_ahead_are_the_plans_choose_plan_makes_row_by_row(workload, draft_rows):
    """``observe`` makes the next step's blind plans by n-gram class (``plans_ahead``); at every decide (code-edit:
    most steps have rows with n-gram proposals; chat: most have none) the plan read from them equals
    ``choose_plan`` on the rows' own survivals, computed there and then from the same state, and so does its stop
    rule. An exploring step changes only its model rows: where drafting is charged by the rows still drafting the
    first drafts k_max; where it costs the batch, all of them draft to the table's k + 1 on a step for that
    position's evidence, to k_max on credit."""
    import dataclasses

    from per_request_helpers import starter_cost

    from tabletune.controller.per_request import choose_plan
    from tabletune.policies.base import MODEL, nearest_k
    from tabletune.sim import SimConfig, Simulator, preset
    from tabletune.sim.workload import Schedule

    cost = dataclasses.replace(starter_cost(), draft_rows=draft_rows)
    sim = Simulator(cost, Schedule.constant(preset(workload)), SimConfig(duration_s=2.0, load=6, seed=0))
    policy = make_policy("controller:per-request", sim.context())
    decide, checked = policy.decide, []

    def deciding(state):
        b, k_max, ahead = state.batch_size, policy.ctx.k_max, policy._ahead
        next_rates = np.asarray(policy.controller.estimator.rates()[:k_max])
        surv_m = np.broadcast_to(np.cumprod(next_rates)[None, :], (b, k_max))
        table_k = nearest_k(policy.controller.table.k_for(b), policy.ctx.ks)
        rate = policy.rate(b, surv_m, table_k)
        surv_n = policy.ngram_survival(state.ngram_match_len, state.ngram_num_proposed)
        want = choose_plan(policy.ctx.cost, surv_m, surv_n, next_rates, policy.prices_ms(b), rate, table_k, None,
                           None if surv_n is None else policy.ngram_prices_ms(b))
        evidence = policy.controller.evidence_explore_steps
        decision = decide(state)
        got, row = policy.plan, policy.explore_row
        rest = np.arange(b) != row
        if row >= 0 and draft_rows == "batch":
            shallow = policy.controller.evidence_explore_steps > evidence
            depth = min(policy.controller.table.k_for(b) + 1, k_max) if shallow else k_max
            model = want.drafter == MODEL
            assert (got.ks[model] == np.maximum(want.ks[model], depth)).all() and got.cap == max(want.cap, depth)
            rest = ~model if model.any() else rest
            explored.append(depth)
        elif row >= 0:  # the first model row drafts k_max, the others keep the plan
            assert got.ks[row] == k_max and got.drafter[row] == MODEL and got.cap == k_max
            explored.append(k_max)
        else:
            assert got.cap == want.cap and policy.model_rule() == policy.stop_rule(b, want.cap, rate, next_rates)
        assert (got.ks[rest] == want.ks[rest]).all() and (got.drafter[rest] == want.drafter[rest]).all()
        assert (got.expected_tokens, got.step_ms) == pytest.approx((want.expected_tokens, want.step_ms), rel=1e-9)
        checked.append((ahead is not None and ahead.plans.batch_size == b, surv_n is not None))
        return decision

    explored = []
    policy.decide = deciding
    sim.run(policy)
    proposed = workload == "code-edit"
    assert sum(made and p == proposed for made, p in checked) > 10, checked  # plans made ahead, of that kind
    assert explored  # blind plans explore too (the estimator learns nothing past the plans otherwise)
    if draft_rows == "batch":  # evidence steps (the estimator is young in 2 s) explore shallow
        assert min(explored) < policy.ctx.k_max, explored


def test_class_plans_equal_choose_plan_on_random_rows():
    """Random survivals and classes, both drafting rules, caps windowed or not: the class-count plan equals the
    row-by-row one."""
    from per_request_helpers import starter_cost

    from tabletune.controller.per_request import choose_plan, class_plans, split_caps
    from tabletune.cost import StepCost

    rng = np.random.default_rng(0)
    base = starter_cost()
    k_max = base.k_max
    splits = 0
    for trial in range(40):
        # every third trial: split steps cost up to 3 ms more than the rule (``StepCost.split_extra``)
        extra = ((1, 0.0), (40, float(rng.uniform(0, 3)))) if trial % 3 == 1 else ()
        cost = StepCost(base.profile, draft_share=0.5, draft_rows=("active", "batch")[trial % 2], split_extra=extra)
        b = int(rng.integers(1, 40))
        next_rates = rng.uniform(0.3, 0.95, k_max)
        surv_model = np.cumprod(next_rates)
        # with the split extra: long n-gram matches, so that some plans split where the extra allows
        lo = 0.9 if extra else 0.2
        classes_surv = np.cumprod(rng.uniform(lo, 1.0, (6, k_max)), axis=1) * (rng.random((6, 1)) < 0.8)
        classes_surv[0] = 0.0
        classes = rng.integers(0, 6, b) * (rng.random(b) < 0.7)
        prices = np.array([marginal_ms(cost, b, c, k_max) for c in range(1, k_max + 1)])
        ng_prices = np.array([marginal_ms(cost, b, c, k_max, free=True) for c in range(1, k_max + 1)])
        rate = float(rng.uniform(0.5, 3.0) if extra else rng.uniform(0.05, 0.5))  # with the extra: pricier drafting
        table_k = int(rng.integers(0, k_max + 1))
        window = None if trial % 3 else 2
        plans = class_plans(cost, b, surv_model, classes_surv, next_rates, prices, ng_prices, rate, table_k, window)
        got = plans.choose(classes if classes.any() else None)
        want = choose_plan(cost, np.broadcast_to(surv_model, (b, k_max)), classes_surv[classes], next_rates, prices,
                           rate, table_k, window, ng_prices)
        assert (got.ks == want.ks).all() and (got.drafter == want.drafter).all() and got.cap == want.cap, trial
        assert got.step_ms == pytest.approx(want.step_ms, rel=1e-9), trial
        ngram = want.drafter == NGRAM  # the plan's time is the step cost's, split extra included
        assert want.step_ms == pytest.approx(cost.mixed_ms(want.ks, np.where(ngram, 0, want.ks), ngram)), trial
        splits += bool(extra) and bool(split_caps(want.ks[None], want.drafter[None])[0])
    assert splits >= 2  # plans that split and pay the extra were among them


def test_observing_a_step_after_deciding_the_next_calibrates_on_that_steps_signals():
    """An engine that overlaps observe decides step t + 1 (another batch, other n-gram lookups) before it observes
    step t: the n-gram calibration learns from step t's confidences, as when it observes first."""
    from per_request_helpers import make_ctx, make_outcome

    from tabletune.policies.base import BatchState

    def state(step, matched):
        b = len(matched)
        return BatchState(step=step, time_s=0.0, request_ids=np.arange(b), num_generated=np.zeros(b, np.int64),
                          ngram_match_len=np.where(matched, [4, 2, 1, 3, 2][:b], 0),
                          ngram_num_proposed=np.where(matched, 7, 0))

    s0, s1 = state(0, np.array([True, False, True])), state(1, np.array([False, True, True, True, False]))
    cals = []
    for lagged in (False, True):
        policy = PerRequestController(make_ctx(ngram_rates=(0.0, 0.9, 0.9, 0.9, 0.9)))
        d0 = policy.decide(s0)
        assert (d0.drafter == 1).sum() == 2  # both matched rows take the n-gram chain
        if lagged:
            policy.decide(s1)
        policy.observe(make_outcome(s0, d0.ks, np.minimum(d0.ks, 2), drafter=d0.drafter))
        cals.append((policy.ngram_cal.tested.copy(), policy.ngram_cal.accepted.copy()))
        assert 0 not in policy._signals and (1 in policy._signals) == lagged  # step 1's wait for its outcome
    assert cals[0][0].sum() > 0
    assert (cals[0][0] == cals[1][0]).all() and (cals[0][1] == cals[1][1]).all()


def test_an_ngram_row_verifies_past_the_model_rows_cap():
    """Under cap 2 a model row stops at 2; an n-gram row whose proposal survives (S_j = .95^j > the verification
    price .1) verifies all 5 proposed tokens: the cap bounds the model chain only."""
    from tabletune.controller.per_request import plans_by_cap

    surv_model = np.cumprod(np.full((2, 6), 0.9), axis=1)
    surv_ngram = np.vstack([np.zeros(6), np.cumprod(np.full(6, 0.95)) * (np.arange(1, 7) <= 5)])
    prices = np.full((6, 6), 0.1)
    ks, drafter, _ = plans_by_cap(surv_model, surv_ngram, np.full(6, 0.9), prices, np.array([2]), prices)
    assert ks.tolist() == [[2, 5]] and drafter.tolist() == [[0, 1]]


@pytest.mark.parametrize("draft_rows", ["active", "batch"])
def test_a_blind_plan_explores_every_model_row_where_drafting_costs_the_batch(draft_rows):
    """Hand-worked: rows (model 2, n-gram 4, model 1, model 0) explored to depth 5. Where the drafting costs what
    the batch costs, every model row drafts 5 (the drafting is paid once); where it is charged by the rows still
    drafting, the first model row alone. The n-gram row keeps its proposal either way."""
    import dataclasses

    from per_request_helpers import make_ctx

    from tabletune.controller.per_request import Plan
    from tabletune.policies.base import MODEL, NGRAM

    ctx = make_ctx()
    ctx = dataclasses.replace(ctx, cost=dataclasses.replace(ctx.cost, draft_rows=draft_rows))
    policy = PerRequestController(ctx)
    plan = Plan(np.array([2, 4, 1, 0]), np.array([MODEL, NGRAM, MODEL, MODEL]), 2, 5.0, 9.0)
    got = policy.explored(plan, 5)
    want = [5, 4, 5, 5] if draft_rows == "batch" else [5, 4, 1, 0]
    assert got.ks.tolist() == want and got.drafter.tolist() == plan.drafter.tolist()
    assert got.cap == 5 and policy.explore_row == 0
    assert plan.ks.tolist() == [2, 4, 1, 0]  # the plan made ahead is not changed in place
    all_ngram = Plan(np.array([3, 4]), np.array([NGRAM, NGRAM]), 0, 2.0, 9.0)
    got = policy.explored(all_ngram, 5)  # no model row: row 0 goes on the model chain
    assert got.ks.tolist() == [5, 4] and got.drafter.tolist() == [MODEL, NGRAM]


def test_the_gate_decides_batch_steps_ahead_and_restarts_on_a_shift():
    """``gate=1``: in its batch mode the decision is the batch controller's k for the batch (no per-row plan) and
    ``decides_ahead`` says an engine may make it before the last read-back; in its plan mode the rows get their
    plan on the lookup. A workload shift the estimator detects restarts the gate's trial. Without the n-gram chain
    there is nothing to weigh: no gate. ``gate=2`` is refused."""
    from tabletune.controller.mode_gate import BATCH, ROWS
    from tabletune.policies.base import MODEL, BatchState, StepOutcome

    ctx = PolicyContext(cost=linear_cost(k_max=4), prior_rates=(0.9,) * 4, ks=(0, 1, 2, 3, 4),
                        ngram_rates=(0.0, 0.5, 0.6, 0.7, 0.8))
    policy = make_policy("controller:per-request,gate=1", ctx)
    state = BatchState(0, 0.0, np.arange(3), np.zeros(3, np.int64), ngram_match_len=np.array([0, 3, 0]),
                       ngram_num_proposed=np.array([0, 4, 0]))
    assert policy.gate.mode == ROWS and not policy.decides_ahead
    rows = policy.decide(state)
    assert rows.ks is not None and rows.drafter is not None  # a per-row plan, each row with its chain
    policy.gate.mode = BATCH
    assert policy.decides_ahead
    batch = policy.decide(BatchState(1, 0.0, np.arange(3), np.zeros(3, np.int64)))
    assert batch.ks is None and batch.drafter is None and batch.k == policy.batch.asked_k
    assert policy._mode_of == {0: ROWS, 1: BATCH}
    policy.gate.trial_left = 0
    policy.controller.estimator.shifts += 1
    policy.observe(StepOutcome(state, np.array([1, 2, 1]), np.array([MODEL, NGRAM, MODEL]), np.array([1, 2, 0]), 5.0))
    assert policy.gate.mode == ROWS and policy.gate.trial_left == policy.gate.cfg.trial_pairs
    assert make_policy("controller:per-request,gate=1,ngram=0", ctx).gate is None
    assert not make_policy("controller:per-request", ctx).decides_ahead
    for bad in ("gate=2", "gate=1,stop=1"):  # a stop rule reads back between positions: nothing goes ahead
        with pytest.raises(InputError):
            make_policy(f"controller:per-request,{bad}", ctx)


def test_the_gates_batch_mode_is_the_batch_controller_fed_by_its_own_steps_only():
    """The gate's batch mode decides as ``controller`` does (its explore share too), on an estimator only the batch
    steps feed: a plan step's model rows, the rows the lookup left, teach the plans' estimator and not the batch's
    (on chat they accept less than the batch, and the batch k fell to 1 where 2 served 3% more)."""
    from tabletune.controller.mode_gate import BATCH, ROWS
    from tabletune.policies.base import MODEL, NGRAM, BatchState, StepOutcome

    ctx = PolicyContext(cost=linear_cost(k_max=4), prior_rates=(0.6,) * 4, ks=(0, 1, 2, 3, 4),
                        ngram_rates=(0.0, 0.5, 0.6, 0.7, 0.8))
    policy = make_policy("controller:per-request,gate=1", ctx)
    plain = make_policy("controller", ctx)
    assert policy.batch.controller.config.explore_fraction == plain.controller.config.explore_fraction
    assert policy.controller.config.explore_fraction < plain.controller.config.explore_fraction
    before = policy.batch.controller.estimator.rates()
    for step in range(40):  # plan steps: the model rows reject everything, the n-gram row accepts all
        state = BatchState(step, step * 0.01, np.arange(3), np.zeros(3, np.int64),
                           ngram_match_len=np.array([0, 5, 0]), ngram_num_proposed=np.array([0, 4, 0]))
        policy.gate.mode = ROWS
        policy.decide(state)
        policy.observe(StepOutcome(state, np.array([4, 4, 4]), np.array([MODEL, NGRAM, MODEL]),
                                   np.array([0, 4, 0]), 5.0))
    assert policy.batch.controller.estimator.rates() == before
    assert policy.controller.estimator.rates()[0] < before[0]
    state = BatchState(40, 0.4, np.arange(3), np.zeros(3, np.int64))
    policy.gate.mode = BATCH
    k = policy.decide(state).k
    policy.observe(StepOutcome(state, np.full(3, k), np.full(3, MODEL), np.zeros(3, np.int64), 5.0))
    assert policy.batch.controller.estimator.rates()[0] < before[0]


def test_a_plan_step_after_a_gated_batch_step_counts_no_batch_k():
    """The k a gated batch step asked (every row drafting it) counts for that step only: a plan step observed after
    it reports each row's own k (asked 0), so a row planned short is not counted as rejected past its k."""
    from tabletune.controller.mode_gate import BATCH, ROWS
    from tabletune.policies.base import MODEL, BatchState, StepOutcome
    from tabletune.policies.controller import observation

    ctx = PolicyContext(cost=linear_cost(k_max=4), prior_rates=(0.9,) * 4, ks=(0, 1, 2, 3, 4),
                        ngram_rates=(0.0, 0.5, 0.6, 0.7, 0.8))
    policy = make_policy("controller:per-request,gate=1", ctx)
    seen = []
    observe = policy.controller.observe
    policy.controller.observe = lambda obs: (seen.append(obs), observe(obs))
    policy.gate.mode = BATCH
    batch_state = BatchState(0, 0.0, np.arange(2), np.zeros(2, np.int64))
    k = policy.decide(batch_state).k
    assert k >= 2
    policy.gate.mode = ROWS
    plan_state = BatchState(1, 0.01, np.arange(2), np.zeros(2, np.int64), ngram_match_len=np.zeros(2, np.int64),
                            ngram_num_proposed=np.zeros(2, np.int64))
    policy.decide(plan_state)
    both = np.array([MODEL, MODEL])
    policy.observe(StepOutcome(batch_state, np.array([k, k]), both, np.array([0, k]), 5.0))
    policy.observe(StepOutcome(plan_state, np.array([1, 1]), both, np.array([1, 1]), 5.0))
    for drafter in (both, np.array([MODEL, NGRAM])):  # all model rows, and model rows beside an n-gram row
        state = BatchState(2, 0.02, np.arange(2), np.zeros(2, np.int64))
        policy.observe(StepOutcome(state, np.array([1, 1]), drafter, np.array([1, 1]), 5.0))
    assert seen[0].reached == observation(StepOutcome(batch_state, np.array([k, k]), both, np.array([0, k]), 5.0),
                                          4, 0.0, k).reached
    assert [obs.reached for obs in seen[1:]] == [(2, 0, 0, 0), (2, 0, 0, 0), (1, 0, 0, 0)]
    assert policy._asked == {}


def test_the_gate_is_given_each_steps_prefills():
    """``observe`` hands the gate the step's mode, tokens, end, speed without speculation and its prefills (s)."""
    from tabletune.controller.mode_gate import ROWS
    from tabletune.policies.base import MODEL, BatchState, StepOutcome

    ctx = PolicyContext(cost=linear_cost(k_max=4), prior_rates=(0.9,) * 4, ks=(0, 1, 2, 3, 4),
                        ngram_rates=(0.0, 0.5, 0.6, 0.7, 0.8))
    policy = make_policy("controller:per-request,gate=1", ctx)
    seen = []
    policy.gate.observe = lambda *args: seen.append(args)
    state = BatchState(0, 0.0, np.arange(2), np.zeros(2, np.int64), ngram_match_len=np.zeros(2, np.int64),
                       ngram_num_proposed=np.zeros(2, np.int64))
    policy.decide(state)
    policy.observe(StepOutcome(state, np.array([1, 1]), np.array([MODEL, MODEL]), np.array([1, 0]), 5.0,
                               end_s=0.012, prefill_ms=3.0))
    assert seen == [(ROWS, 3, 0.012, pytest.approx(2 / ctx.cost.step_ms(2, 0)), pytest.approx(0.003))]
