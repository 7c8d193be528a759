"""The simulator side of the policy grid, under the fair-testbed protocol (CPU, no engine).

Protocol (``Protocol``), shared with ``engine_policies.py``:

* cost: the H200 EAGLE-style profile of the 8B shape with its drafting time D(b, k) = T_eagle(b, k) -
  T_ngram(b, k) (the n-gram drafter runs on the CPU, so its profile is the target's share), costed by
  ``tabletune.cost``: drafting per position by the rows still drafting, verification by scheduled tokens;
  stop rules end rows' drafts position by position (``DraftStop``);
* held-out calibration: every learned rule is fit on the calibration half of the prompts
  (``tabletune.sim.replay.prompt_half``) and scored on the other half: the prior acceptance (tuned
  table, controller priors, adaptive verification's prior), the n-gram per-length rates and Hybrid
  Spark's n-gram table, DISCO's classifier, and DISCO's threshold, tuned for speed at batch 1 with
  k_max = 10 on the calibration traces (the profile is extended from k = 7 to 10 linearly in k, the
  mean slope of k = 4..7, for that tuning only), and hybrid-static's match length m, the m in 1..k_max with
  the largest mean share of the best m at loads ``HYBRID_M_LOADS`` on the calibration traces
  (``hybrid_static.choose_m``). TapOut's arms are parameter-free; GammaTune's and
  DSDE's knobs keep their stated defaults; the bandits and online calibrators learn during warm-up;
* every cell: ``warmup_steps`` steps and ``warmup_s`` simulated seconds of warm-up, then
  ``measured_steps`` measured steps, at least ``measured_row_steps`` / load (tok/s = tokens / time over them;
  at load 1, 500 steps hold 4-5 requests), outputs of ``output_len``
  tokens; fixed-k cells repeated over ``fixed_repeats`` seeds, policy and oracle cells over ``policy_repeats``
  (a cell is the mean of its runs; its noise band (max - min) / mean); ``host_ms_per_step`` = mean decide +
  keep_drafting + observe milliseconds over the measured steps (``tabletune.policies.timed``);
* headroom: ``oracle_ratio`` = FateOracle tok/s (``tabletune.sim.oracle``) over the best fixed k, and
  each policy's ``headroom_share`` = (ratio - 1) / (oracle_ratio - 1).

``--host-ms`` times every policy's host milliseconds per step (decide + keep_drafting + observe) instead: each
policy runs in the simulator at a closed-loop load (default 128) on the whole replayed early-exit traces of a
workload (signals included, so feature policies do their full work), wrapped by ``tabletune.policies.timed``;
the first ``--warmup-steps`` (default 50) are not counted, then ``--measured-steps`` (default 200). The machine
may be shared, so each policy runs ``--repeats`` times and the minimum of the per-run means is reported.
Single-threaded numpy is the caller's job (OMP_NUM_THREADS=1 etc.).

    python benchmarks/policies_sim.py --out benchmarks/results/engine_policies_sim
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/policies_sim.py --host-ms --repeats 3 \
        --out benchmarks/results/policy_host_ms
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.cost import StepCost
from tabletune.policies import Policy, make_policy
from tabletune.policies.disco_model import DiscoModel, train_disco
from tabletune.policies.hybrid_static import MChoice, choose_m
from tabletune.policies.timed import timed
from tabletune.policies.trace_fit import fit_ngram_table, read_traces, trace_rows
from tabletune.profile import StepPoint, StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, preset
from tabletune.sim.oracle import FateOracle, headroom_share
from tabletune.sim.replay import load_paired_traces, load_traces

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "profiles" / "traces"
PROFILES = ROOT / "profiles" / "h200"
ZOO = ("tabletune", "controller", "controller:per-request", "vllm-av", "turbospec", "nightjar", "sglang", "disco", "tapout", "dsde", "gammatune",
       "adaptive-verification", "hybrid-spark", "hybrid-static")
HOST_ZOO = ("fixed:3", "tabletune", "controller", "turbospec", "nightjar", "sglang", "disco", "tapout", "dsde",
            "gammatune", "adaptive-verification", "hybrid-spark", "hybrid-static", "controller:per-request")
HOST_BUDGET_MS = 0.3
DISCO_TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DISCO_K_MAX = 10
HYBRID_M_LOADS = (1, 16, 128)
CALIBRATION_S = 20.0  # simulated seconds of each calibration run (DISCO's tau, hybrid-static's m)
# each model trace's n-gram partner: the n-gram chain recorded along the same prompts and continuations (the
# early-exit traces: the first 8 prompts, 96 tokens; the trained head's: every prompt, 256 tokens, chat-ifeval the
# first 64); tests/benchmarks/test_trace_partners.py checks that each pair follows the same text
NGRAM_PARTNER = {"early-exit": "ngram", "eagle": "ngram-full"}


def trace_files(model_trace: str, workload: str) -> tuple[Path, Path]:
    """(model trace, its n-gram partner) of a workload under ``profiles/traces``."""
    return (TRACES / f"{model_trace}_{workload}_T0.csv.gz",
            TRACES / f"{NGRAM_PARTNER[model_trace]}_{workload}_T0.csv.gz")


@dataclass(frozen=True)
class Protocol:
    warmup_steps: int = 200
    warmup_s: float = 5.0
    measured_steps: int = 500
    output_len: int = 512
    prompt_len: int = 32
    fixed_repeats: int = 3
    # policy and oracle cells, each repeated: a policy's run draws its requests' trace rows as its steps admit them,
    # so two policies serve different requests; at load 1 one run of code-edit spans -7 to +5% of the 8-seed mean
    policy_repeats: int = 3
    overlap_observe: bool = True  # as the engine's --overlap-observe: a policy that allows it observes off the path
    model_trace: str = "early-exit"  # the model chain's traces, a key of NGRAM_PARTNER (``trace_files``)
    # measured steps hold at least this many row-steps (steps x load): 500 steps at load 1 hold 4-5 requests of
    # 512 tokens, and a run swings with them (code-edit, load 1: 300-step chunks of one run at 0.42-1.14 tok/ms)
    measured_row_steps: int = 4000

    def __post_init__(self) -> None:
        if (self.measured_steps < 1 or self.warmup_steps < 0 or self.fixed_repeats < 1 or self.policy_repeats < 1
                or self.output_len < 1 or self.measured_row_steps < 0):
            raise ValueError(f"bad protocol {self}")

    def window_steps(self, load: int) -> int:
        """Measured steps at ``load``: ``measured_steps``, or more where that holds fewer than
        ``measured_row_steps`` row-steps (4,000 / load at loads 1-4 by default)."""
        return max(self.measured_steps, -(-self.measured_row_steps // max(load, 1)))


def h200_cost() -> StepCost:
    """The 8B EAGLE-style H200 profile with D(b, k) = T_eagle - T_ngram (module docstring)."""
    eagle = StepProfile.load(PROFILES / "qwen3-8b_eagle_ctx1024.json")
    ngram = StepProfile.load(PROFILES / "qwen3-8b_ngram_ctx1024.json")
    return StepCost.split(eagle, lambda b, k: eagle.step_ms(b, k) - ngram.step_ms(b, k))


def extend_k(cost: StepCost, k_max: int) -> StepCost:
    """T and D extended to k_max linearly in k (the mean slope, >= 0, of the last four measured k), for tuning only."""
    ks = cost.ks
    tail = ks[-4:]
    points, draft = [], []
    for b in cost.profile.batch_sizes:
        row, drow = cost.row(b), cost.draft_row(b)
        t_slope = max((row[-1] - row[len(tail) * -1]) / max(tail[-1] - tail[0], 1), 0.0)  # a noisy profile: >= 0
        d_slope = max((drow[-1] - drow[len(tail) * -1]) / max(tail[-1] - tail[0], 1), 0.0)
        for i, k in enumerate(ks + list(range(ks[-1] + 1, k_max + 1))):
            extra = k - ks[-1]
            points.append(StepPoint(b, k, (float(row[i] if extra <= 0 else row[-1] + extra * t_slope),)))
            draft.append(((b, k), float(drow[i] if extra <= 0 else drow[-1] + extra * d_slope)))
    profile = StepProfile(points=tuple(points), context_len=cost.profile.context_len)
    lookup = dict(draft)
    return StepCost.split(profile, lambda b, k: lookup[(b, k)])


def ngram_length_rates(cols: dict[str, np.ndarray], l_max: int = 16) -> tuple[float, ...]:
    """rates[L] = accepted share of the n-gram rows at match length L (index 0: 0; an empty L: the last rate)."""
    ng = np.isnan(cols["top1_prob"])
    match, ok = np.minimum(cols["ngram_len"][ng], l_max), cols["accepted"][ng]
    out = [0.0]
    for length in range(1, l_max + 1):
        sel = match == length
        out.append(float(ok[sel].mean()) if sel.any() else out[-1])
    return tuple(out)


def floor_rates(rates: tuple[float, ...]) -> tuple[float, ...]:
    """Rates at least 1e-3 (a position no calibration draft reached reads 0)."""
    return tuple(max(a, 1e-3) for a in rates)


@dataclass(frozen=True)
class Calibration:
    """What the policies of one workload learn offline, all from the calibration half of its prompts."""

    workload: str
    rates: tuple[float, ...]
    ngram_rates: tuple[float, ...]
    disco_model: str  # path of the classifier, its threshold tuned for speed
    disco_tau: float
    ngram_table: str  # path of Hybrid Spark's n-gram table
    hybrid_static_m: int  # hybrid-static's match length, chosen on the calibration half
    hybrid_static_m_shares: tuple[float, ...]  # per m = 1..k_max: its mean share of the best m over the loads

    def spec(self, policy: str) -> str:
        """The policy spec with its calibrated files and knobs (DISCO's classifier, Hybrid Spark's table,
        hybrid-static's m unless the spec sets one)."""
        name, _, arg = policy.partition(":")
        extra = {"disco": f"model={self.disco_model}", "hybrid-spark": f"ngram_table={self.ngram_table}",
                 "hybrid-static": f"m={self.hybrid_static_m}"}.get(name)
        own = (name == "disco" and "variant=threshold" in arg) or (name == "hybrid-static" and "m=" in arg)
        if extra is None or own:
            return policy
        return f"{name}:{arg},{extra}" if arg else f"{name}:{extra}"


def workload_preset(name: str):
    """The simulator's preset of a workload; chat-ifeval (IFEval's instructions) has chat's shape. The replayed
    traces give every acceptance and signal, the preset the rest (prompt length, spans of synthetic n-gram runs)."""
    return dataclasses.replace(preset("chat"), name=name) if name == "chat-ifeval" else preset(name)


def workload_of(name: str, rates: tuple[float, ...], protocol: Protocol):
    return dataclasses.replace(workload_preset(name), rates=rates, output_len=protocol.output_len,
                               prompt_len_mean=float(protocol.prompt_len))


def scoring_sim(cost: StepCost, name: str, rates, protocol: Protocol, load: int, duration_s: float, seed: int,
                half: str = "scoring", prefill_ms_per_token: float = 0.02, host_ms_per_step: float = 0.0,
                host_ms_lookup_step: float | None = None) -> Simulator:
    cfg = SimConfig(duration_s=duration_s, load=load, max_num_seqs=max(128, load), seed=seed,
                    prefill_ms_per_token=prefill_ms_per_token, host_ms_per_step=host_ms_per_step,
                    host_ms_lookup_step=host_ms_lookup_step)
    replay, ngram_replay = load_paired_traces(*trace_files(protocol.model_trace, name), half=half)
    return Simulator(cost, Schedule.constant(workload_of(name, rates, protocol)), cfg, replay=replay,
                     ngram_replay=ngram_replay)


def calibrate(name: str, k_max: int, cost: StepCost, folder: Path, protocol: Protocol) -> Calibration:
    """Fit every learned rule on the calibration half (module docstring); DISCO's tau by speed at batch 1."""
    folder.mkdir(parents=True, exist_ok=True)
    model_file, ngram_file = trace_files(protocol.model_trace, name)
    cal = load_traces([model_file], half="calibration")
    rates = floor_rates(cal.conditional_rates(k_max))
    ng_cols = read_traces(ngram_file, half="calibration")
    table = fit_ngram_table(ng_cols, k_max)
    table_path = folder / f"ngram-table-{name}.json"
    fileio.write_json(table_path, table.to_json())
    x, y = trace_rows(read_traces(model_file, half="calibration"))
    model = train_disco(x, y, trained_on=f"calibration half of {model_file.name}")
    wide = extend_k(cost, DISCO_K_MAX)
    wide_rates = floor_rates(cal.conditional_rates(DISCO_K_MAX))
    speed = {}
    for tau in DISCO_TAUS:
        sim = scoring_sim(wide, name, wide_rates, protocol, 1, CALIBRATION_S, 0, half="calibration")
        ctx = sim.context(prior_rates=wide_rates)
        policy = make_policy("disco", ctx)
        policy.model = dataclasses.replace(model, threshold=tau)
        speed[tau] = sim.run(policy).throughput_tok_s
    tau = max(speed, key=speed.get)
    disco_path = folder / f"disco-{name}.json"
    dataclasses.replace(model, threshold=float(tau)).save(disco_path)
    m = hybrid_m(cost, name, rates, protocol, k_max)
    return Calibration(name, rates, ngram_length_rates(ng_cols), str(disco_path), float(tau), str(table_path),
                       m.m, m.mean_share)


def hybrid_m(cost: StepCost, name: str, rates: tuple[float, ...], protocol: Protocol, k_max: int,
             loads: tuple[int, ...] = HYBRID_M_LOADS, duration_s: float = CALIBRATION_S) -> MChoice:
    """hybrid-static's m: every m in 1..k_max simulated at ``loads`` (at most the profile's largest batch) on the
    calibration half, the m with the largest mean share of each load's best m (``hybrid_static.choose_m``)."""
    candidates = tuple(range(1, k_max + 1))
    loads = tuple(sorted({min(x, cost.profile.max_batch_size) for x in loads}))
    tok_s = np.zeros((len(candidates), len(loads)))
    for j, load in enumerate(loads):
        for i, m in enumerate(candidates):
            sim = scoring_sim(cost, name, rates, protocol, load, duration_s, 0, half="calibration")
            tok_s[i, j] = sim.run(make_policy(f"hybrid-static:m={m}", sim.context(prior_rates=rates))).throughput_tok_s
    return choose_m(candidates, tok_s)


def charged_ms(policy, window: slice, overlap_observe: bool) -> float:
    """A ``timed`` policy's mean host ms a step over ``window`` that an engine waits on: ``critical_ms`` for a
    policy whose observe may lag under ``overlap_observe`` (the engine runs it while the next step runs), else all
    of ``host_ms``."""
    ms = policy.critical_ms if overlap_observe and policy.observe_may_lag else policy.host_ms
    return float(np.mean(ms[window]))


def explore_steps(policy) -> int | None:
    """The steps a controller-based policy explored on over its whole run (warm-up included); None without one."""
    controller = getattr(getattr(policy, "inner", policy), "controller", None)
    return getattr(controller, "explore_steps", None)


def gate_state(policy) -> dict:
    """A gated policy's A/B test at the end of its run (``controller:per-request,gate=1``): D, the decayed mean of
    the pairs' relative differences (rows over batch; > 0: the plans on the lookup won), the pairs measured since
    its last restart, and the differences of the last ``KEPT_PAIRS`` in order; empty for a policy without a gate."""
    gate = getattr(getattr(policy, "inner", policy), "gate", None)
    if gate is None:
        return {}
    return {"gate_difference": round(gate.gap, 4), "gate_pairs": gate.num_pairs,
            "gate_pair_differences": [round(p.difference, 4) for p in gate.pairs]}


def run_cell(cost: StepCost, calib: Calibration, spec: str, load: int, protocol: Protocol, seed: int = 0,
             prefill_ms_per_token: float = 0.02, host_ms_per_step: float | None = None,
             host_ms_lookup_step: float | None = None, wrap: Callable[[Policy], Policy] | None = None) -> dict:
    """One policy at one load: warm-up, then ``protocol.window_steps(load)`` measured steps (module docstring).
    ``wrap``: applied to the policy made from ``spec`` (a what-if that changes what it sees, ``plan_ahead.py``).

    Host time is charged serially, as an engine that decides between its steps pays it: ``host_ms_per_step``
    (e.g. the engine's own measurement of this policy) on every step (``host_ms_lookup_step`` instead on a step
    decided on the n-gram lookup, when given: ``SimConfig``), or, when None, the policy's host time
    measured in this run on the critical path, its window mean added to each measured step (``sim_tok_s``;
    ``sim_device_tok_s`` leaves it out): decide + keep_drafting + observe, or decide + keep_drafting alone for a
    policy whose observe may lag (``observe_may_lag``) under ``protocol.overlap_observe`` (the engine runs that
    observe while the next step runs, and evaluates on the device a stop rule the policy gives it: ``Timed``).
    The oracle is charged nothing."""
    step_s = cost.step_ms(load, cost.k_max) / 1e3
    measured = protocol.window_steps(load)
    duration_s = 1.2 * (protocol.warmup_s + (protocol.warmup_steps + measured) * step_s)
    in_sim = 0.0 if spec == "oracle" or host_ms_per_step is None else host_ms_per_step  # charged by the simulator
    while True:
        sim = scoring_sim(cost, calib.workload, calib.rates, protocol, load, duration_s, seed,
                          prefill_ms_per_token=prefill_ms_per_token, host_ms_per_step=in_sim,
                          host_ms_lookup_step=None if spec == "oracle" or host_ms_per_step is None
                          else host_ms_lookup_step)
        ctx = dataclasses.replace(sim.context(prior_rates=calib.rates), ngram_rates=calib.ngram_rates)
        # the oracle runs bare: the simulator tells it each draft's fate (its host time is not a policy's)
        if spec == "oracle":
            policy = FateOracle(ctx)
        else:
            made = make_policy(calib.spec(spec), ctx)
            policy = timed(made if wrap is None else wrap(made))
        res = sim.run(policy)
        steps = res.steps
        after = np.flatnonzero((np.arange(len(steps.start_s)) >= protocol.warmup_steps)
                               & (steps.start_s >= protocol.warmup_s))
        if len(after) >= measured:
            break
        duration_s *= 2
    window = slice(int(after[0]), int(after[0]) + measured)
    tokens, ms = steps.tokens[window].sum(), steps.step_ms[window].sum()
    host = None if spec == "oracle" else float(np.mean(policy.host_ms[window]))
    critical = None if spec == "oracle" else charged_ms(policy, window, protocol.overlap_observe)
    post_hoc = critical if critical is not None and host_ms_per_step is None else 0.0  # measured here, charged after
    device_ms = ms - steps.host_ms[window].sum()
    return {"sim_tok_s": round(float(tokens / (ms + post_hoc * measured) * 1e3), 2),
            "sim_device_tok_s": round(float(tokens / device_ms * 1e3), 2),
            "sim_mean_k": round(float(steps.mean_k[window].mean()), 3),
            "sim_explore_steps": None if spec == "oracle" else explore_steps(policy),
            **{"sim_" + key: value for key, value in ({} if spec == "oracle" else gate_state(policy)).items()},
            "host_ms_per_step": None if host is None else round(host, 4),
            "host_ms_critical": None if critical is None else round(critical, 4),
            "warmup_steps": int(after[0]), "measured_steps": measured}


def repeated_cell(cost: StepCost, calib: Calibration, spec: str, load: int, protocol: Protocol, repeats: int,
                  **kw) -> dict:
    """``run_cell`` over seeds 0..repeats-1: the mean of every number, each run's tok/s, and the noise band
    (max - min) / mean."""
    runs = [run_cell(cost, calib, spec, load, protocol, seed, **kw) for seed in range(repeats)]
    cell = {key: (round(float(np.mean([r[key] for r in runs])), 4) if isinstance(v, float) else v)
            for key, v in runs[0].items()}
    tok = [r["sim_tok_s"] for r in runs]
    return {**cell, "sim_tok_s": round(float(np.mean(tok)), 2), "sim_tok_s_repeats": tok,
            "noise_band": round((max(tok) - min(tok)) / float(np.mean(tok)), 4)}


def group_cells(cost: StepCost, calib: Calibration, load: int, k_max: int, policies: list[str],
                protocol: Protocol) -> list[dict]:
    """Every cell of one (workload, load): fixed k, the zoo and the oracle, each repeated; ratios and headroom."""
    cells = []
    for k in range(k_max + 1):
        cells.append({"workload": calib.workload, "load": load, "policy": f"fixed:{k}",
                      **repeated_cell(cost, calib, f"fixed:{k}", load, protocol, protocol.fixed_repeats)})
    for spec in policies + ["oracle"]:
        cells.append({"workload": calib.workload, "load": load, "policy": spec,
                      **repeated_cell(cost, calib, spec, load, protocol, protocol.policy_repeats)})
    best = max((c for c in cells if c["policy"].startswith("fixed:")), key=lambda c: c["sim_tok_s"])
    oracle = next(c for c in cells if c["policy"] == "oracle")["sim_tok_s"] / best["sim_tok_s"]
    for c in cells:
        c["sim_ratio"] = round(c["sim_tok_s"] / best["sim_tok_s"], 4)
        c["oracle_ratio"] = round(oracle, 4)
        share = headroom_share(c["sim_ratio"], oracle)
        c["sim_headroom_share"] = None if share is None else round(share, 3)
        c["best_fixed_noise_band"] = best["noise_band"]
    return cells


def pivot(cells: list[dict], workload: str) -> list[str]:
    """One workload as policy x load: % of the best fixed k [share of the oracle's headroom]."""
    loads = sorted({c["load"] for c in cells if c["workload"] == workload})
    by = {(c["policy"], c["load"]): c for c in cells if c["workload"] == workload}
    policies = list(dict.fromkeys(c["policy"] for c in cells if c["workload"] == workload))
    md = ["| policy | " + " | ".join(f"load {x}" for x in loads) + " |", "|---|" + "---:|" * len(loads)]
    for p in policies:
        row = []
        for x in loads:
            c = by.get((p, x))
            share = "" if c is None or c["sim_headroom_share"] is None or p.startswith("fixed:") or p == "oracle" \
                else f" [{c['sim_headroom_share']:+.2f}]"
            row.append("" if c is None else f"{100 * c['sim_ratio']:.1f}{share}")
        md.append(f"| {p} | " + " | ".join(row) + " |")
    bands = [by[(p, x)]["best_fixed_noise_band"] for x in loads for p in ("oracle",) if (p, x) in by]
    md.append("| noise band of the best fixed k | " + " | ".join(f"{100 * b:.1f}%" for b in bands) + " |")
    md.append("| host ms/step, slowest policy | " + " | ".join(
        "{:.2f}".format(max(c["host_ms_per_step"] for c in cells if c["workload"] == workload and c["load"] == x
                            and c["host_ms_per_step"] is not None)) for x in loads) + " |")
    return md


def markdown(result: dict) -> str:
    p = result["protocol"]
    md = ["# Policies in the simulator: the fair-testbed protocol (H200 8B EAGLE-style profile)", "",
          f"Drafting charged per position by the rows still drafting, verification by scheduled tokens; stop rules "
          f"end rows' drafts. Held-out: fit on the calibration half of the prompts, scored on the other. Warm-up "
          f"{p['warmup_steps']} steps and {p['warmup_s']} s, {p['measured_steps']} measured steps and at least "
          f"{p.get('measured_row_steps', 0)} row-steps (steps x load), outputs "
          f"{p['output_len']} tokens, fixed k over {p['fixed_repeats']} seeds, policies and the oracle over "
          f"{p.get('policy_repeats', 1)} (a cell is their mean). Model chain: the "
          f"{p.get('model_trace', 'early-exit')} traces. Host time charged: what an engine waits on"
          f"{' (observe overlapped where a policy allows it)' if p.get('overlap_observe') else ''}. Cells: % of the "
          "best fixed k [headroom share (ratio - 1) / (oracle_ratio - 1)].", ""]
    for w in dict.fromkeys(c["workload"] for c in result["cells"]):
        md += [f"**{w}**", ""] + pivot(result["cells"], w) + [""]
    md += ["| workload | DISCO tau (tuned at batch 1, k_max 10, calibration half) | hybrid-static m (calibration "
           f"half, loads {', '.join(map(str, HYBRID_M_LOADS))}) |", "|---|---|---|"]
    md += [f"| {w} | {c['disco_tau']} | {c.get('hybrid_static_m')} |" for w, c in result["calibration"].items()]
    md += ["", "| workload | load | policy | mean k | sim tok/s | ratio | oracle ratio | headroom share | host ms/step |"
           " host ms critical | noise band |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        md.append(f"| {c['workload']} | {c['load']} | {c['policy']} | {c['sim_mean_k']} | {c['sim_tok_s']:.0f} | "
                  f"{c['sim_ratio']} | {c['oracle_ratio']} | {c['sim_headroom_share']} | {c['host_ms_per_step']} | "
                  f"{c.get('host_ms_critical')} | {c.get('noise_band', '')} |")
    return "\n".join(md + ["", f"Command: `{result['command']}`"]) + "\n"


def split_specs(text: str) -> list[str]:
    """``--policies``: specs separated by ';' when there is one, else by ',', where a part with '=' and no ':' is
    an option of the spec before it (a spec is ``name`` or ``name:option=value``, further options after commas):
    ``fixed:2,controller:per-request,gate=1,ngram=0,disco:variant=threshold`` is three specs, and
    ``controller:per-request,gate=1`` alone one."""
    if ";" in text:
        return [x for x in text.split(";") if x]
    specs: list[str] = []
    for part in (x for x in text.split(",") if x):
        if "=" in part and ":" not in part and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def host_ms(cost: StepCost, spec: str, load: int, steps: int, warmup: int, workload: str) -> tuple[float, float]:
    """Mean host ms per step of one policy after ``warmup`` steps (``--host-ms``, module docstring), and of its
    part on the critical path of an engine that overlaps the observe of a policy that allows it (``run_cell``)."""
    w = dataclasses.replace(workload_preset(workload), output_len=10**6, prompt_len_mean=0.0)
    duration_s = (steps + warmup) * cost.step_ms(load, 7) / 1e3  # at least this many steps
    cfg = SimConfig(duration_s=duration_s, load=load, max_num_seqs=max(load, 128))
    replay, ngram_replay = load_paired_traces(*trace_files("early-exit", workload))
    sim = Simulator(cost, Schedule.constant(w), cfg, replay=replay, ngram_replay=ngram_replay)
    policy = timed(make_policy(spec, sim.context()))
    sim.run(policy)
    return policy.mean_ms(warmup), charged_ms(policy, slice(warmup, None), Protocol.overlap_observe)


def host_ms_table(args, command: str) -> int:
    """``--host-ms``: every policy at each load and workload, the minimum over ``--repeats`` runs."""
    cost, rows = h200_cost(), []
    for workload in args.workloads.split(","):
        for load in (int(x) for x in args.loads.split(",")):
            for spec in split_specs(args.policies):
                runs = [host_ms(cost, spec, load, args.measured_steps, args.warmup_steps, workload)
                        for _ in range(args.repeats)]
                ms, critical = min(r[0] for r in runs), min(r[1] for r in runs)
                rows.append({"policy": spec, "workload": workload, "load": load, "host_ms_per_step": round(ms, 4),
                             "host_ms_critical": round(critical, 4), "within_budget": ms < HOST_BUDGET_MS})
                print(f"{spec:24s} {workload} b={load:4d} host {ms:7.3f} ms/step, critical {critical:7.3f}"
                      f"{'' if ms < HOST_BUDGET_MS else '  OVER 0.3 ms'}", flush=True)
    if args.out:
        fileio.write_json(args.out + ".json", {"schema": "tabletune.policy_host_ms", "version": 1, "command": command,
                                               "budget_ms": HOST_BUDGET_MS, "rows": rows})
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-ms", action="store_true", help="time each policy's host ms per step instead of the grid")
    ap.add_argument("--workloads", default=None, help="grid: code,code-edit,chat; --host-ms: code")
    ap.add_argument("--loads", default=None, help="grid: 1,2,4,8,16,32,64,128; --host-ms: 128")
    ap.add_argument("--policies", default=None,
                    help="grid: the zoo; --host-ms: fixed:3 and the zoo (';'-separated when a spec has options)")
    ap.add_argument("--warmup-steps", type=int, default=None, help=f"grid: {Protocol.warmup_steps}; --host-ms: 50")
    ap.add_argument("--warmup-s", type=float, default=Protocol.warmup_s)
    ap.add_argument("--measured-steps", type=int, default=None, help=f"grid: {Protocol.measured_steps}; --host-ms: 200")
    ap.add_argument("--measured-row-steps", type=int, default=Protocol.measured_row_steps,
                    help="grid: measured steps at load b at least this / b")
    ap.add_argument("--repeats", type=int, default=3, help="--host-ms: runs per policy (the minimum is reported)")
    ap.add_argument("--output-len", type=int, default=Protocol.output_len)
    ap.add_argument("--fixed-repeats", type=int, default=Protocol.fixed_repeats)
    ap.add_argument("--policy-repeats", type=int, default=Protocol.policy_repeats)
    ap.add_argument("--model-trace", default=Protocol.model_trace, choices=sorted(NGRAM_PARTNER),
                    help="the model chain's traces: early-exit (SmolLM2's, every workload) or eagle (the trained "
                         "head's: code, code-edit, chat, chat-ifeval)")
    ap.add_argument("--resume", action="store_true", help="keep the (workload, load) groups already in OUT.json")
    ap.add_argument("--out", default=None, help="grid: OUT.json and OUT.md (default benchmarks/results/"
                    "engine_policies_sim); --host-ms: OUT.json (default none)")
    args = ap.parse_args(argv)
    command = "python benchmarks/policies_sim.py " + " ".join(argv if argv is not None else sys.argv[1:])
    host = args.host_ms
    args.workloads = args.workloads or ("code" if host else "code,code-edit,chat")
    args.loads = args.loads or ("128" if host else "1,2,4,8,16,32,64,128")
    args.policies = args.policies if args.policies is not None else ",".join(HOST_ZOO if host else ZOO)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (50 if host else Protocol.warmup_steps)
    args.measured_steps = args.measured_steps or (200 if host else Protocol.measured_steps)
    if host:
        return host_ms_table(args, command)
    args.out = args.out or "benchmarks/results/engine_policies_sim"
    protocol = Protocol(args.warmup_steps, args.warmup_s, args.measured_steps, args.output_len,
                        fixed_repeats=args.fixed_repeats, policy_repeats=args.policy_repeats,
                        model_trace=args.model_trace, measured_row_steps=args.measured_row_steps)
    cost = h200_cost()
    k_max = cost.k_max
    policies = split_specs(args.policies) if args.policies else []
    key = {"protocol": dataclasses.asdict(protocol), "policies": policies, "k_max": k_max}
    out_json = Path(args.out + ".json")
    old = json.loads(out_json.read_text()) if args.resume and out_json.exists() else None
    if old is not None and old["key"] != key:
        print("refused: --resume over results of another protocol or policy list", flush=True)
        return 2
    result = {"schema": "tabletune.engine_policies_sim", "version": 1, "key": key, "command": command,
              "protocol": dataclasses.asdict(protocol), "cost": "H200 qwen3-8b EAGLE-style ctx1024, D = eagle - ngram",
              "calibration": old["calibration"] if old else {}, "cells": old["cells"] if old else []}
    done = {(c["workload"], c["load"]) for c in result["cells"]}
    with tempfile.TemporaryDirectory() as tmp:  # the calibrated files live for the run (their figures go to OUT)
        run_grid(args, result, done, cost, Path(tmp), policies, protocol)
    return 0


def run_grid(args, result: dict, done: set, cost: StepCost, folder: Path, policies: list[str],
             protocol: Protocol) -> None:
    out_json, k_max = Path(args.out + ".json"), cost.k_max
    for name in args.workloads.split(","):
        t0 = time.perf_counter()
        calib = calibrate(name, k_max, cost, folder, protocol)
        result["calibration"][name] = {k: v for k, v in dataclasses.asdict(calib).items()
                                       if k not in ("disco_model", "ngram_table")}
        print(f"{name}: calibrated (DISCO tau {calib.disco_tau}, hybrid-static m {calib.hybrid_static_m}) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        for load in (int(x) for x in args.loads.split(",")):
            if (name, load) in done:
                continue
            t0 = time.perf_counter()
            cells = group_cells(cost, calib, load, k_max, policies, protocol)
            result["cells"] += cells
            fileio.write_json(str(out_json), result)  # checkpoint after every (workload, load)
            fileio.write_text(args.out + ".md", markdown(result))
            best = max((c for c in cells if c["policy"].startswith("fixed:")), key=lambda c: c["sim_tok_s"])
            print(f"{name} load {load}: best {best['policy']} (band {best['noise_band']:.1%}), oracle "
                  f"{cells[0]['oracle_ratio']}, " + ", ".join(f"{c['policy']} {c['sim_ratio']}" for c in cells
                                                         if not c['policy'].startswith('fixed:')) +
                  f" ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
