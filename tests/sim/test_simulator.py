import json

import numpy as np
import pytest
from click.testing import CliRunner
from margins import mean_margin

from tabletune.cli import main
from tabletune.cost import StepCost
from tabletune.goodput import expected_tokens
from tabletune.policies import make_policy
from tabletune.profile import StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, Workload

RATES = [0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5]
RATES_TEXT = ",".join(map(str, RATES))


def tokens_per_request_step(k: int) -> tuple[float, float]:
    """Mean and sd of the tokens one request-step emits at fixed k: 1 + A, P(A >= j) = a_1 ... a_j, j <= k."""
    survival = np.cumprod([1.0, *RATES[:k]])  # P(A >= j), j = 0..k
    p = survival - np.append(survival[1:], 0.0)  # P(A = j)
    tokens = np.arange(1, k + 2)
    mean = float(p @ tokens)
    return mean, float(np.sqrt(p @ tokens**2 - mean**2))


def analytic_margin(k: int, load: int, steps: int) -> float:
    """Relative margin of a closed loop's throughput against N * E[tokens | k] / T(N, k): its load * steps
    request-steps are independent draws (tests/margins.py), and the last step may run past the duration."""
    mean, sd = tokens_per_request_step(k)
    return mean_margin(sd, load * steps) / mean + 1 / steps


