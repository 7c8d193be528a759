"""The fleet simulator: N replicas behind a router with open-loop arrivals."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.cost import StepCost
from tabletune.policies import make_policy
from tabletune.profile import StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, Workload
from tabletune.sim.fleet import FleetResult, route, run_fleet

STARTER_8B = Path(__file__).resolve().parents[2] / "profiles" / "starter" / "h200_qwen3-8b-shape_ctx1024_eagle-like.csv"
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


def test_route_hand_worked():
    """Three replicas; loads are running + waiting requests when each arrival is routed."""
    loads = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (1, 1, 1), (0, 1, 1), (0, 2, 1), (3, 0, 2)]
    assert [route("round-robin", x, turn) for turn, x in enumerate(loads)] == [0, 1, 2, 0, 1, 2, 0]
    assert [route("least-loaded", x, turn) for turn, x in enumerate(loads)] == [0, 1, 2, 0, 0, 0, 1]


def fleet_routes(router: str, rate: float, output_len: int, duration_s: float) -> FleetResult:
    w = Workload("w", RATES, output_len=output_len, prompt_len_mean=0)
    sim = Simulator(StepCost(StepProfile.load(STARTER_8B), 0.5), Schedule.constant(w),
                    SimConfig(duration_s=duration_s, arrival_rate=rate, max_num_seqs=128, seed=4))
    return run_fleet(sim, lambda i: make_policy("fixed:0", sim.context()), 3, router)


def test_routers_on_an_idle_fleet():
    """Arrivals 10 s apart, one-token requests: every replica is idle when a request arrives."""
    rr = fleet_routes("round-robin", 0.1, 1, 100.0)
    assert len(rr.routes) >= 6 and rr.routes == tuple(i % 3 for i in range(len(rr.routes)))
    assert [len(r.requests.finish_s) for r in rr.replicas] == [rr.routes.count(i) for i in range(3)]
    ll = fleet_routes("least-loaded", 0.1, 1, 100.0)
    assert ll.routes == (0,) * len(ll.routes)  # all idle: ties go to the lowest index
    assert len(ll.replicas[0].requests.finish_s) == len(ll.routes)


def test_least_loaded_spreads_requests_that_never_finish():
    """Requests longer than the run: the loads are the counts routed so far, so least-loaded takes turns."""
    ll = fleet_routes("least-loaded", 200.0, 10**6, 0.1)
    assert len(ll.routes) >= 9 and ll.routes == tuple(i % 3 for i in range(len(ll.routes)))
