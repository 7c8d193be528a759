"""benchmarks/engine_policies.py end to end on the CPU (--quick), so a GPU run starts from a script that works."""

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import engine_grid_sim  # noqa: E402
import engine_policies  # noqa: E402
import engine_switch  # noqa: E402
import engine_timing  # noqa: E402
import policies_sim  # noqa: E402
import torch  # noqa: E402

from tabletune.policies.base import MODEL, NGRAM  # noqa: E402


def test_policy_names_put_fixed_ks_first_and_skip_unregistered(capsys):
    args = Namespace(k_max=2, policies="tabletune,no-such-policy,disco:variant=threshold")
    assert engine_policies.policy_names(args) == ["fixed:0", "fixed:1", "fixed:2", "tabletune",
                                                  "disco:variant=threshold"]
    assert "'no-such-policy' is not registered: skipped" in capsys.readouterr().out


def test_policy_names_take_specs_with_options_separated_by_semicolons():
    args = Namespace(k_max=0, policies="controller:per-request,ngram=0;hybrid-static")
    assert engine_policies.policy_names(args) == ["fixed:0", "controller:per-request,ngram=0", "hybrid-static"]


def test_a_resumed_file_keeps_every_command_that_wrote_cells():
    first, second = "python a --loads 4", "python a --loads 16"
    assert engine_grid_sim.commands_of(None, first) == [first]
    old = {"command": first}  # a file written before the list was kept
    assert engine_grid_sim.commands_of(old, second) == [first, second]
    assert engine_grid_sim.commands_of({"command": second, "commands": [first, second]}, first) == [first, second]
    assert engine_grid_sim.command_lines({"command": first}) == [f"Command: `{first}`"]
    assert engine_grid_sim.command_lines({"command": second, "commands": [first, second]})[2:] == [
        f"- `{first}`", f"- `{second}`"]


def test_sim_only_simulates_with_the_traces_the_file_was_measured_with():
    """A grid measured on the trained head's traces is simulated on them, not on the default early-exit ones."""
    key = {"prompt_len": 32, "output_len": 512, "k_max": 7, "warmup_steps": 200, "measured_steps": 500,
           "fixed_repeats": 2, "overlap_observe": True, "model_trace": "eagle"}
    args = engine_policies.parse_args(["--sim-only"])
    engine_grid_sim.protocol_from_key(args, key)
    protocol = engine_grid_sim.protocol_of(args)
    assert (protocol.model_trace, protocol.overlap_observe, protocol.fixed_repeats) == ("eagle", True, 2)
    del key["model_trace"]  # a file from before the key held it
    engine_grid_sim.protocol_from_key(args, key)
    assert engine_grid_sim.protocol_of(args).model_trace == "early-exit"


def test_read_extras_hand_worked_and_priced():
    """Two patterns at b = 4: model rows drafting 2 and 1. Once: read - split = 0.3 and 0.5, median 0.4. Each further
    read: (read_each - read) / (k - 1) = (10.5 - 10.3) / 1 = 0.2 from the first only (one position has no further read).
    The cost takes them as (b, ms) pairs; a plan check from before the reads were timed gives none."""
    rows = [{"batch_size": 4, "k_model": 2, "split_ms": 10.0, "read_ms": 10.3, "read_each_ms": 10.5},
            {"batch_size": 4, "k_model": 1, "split_ms": 9.0, "read_ms": 9.5, "read_each_ms": 9.5}]
    extras = engine_timing.read_extra_ms(rows)
    assert extras == {"read_extra_ms": {"4": 0.4}, "position_read_extra_ms": {"4": 0.2}}
    assert engine_timing.read_extra_ms([{k: v for k, v in r.items() if not k.startswith("read")} for r in rows]) == {}
    from tabletune.profile import StepPoint, StepProfile

    profile = StepProfile(tuple(StepPoint(b, k, (10.0 + b + 4 * k,)) for b in (1, 4) for k in range(3)), 64)
    cost = engine_timing.engine_cost(profile, {"fitted_draft_share": 0.5}, None, {"split_extra_ms": {"4": 0.1},
                                                                                 **extras})
    assert (cost.split_ms(4), cost.read_ms(4), cost.position_read_ms(4)) == pytest.approx((0.1, 0.4, 0.2))