def simulate(starter, *args):
    out = CliRunner().invoke(main, ["simulate", "--step-times", str(starter), "--acceptance", RATES_TEXT, *args,
                                    "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


@pytest.mark.parametrize("load,k", [(1, 3), (16, 5), (64, 1), (128, 3), (128, 0), (32, 7)])
def test_closed_loop_long_outputs_fixed_k_is_analytic(starter_8b, load, k):
    """No request ends: throughput = N * E[tokens|k] / T(N, k) within the sampling margin."""
    res = simulate(starter_8b, "--policy", f"fixed:{k}", "--load", str(load), "--duration", "60",
                   "--output-len", "1000000", "--seed", "3")
    analytic = load * expected_tokens(RATES, k) / StepProfile.load(starter_8b).step_ms(load, k) * 1000
    assert res["throughput_tok_s"] == pytest.approx(analytic, rel=analytic_margin(k, load, res["steps"]))
    assert res["mean_k"] == k and res["finished_requests"] == 0 and res["steps"] > 100


def test_host_time_is_charged_after_every_step(starter_8b):
    """No request ends, fixed k = 3 at load 8: throughput = N * E[tokens|3] / (T(8, 3) + 1.5 ms of host time)."""
    res = simulate(starter_8b, "--policy", "fixed:3", "--load", "8", "--duration", "30", "--output-len", "1000000",
                   "--seed", "3", "--host-ms-per-step", "1.5")
    step_ms = StepProfile.load(starter_8b).step_ms(8, 3)
    analytic = 8 * expected_tokens(RATES, 3) / (step_ms + 1.5) * 1000
    assert step_ms > 4 and res["throughput_tok_s"] == pytest.approx(analytic, rel=analytic_margin(3, 8, res["steps"]))


def test_deterministic_per_seed_and_seeds_differ(starter_8b):
    a = simulate(starter_8b, "--policy", "fixed:3", "--load", "8", "--duration", "10", "--heterogeneity", "0.6")
    b = simulate(starter_8b, "--policy", "fixed:3", "--load", "8", "--duration", "10", "--heterogeneity", "0.6")
    c = simulate(starter_8b, "--policy", "fixed:3", "--load", "8", "--duration", "10", "--heterogeneity", "0.6",
                 "--seed", "1")
    assert a == b and a["throughput_tok_s"] != c["throughput_tok_s"]


def test_bad_input_exits_2(starter_8b):
    for args in (["--policy", "nope"], ["--policy", "fixed:x"], ["--policy", "fixed:3", "--load", "0"],
                 ["--policy", "fixed:3", "--acceptance", "1.5"]):
        out = CliRunner().invoke(main, ["simulate", "--step-times", str(starter_8b), "--acceptance", RATES_TEXT,
                                        *args])
        assert out.exit_code == 2, (args, out.output)
        assert "error" in out.output


def sim_for(starter, workload, **config):
    return Simulator(StepCost(StepProfile.load(starter)), Schedule.constant(workload), SimConfig(**config))


def test_output_lengths_are_respected_and_requests_replaced(starter_8b):
    sim = sim_for(starter_8b, Workload("w", tuple(RATES), output_len=10), duration_s=5, load=4)
    r = sim.run(make_policy("fixed:5", sim.context()))
    assert np.all(r.requests.num_tokens == 10)
    assert np.all(r.steps.batch_size == 4)  # closed loop: always 4 open
    assert r.requests.finish_s.size > 50 and r.tpot_ms > 0


def test_open_loop_respects_max_num_seqs_and_rate(starter_8b):
    sim = sim_for(starter_8b, Workload("w", tuple(RATES), output_len_mean=50), duration_s=30, arrival_rate=400.0,
                  max_num_seqs=16)
    r = sim.run(make_policy("fixed:1", sim.context()))
    assert r.steps.batch_size.max() == 16
    light = sim_for(starter_8b, Workload("w", tuple(RATES), output_len_mean=50), duration_s=60, arrival_rate=2.0)
    r = light.run(make_policy("fixed:1", light.context()))
    assert r.requests.finish_s.size == pytest.approx(120, rel=0.25)  # ~ rate * duration
    assert r.latency_s(50) < r.latency_s(99)


def test_workload_switch_changes_acceptance(starter_8b):
    hi, lo = Workload("hi", (0.9,) * 7, output_len=20), Workload("lo", (0.3,) * 7, output_len=20)
    sim = Simulator(StepCost(StepProfile.load(starter_8b)), Schedule.switch(hi, lo, 10.0),
                    SimConfig(duration_s=20, load=16))
    r = sim.run(make_policy("fixed:3", sim.context()))
    before = r.steps.start_s < 9
    after = r.steps.start_s > 12
    acc_before = r.steps.accepted[before].sum() / r.steps.drafted[before].sum()
    acc_after = r.steps.accepted[after].sum() / r.steps.drafted[after].sum()
    assert acc_before > 0.75 and acc_after < 0.35


def test_ngram_drafter_only_verifies_matched_requests(starter_8b):
    from tabletune.policies.base import NGRAM
    from tabletune.sim import preset

    sim = Simulator(StepCost(StepProfile.load(starter_8b), 0.0), Schedule.constant(preset("code-edit")),
                    SimConfig(duration_s=10, load=32), default_drafter=NGRAM)
    r = sim.run(make_policy("fixed:5", sim.context()))
    assert 0.5 < r.mean_k < 5
    assert r.acceptance > 0.4
    # per request: with features on, each step shows what the n-gram drafter proposed (0: no match)
    rec = Recorder(make_policy("fixed:5", sim.context()))
    r = sim.run(rec)
    proposed = np.concatenate([o.state.features.ngram_num_proposed for o in rec.outcomes])
    ks = np.concatenate([o.ks for o in rec.outcomes])
    accepted = np.concatenate([o.accepted for o in rec.outcomes])
    unmatched = proposed == 0
    assert 0.05 < unmatched.mean() < 0.95  # both kinds occur
    assert np.all(ks[unmatched] == 0) and np.all(accepted[unmatched] == 0)  # unmatched requests draft nothing
    assert np.all(ks[~unmatched] == 5)  # matched ones draft the policy's k (they propose k_max = 7)
    assert r.steps.drafted.sum() == ks.sum()  # and the step is costed by what was drafted


class Recorder:
    """Wraps a policy, asks for the draft features (the n-gram proposals) and keeps every outcome."""

    name = "recorder"
    uses_features = True

    def __init__(self, inner):
        self.inner, self.outcomes = inner, []

    def decide(self, state):
        return self.inner.decide(state)

    def observe(self, outcome):
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


def test_a_step_decided_on_the_lookup_is_charged_its_own_host_time():
    """``host_ms_lookup_step``: a policy that plans on the lookup pays it on the steps it does not decide ahead (an
    engine decides those after the last read-back), ``host_ms_per_step`` on the others; each step's charge is in
    its step_ms and in ``StepLog.host_ms``. A policy that does not plan on the lookup pays host_ms_per_step."""
    from tabletune.policies.base import Decision

    class Alternating:  # plans on the lookup on odd steps, decides ahead on even ones
        name, uses_features, uses_lookup = "alternating", False, True

        def __init__(self):
            self.steps = 0

        @property
        def decides_ahead(self):
            return self.steps % 2 == 0

        def decide(self, state):
            return Decision.batch(1)

        def observe(self, outcome):
            self.steps += 1

    from tabletune.profile import StepPoint

    profile = StepProfile(points=tuple(StepPoint(b, k, (10.0 + 2 * k,)) for b in (1, 2) for k in (0, 1)),
                          context_len=1024)
    cfg = SimConfig(duration_s=1.0, load=2, host_ms_per_step=0.25, host_ms_lookup_step=2.0)
    for lookup_steps in ("odd", "none"):
        sim = Simulator(StepCost(profile), Schedule.constant(Workload("w", rates=(0.5,))), cfg)
        policy = Alternating() if lookup_steps == "odd" else make_policy("fixed:1", sim.context())
        steps = sim.run(policy).steps
        odd = np.arange(len(steps.host_ms)) % 2 == 1
        want = np.where(odd, 2.0, 0.25) if lookup_steps == "odd" else np.full(len(odd), 0.25)
        assert len(steps.host_ms) > 10 and np.allclose(steps.host_ms, want)
    with pytest.raises(ValueError, match="host_ms_lookup_step"):
        SimConfig(host_ms_lookup_step=-1.0)


def test_a_steps_outcome_carries_the_prefills_charged_before_it():
    """Closed loop of 2, outputs of 4 tokens at k = 0, prompts at 0.5 ms a token: the step after one that finished
    requests carries their replacements' prefill (whole tokens' worth) in its outcome (``StepOutcome.prefill_ms``,
    what the gate leaves out of a window's span), the others none, and its span holds it; the initial requests (a
    warm start) charge none."""
    from tabletune.profile import StepPoint

    profile = StepProfile(points=tuple(StepPoint(b, k, (10.0,)) for b in (1, 2) for k in (0, 1)), context_len=1024)
    work = Workload("w", rates=(0.5,), prompt_len_mean=8.0, output_len=4)
    sim = Simulator(StepCost(profile), Schedule.constant(work),
                    SimConfig(duration_s=0.3, load=2, prefill_ms_per_token=0.5))
    seen = []

    class Rec:
        name, uses_features = "rec", False

        def decide(self, state):
            from tabletune.policies.base import Decision
            return Decision.batch(0)

        def observe(self, outcome):
            seen.append(outcome)

    sim.run(Rec())
    prefill = np.array([o.prefill_ms for o in seen])
    spans = np.diff([0.0] + [o.ended_s for o in seen]) * 1e3
    assert prefill[0] == 0.0 and len(seen) > 10
    finished = np.array([len(o.finished_ids) > 0 for o in seen])
    assert np.all(prefill[1:][finished[:-1]] > 0) and np.all(prefill[1:][~finished[:-1]] == 0)
    assert np.allclose(prefill / 0.5, np.round(prefill / 0.5))
    assert np.allclose(spans, 10.0 + prefill)


def test_a_launch_depth_makes_every_model_row_draft_it():
    """A policy planning on the lookup whose launch fixed the drafting depth (``launch_depth``, a plan decided on the
    device): its model rows verify k = 1 but draft 3 positions, and each step costs ``mixed_ms`` of that; without a
    depth, the drafting of k = 1."""
    from tabletune.policies.base import MODEL, Decision

    cost = StepCost(StepProfile.load("profiles/h200/qwen3-8b_eagle_ctx1024.json"))

    class Planner:
        name, uses_features, uses_lookup = "planner", False, True

        def __init__(self, depth):
            self.launch_depth = depth

        def decide(self, state):
            return Decision.per_request(np.ones(state.batch_size, np.int64),
                                        np.full(state.batch_size, MODEL, np.int64))

        def observe(self, outcome):
            pass

    from tabletune.policies.timed import timed

    ms = {}
    for depth, wrap in ((None, False), (3, False), (3, True)):  # through the simulator's host timer too
        sim = Simulator(cost, Schedule.constant(Workload("w", rates=(0.5,) * 7)),
                        SimConfig(duration_s=0.5, load=4, prefill_ms_per_token=0.0))
        steps = sim.run(timed(Planner(depth)) if wrap else Planner(depth)).steps
        ms[depth, wrap] = float(np.median(steps.step_ms))
    ones = np.ones(4, np.int64)
    assert ms[None, False] == pytest.approx(cost.mixed_ms(ones, ones, np.zeros(4, bool)))
    assert ms[3, False] == ms[3, True] == pytest.approx(cost.mixed_ms(ones, 3 * ones, np.zeros(4, bool)))
    assert ms[3, False] > ms[None, False]
