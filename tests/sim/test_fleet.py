"""The fleet simulator: N replicas behind a router with open-loop arrivals."""

import json

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.cost import StepCost
from tabletune.policies import make_policy
from tabletune.profile import StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, Workload
from tabletune.sim.fleet import run_fleet

RATES = (0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)


def simulator(starter, rate: float, duration: float = 20.0) -> Simulator:
    w = Workload("w", RATES, output_len_mean=64, prompt_len_mean=0)
    return Simulator(StepCost(StepProfile.load(starter), 0.5), Schedule.constant(w),
                     SimConfig(duration_s=duration, arrival_rate=rate, max_num_seqs=128, seed=4))


def test_one_replica_fleet_equals_one_engine_without_randomness(starter_8b):
    """k = 0 draws no acceptance: the same arrivals and requests give the very same run."""
    sim = simulator(starter_8b, 30.0)
    single = sim.run(make_policy("fixed:0", sim.context())).summary()
    fleet = run_fleet(sim, lambda i: make_policy("fixed:0", sim.context()), 1, "round-robin").summary()
    fleet.pop("replicas")
    assert fleet == single and single["finished_requests"] > 100


def test_round_robin_alternates_and_least_loaded_favours_the_faster_replica(starter_8b):
    sim = simulator(starter_8b, 400.0, duration=10.0)  # saturating: queues build up
    fast, slow = "fixed:3", "fixed:0"  # k = 3 emits ~2.8 tokens a step, k = 0 one

    def policies(i):
        return make_policy(fast if i == 0 else slow, sim.context())

    rr = run_fleet(sim, policies, 2, "round-robin").replicas
    ll = run_fleet(sim, policies, 2, "least-loaded").replicas
    assert rr[0].policy != rr[1].policy
    rr_tokens = [float(r.steps.tokens.sum()) for r in rr]
    ll_tokens = [float(r.steps.tokens.sum()) for r in ll]
    assert sum(ll_tokens) > sum(rr_tokens)  # least-loaded keeps the fast replica busier
    assert len(ll[0].requests.finish_s) > 1.5 * len(ll[1].requests.finish_s)


def test_fleet_summary_pools_replicas(starter_8b):
    sim = simulator(starter_8b, 40.0)
    res = run_fleet(sim, lambda i: make_policy("tabletune", sim.context(seed=i)), 3, "least-loaded")
    s = res.summary()
    assert len(s["replicas"]) == 3
    assert s["finished_requests"] == sum(r["finished_requests"] for r in s["replicas"])
    assert s["throughput_tok_s"] == pytest.approx(sum(r["throughput_tok_s"] * r["duration_s"]
                                                      for r in s["replicas"]) / s["duration_s"], rel=1e-3)


def test_cli_replicas(starter_8b):
    args = ["simulate", "--step-times", str(starter_8b), "--acceptance", ",".join(map(str, RATES)),
            "--policy", "controller", "--duration", "5"]
    out = CliRunner().invoke(main, [*args, "--replicas", "2", "--router", "least-loaded", "--arrival-rate", "20",
                                    "--json"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)["replicas"]) == 2
    bad = CliRunner().invoke(main, [*args, "--replicas", "2"])
    assert bad.exit_code == 2 and "--arrival-rate" in bad.output