def test_the_plan_check_reads_once_or_after_every_position():
    """The timed split step: model rows (0, 1) draft 3 positions, the n-gram row 2 is looked up, then verified. A
    read once comes after the last position; a read each after every position; none without ``read``."""
    calls = []

    class Engine:
        device = torch.device("cpu")
        k_max = 7

        def reset_rows(self, num_rows, ctx):
            calls.clear()

        def draft_position(self, slots, j, k):
            calls.append(("draft", j))

        def read_drafts(self, slots, k):
            calls.append(("read", k))

        def lookup_rows(self, slots):
            calls.append(("lookup", tuple(slots)))

        def verify_drafted(self, slots, ks, kinds=None):
            calls.append(("verify", tuple(ks)))

        def read(self, buf, n, k_max):
            calls.append(("result",))

    steps = {}
    for read in ("", "once", "each"):
        engine_timing.time_plan(Engine(), [3, 3, 5], [MODEL, MODEL, NGRAM], 1, 64, True, read=read)
        steps[read] = list(calls)
    tail = [("lookup", (2,)), ("verify", (3, 3, 5)), ("result",)]
    assert steps[""] == [("draft", 0), ("draft", 1), ("draft", 2)] + tail
    assert steps["once"] == [("draft", 0), ("draft", 1), ("draft", 2), ("read", 3)] + tail
    assert steps["each"] == [("draft", 0), ("read", 1), ("draft", 1), ("read", 2), ("draft", 2), ("read", 3)] + tail


def test_next_fixed_k_searches_around_the_best_hand_worked():
    """Modelled best k = 3: measure 3, then its neighbours 2 and 4; 4 is best, so 5; 4 stays best: done."""
    seen: dict[int, float] = {}
    order = []
    tok = {0: 50.0, 1: 70.0, 2: 80.0, 3: 90.0, 4: 95.0, 5: 93.0, 6: 85.0, 7: 80.0}
    while (k := engine_policies.next_fixed_k(seen, 3, 7)) is not None:
        order.append(k)
        seen[k] = tok[k]
    assert order == [3, 2, 4, 5]
    assert engine_policies.next_fixed_k({0: 10.0, 1: 5.0}, 0, 7) is None  # k = 0 best, its one neighbour measured


def test_modelled_fixed_k_hand_worked():
    """T(1, k) = 10 + 4k; a = 0.9: E = 1, 1.9, 2.71, 3.439 at k = 0..3, E / T = 0.100, 0.136, 0.151, 0.156: k = 3;
    a = 0.5: E = 1, 1.5, 1.75, 1.875, E / T = 0.100, 0.107, 0.097, 0.085: k = 1."""
    from tabletune.cost import StepCost
    from tabletune.profile import StepPoint, StepProfile

    cost = StepCost(StepProfile(tuple(StepPoint(1, k, (10.0 + 4 * k,)) for k in range(4)), 64))
    assert engine_policies.modelled_fixed_k(cost, (0.9,) * 3, 1, 3) == 3
    assert engine_policies.modelled_fixed_k(cost, (0.5,) * 3, 1, 3) == 1


def test_estimate_counts_cells_and_profile():
    """2 policies x 1 load x 1 workload, max(warm-up 20, output 10 / 2) + 50 measured = 70 steps a cell at 4 + 1 ms:
    0.7 s; profile (1 + 2) steps x 2 ks x 1 bucket at 4 ms: 0.024 s."""
    args = Namespace(rounds=2, output_len=10, profile_steps=1, k_max=1, loads="1", warmup_steps=20, measured_steps=50)
    assert engine_policies.estimate_s(args, 4.0, 2, 1, 1) == pytest.approx(0.7 + 0.024)


def test_estimate_takes_each_loads_window_of_row_steps():
    """Loads 1 and 4, 30 measured steps or 200 row-steps: windows of 200 and 50 steps, a mean of 125; + max(warm-up
    20, output 100 / 2) = 175 steps a cell at 4 + 1 ms: 0.875 s, x 2 policies x 2 loads = 3.5 s; profile (1 + 2)
    steps x 2 ks x 3 buckets (1, 2, 4) at 4 ms: 0.072 s."""
    args = Namespace(rounds=8, output_len=100, profile_steps=1, k_max=1, loads="1,4", warmup_steps=20,
                     measured_steps=30, measured_row_steps=200)
    assert engine_policies.estimate_s(args, 4.0, 2, 2, 1) == pytest.approx(3.5 + 0.072)


def test_a_cell_whose_window_is_short_of_the_protocols_is_measured_again():
    """Protocol: 500 steps, or 2,000 row-steps. Load 1 asks 2,000 steps: 501 is short; load 2 asks 1,000: 950 is
    within a tenth; load 4 asks 500: 500 is whole; a simulated cell (no steps) is never short."""
    protocol = policies_sim.Protocol(measured_steps=500, measured_row_steps=2000)
    assert engine_policies.short_window({"load": 1, "measured_steps": 501}, protocol)
    assert not engine_policies.short_window({"load": 2, "measured_steps": 950}, protocol)
    assert not engine_policies.short_window({"load": 4, "measured_steps": 500}, protocol)
    assert not engine_policies.short_window({"load": 1, "policy": "oracle"}, protocol)
    old = {"fingerprint": {"engine": "builtin", "engine_version": "0.13.0"}, "k_max": 7}
    assert engine_policies.compatible(old) == engine_policies.compatible({**old, "measured_row_steps": 2000})


def test_the_simulator_measures_the_window_a_cell_measured():
    """A measured cell's window (its ``measured_steps``) replaces the protocol's, at every load; a cell without one
    keeps the protocol."""
    protocol = policies_sim.Protocol(measured_steps=500, measured_row_steps=2000)
    assert engine_grid_sim.measured_window(protocol, {"measured_steps": 501}).window_steps(1) == 501
    assert engine_grid_sim.measured_window(protocol, {"measured_steps": 2001}).window_steps(1) == 2001
    assert engine_grid_sim.measured_window(protocol, {}).window_steps(1) == 2000


def test_estimate_stops_at_the_window():
    """A cell stops once its window is complete: max(warm-up 20, output 100 / 2) + 30 measured = 80 steps a cell,
    not rounds 8 x 100 / 2 = 400; 2 cells at 4 + 1 ms: 0.8 s; profile 0.024 s as above."""
    args = Namespace(rounds=8, output_len=100, profile_steps=1, k_max=1, loads="1", warmup_steps=20,
                     measured_steps=30)
    assert engine_policies.estimate_s(args, 4.0, 2, 1, 1) == pytest.approx(0.8 + 0.024)


def test_a_resumed_call_counts_only_what_it_will_measure():
    """Groups chat 1 and 8, policies fixed ks + a, b: chat 1 holds fixed:2 and a (so b is to measure, and no fixed
    k), chat 8 holds b alone (a to measure, and its fixed ks): 2 policy cells, 1 group of fixed ks."""
    done = {("chat", 1, "fixed:2"), ("chat", 1, "a"), ("chat", 8, "b"), ("code", 8, "a")}
    assert engine_policies.cells_to_measure(["fixed:0", "a", "b"], ["chat"], [1, 8], done) == (2, 1)
    assert engine_policies.cells_to_measure(["a", "b"], ["chat", "code"], [8], done) == (2, 2)


@pytest.mark.slow
def test_quick_grid_runs_checkpoints_resumes_and_refuses_over_budget(tmp_path):
    out = str(tmp_path / "ep")
    assert engine_policies.main(["--quick", "--out", out, "--budget-s", "100000", "--no-sim"]) == 0
    assert all(c["sim_ratio"] is None for c in json.loads(Path(out + ".json").read_text())["cells"])
    assert engine_policies.main(["--quick", "--out", out, "--sim-only"]) == 0
    result = json.loads(Path(out + ".json").read_text())
    cells = result["cells"]
    # loads 1, 2 x (the fixed ks the search measured + 4 policies + the simulated oracle); the search measures the
    # best k's neighbours (within 0..3) and stops there
    for load in (1, 2):
        fixed = {int(c["policy"][6:]): c["ratio"] for c in cells
                 if c["load"] == load and c["policy"].startswith("fixed:")}
        best = max(fixed, key=fixed.__getitem__)
        assert fixed[best] == 1.0 and all(r <= 1.0 for r in fixed.values())
        assert {k for k in (best - 1, best + 1) if 0 <= k <= 3} <= set(fixed)
        assert len([c for c in cells if c["load"] == load]) == len(fixed) + 4 + 1
    served = [c for c in cells if c["policy"] != "oracle"]
    assert all(c["sim_ratio"] is not None and c["difference"] is not None for c in served)
    # the protocol's fields: host time apart from the step, the oracle's headroom, repeated fixed k
    assert all(c["host_ms_per_step"] >= 0 and c["step_ms"] > 0 and c["oracle_ratio"] > 0 for c in served)
    # the critical host time's parts, each with its median (a part slow on every step, or on a few)
    assert all(c[f"host_ms_{part}"] >= 0 and c[f"host_ms_{part}_median"] >= 0 for c in served
               for part in ("critical", "bookkeeping", "decide"))
    assert all(len(c["throughput_repeats"]) == 2 and c["noise_band"] >= 0 for c in served
               if c["policy"].startswith("fixed:"))
    assert {c["load"] for c in cells if c["policy"] == "oracle" and c["throughput_tok_s"] is None} == {1, 2}
    # what the cost model leaves out of each step: a fixed k never splits; every cell prices some step
    assert all(c["split_share"] == 0 and c["residual_ms_split"] is None for c in served
               if c["policy"].startswith("fixed:"))
    assert all(0 <= c["split_share"] <= 1 and (c["residual_ms_fused"] is not None or c["split_share"] == 1)
               for c in served)
    # held-out: the policies' prior rates come from the calibration half of the prompts
    from tabletune.sim.replay import load_traces

    traces = Path(__file__).resolve().parents[2] / "profiles" / "traces"
    cal = load_traces([traces / "early-exit_code_T0.csv.gz"], half="calibration").conditional_rates(3)
    assert result["workloads"]["code"]["rates"] == pytest.approx([max(a, 1e-3) for a in cal])
    assert len(result["mixed_check"]["rows"]) == 2 * 3 and 0 <= result["mixed_check"]["fitted_draft_share"] <= 1
    assert result["mixed_check"]["draft_rows"] in ("active", "batch")
    # planned steps with n-gram rows, k_max 3 and a largest batch of 2: one model row and one n-gram row a pattern
    plans = result["plan_check"]
    assert [(r["batch_size"], r["k_model"], r["k_ngram"]) for r in plans["rows"]] == [(2, 2, 3), (2, 2, 3), (2, 1, 3),
                                                                                       (2, 3, 3)]
    assert all(r["split_ms"] > 0 and r["fused_ms"] > 0 and r["verify_ms"] > 0 and r["priced_ms"] > 0
               and r["read_ms"] > 0 and r["read_each_ms"] > 0 for r in plans["rows"])
    assert set(plans["split_extra_ms"]) == set(plans["read_extra_ms"]) == set(plans["position_read_extra_ms"]) == {"2"}
    # drafting alone by batch size (the buckets 1 and 2), k = 0..3; the cells' policies priced drafting by it
    drafts = result["draft_profile"]["rows"]
    assert [r["batch_size"] for r in drafts] == [1, 2]
    assert all(len(r["draft_ms"]) == 4 and r["draft_ms"][0] == 0 and min(r["draft_ms"]) >= 0 for r in drafts)
    assert all(c["pricing"] == "draft profile" for c in served)
    assert all(r["priced_ms"] > 0 for r in result["mixed_check"]["rows"])
    assert "| code | 1 | fixed:0 |" in Path(out + ".md").read_text()
    assert engine_policies.main(["--quick", "--out", out, "--resume", "--budget-s", "100000"]) == 0
    assert json.loads(Path(out + ".json").read_text())["cells"] == cells  # nothing re-measured
    # --remeasure: gammatune's cells measured again (appended after the kept cells), nothing else
    assert engine_policies.main(["--quick", "--out", out, "--resume", "--budget-s", "100000", "--no-sim",
                                 "--remeasure", "gammatune"]) == 0
    again = json.loads(Path(out + ".json").read_text())["cells"]
    kept = [c for c in cells if c["policy"] != "gammatune"]
    assert again[:len(kept)] == kept
    assert [(c["policy"], c["load"]) for c in again[len(kept):]] == [("gammatune", 1), ("gammatune", 2)]
    assert engine_policies.main(["--quick", "--out", out, "--resume", "--remeasure", "controller"]) == 2
    assert engine_policies.main(["--quick", "--out", str(tmp_path / "x"), "--budget-s", "0.001"]) == 2
    assert not (tmp_path / "x.json").exists()


def test_engine_cost_prices_drafting_by_the_draft_profile_hand_worked():
    """T(b, k) = 10 + b + 4k at b in {1, 4}; D measured 3k at b = 1 and 5k at b = 4 (more than T - T0 = 4k: clipped
    there, verification never costs less than none). b = 1: V(1, 2) = 19 - 6 = 13; b = 4: D = 4k, V = T0 = 14."""
    from tabletune.profile import StepPoint, StepProfile

    profile = StepProfile(tuple(StepPoint(b, k, (10.0 + b + 4 * k,)) for b in (1, 4) for k in range(4)), 64)
    mixed = {"fitted_draft_share": 0.5, "draft_rows": "active"}
    drafts = {"rows": [{"batch_size": 1, "draft_ms": [0.0, 3.0, 6.0, 9.0]},
                       {"batch_size": 4, "draft_ms": [0.0, 5.0, 10.0, 15.0]}]}
    cost = engine_timing.engine_cost(profile, mixed, drafts)
    assert cost.verify_ms(1, 2.0) == pytest.approx(13.0) and cost.draft_row(1).tolist() == [0, 3, 6, 9]
    assert cost.verify_ms(4, 3.0) == pytest.approx(14.0) and cost.draft_row(4).tolist() == [0, 4, 8, 12]
    # without the profile: the fitted share, D = 0.5 (T - T0) = 2k
    assert engine_timing.engine_cost(profile, mixed).verify_ms(1, 2.0) == pytest.approx(15.0)


def test_span_fit_hand_worked():
    """Rows at positions 1-3, 5, 8-9 of 10 (gap at 4 bridged, the one at 6-7 not): runs of 5 and 2, so the mean
    span is 3.5 tokens and 2 runs start in the 3 positions outside them (6, 7, 10)."""
    import numpy as np

    from tabletune.engine.trace_replay import TokenTrace

    present = np.array([1, 1, 1, 0, 1, 0, 0, 1, 1, 0], bool)
    t = TokenTrace("r", np.zeros((10, 3), np.float32), present, present, np.full(10, 3))
    assert engine_grid_sim.span_fit([t]) == pytest.approx((2 / 3, 3.5))


def test_phase_table_switches_at_the_first_request_of_the_second_workload():
    import numpy as np

    from tabletune.policies.base import BatchState, Decision

    class Fixed:
        def __init__(self, k):
            self.k, self.seen = k, 0

        def decide(self, state):
            return Decision.batch(self.k)

        def observe(self, outcome):
            self.seen += 1

    def state(ids):
        return BatchState(step=0, time_s=0.0, request_ids=np.array(ids), num_generated=np.ones(len(ids), np.int64))

    before, after = Fixed(3), Fixed(1)
    oracle = engine_switch.PhaseTable(before, after, first_id=4)
    assert oracle.decide(state([0, 1, 2, 3])).ks_for(4).tolist() == [3] * 4
    oracle.observe(None)
    assert oracle.decide(state([1, 2, 3, 4])).ks_for(4).tolist() == [1] * 4  # one request of the second: switched
    assert oracle.decide(state([1, 2, 3])).ks_for(3).tolist() == [1] * 3  # and stays switched
    oracle.observe(None)
    assert (before.seen, after.seen) == (1, 1)


def test_recovered_hand_worked():
    """Windows from each run's own switch: stale 100, oracle 120, policy 115 -> 0.75; an earlier window ignored."""
    def run(switch, tok):
        return {"switch_step": switch, "window_starts": [0, 10, 20, 30, 40], "tok_s": tok}

    runs = {"stale": run(10, [50, 100, 100, 100, 0]), "oracle": run(10, [90, 120, 120, 120, 0]),
            "controller": run(20, [0, 0, 110, 120, 115])}
    assert engine_switch.recovered(runs) == {"stale": 0.0, "oracle": 1.0, "controller": 0.75}
    # the windows after the first to the end of the run (10-40): 100, 115 and 115
    later = engine_switch.recovered({"stale": run(0, [100, 100, 100, 100, 100]),
                                     "oracle": run(0, [70, 110, 110, 110, 130]),
                                     "controller": run(0, [200, 100, 100, 100, 160])}, skip=1, count=None)
    assert later == {"stale": 0.0, "oracle": 1.0, "controller": 1.0}
    assert engine_switch.recovered(runs, start="drained_step") is None  # runs without a drain step
    # from the drain (step 20): 100, 120 and (100 + 110 + 120) / 3 = 110
    drained = {"stale": run(10, [50, 100, 100, 100, 100]), "oracle": run(10, [90, 120, 120, 120, 120]),
               "controller": run(10, [0, 0, 100, 110, 120])}
    for r in drained.values():
        r["drained_step"] = 20
    assert engine_switch.recovered(drained, start="drained_step") == {"stale": 0.0, "oracle": 1.0,
                                                                       "controller": 0.5}
    runs["oracle"] = run(10, [90, 100.4, 100.4, 100.4, 0])
    assert engine_switch.recovered(runs) is None  # the oracle gains under 0.5%


@pytest.mark.slow
def test_quick_switch_runs_every_policy_at_every_load_and_resumes(tmp_path):
    out = str(tmp_path / "sw")
    assert engine_policies.main(["--quick", "--switch", "--out", out]) == 0
    result = json.loads(Path(out + ".json").read_text())
    assert set(result["runs"]) == {"1", "2"}
    for load, runs in result["runs"].items():
        assert list(runs) == list(engine_switch.SWITCH_POLICIES)
        for run in runs.values():
            # the switch: the step that admitted the first chat request (2 waves of code before it)
            assert 0 < run["switch_step"] < run["num_steps"] and len(run["tok_s"]) == len(run["window_starts"]) > 0
            assert all(t % 4 == run["switch_step"] % 4 for t in run["window_starts"])
            assert run["switch_step"] <= run["drained_step"] <= run["num_steps"]
    assert set(result["recovered_drained"]) == set(result["recovered_later"]) == {"1", "2"}
    assert "| 1 | stale |" in Path(out + ".md").read_text()
    assert engine_policies.main(["--quick", "--switch", "--out", out, "--resume"]) == 0
    assert json.loads(Path(out + ".json").read_text())["runs"] == result["runs"]  # nothing re-run


def test_charged_host_ms_is_the_critical_time_beyond_a_fixed_k():
    """Fixed-k cells at 0.05 and 0.07 ms critical: a policy at 0.46 is charged 0.40; one below them 0; a fixed k
    nothing; a cell without host_ms_critical its host_ms_per_step."""
    cells = [{"workload": "chat", "load": 4, "policy": "fixed:1", "host_ms_critical": 0.05},
             {"workload": "chat", "load": 4, "policy": "fixed:2", "host_ms_critical": 0.07},
             {"workload": "chat", "load": 8, "policy": "fixed:2", "host_ms_critical": 9.0}]
    charge = engine_grid_sim.charged_host_ms
    assert charge({"workload": "chat", "load": 4, "policy": "p", "host_ms_critical": 0.46}, cells) == \
        pytest.approx(0.40)
    assert charge({"workload": "chat", "load": 4, "policy": "p", "host_ms_critical": 0.01}, cells) == 0.0
    assert charge(cells[0], cells) == 0.0
    assert charge({"workload": "chat", "load": 4, "policy": "p", "host_ms_per_step": 0.3}, cells) == 0.3


def test_a_cell_decided_on_the_lookup_on_some_steps_is_charged_by_step():
    """Steps 1..4 measured, two of them decided on the lookup (critical 0.5 and 0.3 ms), two not (0.1, 0.05): share
    0.5, means 0.4 and 0.075; the simulator then charges the lookup steps 0.4 - 0.05 (the fixed k's) and the rest
    0.025. A cell with every step alike keeps one charge (None for the lookup steps)."""
    from types import SimpleNamespace

    stats = SimpleNamespace(step_looked_up=[True, True, False, True, False, False],
                            step_host_critical_s=[9.0, 5e-4, 1e-4, 3e-4, 5e-5, 9.0])
    split = engine_policies.lookup_split(stats, 1, 5)
    assert split == {"lookup_share": 0.5, "host_ms_critical_lookup": 0.4, "host_ms_critical_other": 0.075}
    cells = [{"workload": "chat", "load": 4, "policy": "fixed:1", "host_ms_critical": 0.05}]
    cell = {"workload": "chat", "load": 4, "policy": "p", "host_ms_critical": 0.2375, **split}
    assert engine_grid_sim.charged_lookup_ms(cell, cells) == pytest.approx(0.35)
    assert engine_grid_sim.charged_host_ms({**cell, "host_ms_critical": cell["host_ms_critical_other"]}, cells) == \
        pytest.approx(0.025)
    for share in (0.0, 1.0, None):
        assert engine_grid_sim.charged_lookup_ms({**cell, "lookup_share": share}, cells) is None


def test_resume_keeps_another_patch_of_the_engine_and_refuses_another_minor():
    key = {"fingerprint": {"engine": "builtin", "engine_version": "0.13.0"}, "k_max": 7}
    patch = {"fingerprint": {"engine": "builtin", "engine_version": "0.13.1"}, "k_max": 7}
    minor = {"fingerprint": {"engine": "builtin", "engine_version": "0.14.0"}, "k_max": 7}
    assert engine_policies.compatible(key) == engine_policies.compatible(patch)
    assert engine_policies.compatible(key) != engine_policies.compatible(minor)
    assert engine_policies.compatible(key) != engine_policies.compatible({**patch, "k_max": 6})
