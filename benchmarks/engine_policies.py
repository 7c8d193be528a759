"""Every policy of the zoo on the built-in engine with ragged steps, against the simulator on the same data.

Target: a random-weight shape (default the Qwen3-8B shape) made predictable
(``engine_serving.make_predictable``); drafts: its own greedy continuation, replayed
through the forced-rejection cap with a real drafter's per-token trace
(``tabletune.engine.trace_replay``): per workload (code, code-edit, chat) the
early-exit trace of SmolLM2 is the model chain (its signals reach the policies)
and the n-gram trace the n-gram chain (Hybrid Spark's second drafter).

1. T(b, k) of uniform steps at the mean serving context (the step profile).
2. Mixed-k check: ragged steps of measured k_1..k_b against ``StepCost.mixed_ms``
   at the simulator's draft share (0.5) and at the share fitted to them; and the
   cost of a split step (draft, signals to the host, verify) over a fused one.
3. Serving: closed loop at each load for every policy, each cell also as a ratio
   to the best fixed k of its (workload, load). The protocol of ``policies_sim``:
   rules fit on the calibration half of the prompts and scored on the other
   (the engine replays the scoring half only), a warm-up of ``--warmup-steps``
   (the window also starts after the first wave was replaced), at least
   ``--measured-steps`` measured steps, outputs of ``--output-len`` tokens,
   fixed-k cells repeated ``--fixed-repeats`` times (mean and noise band), and
   per cell ``host_ms_per_step`` (decide + keep_drafting + observe, wall clock)
   beside the mean step wall time, so host and device time read apart, and
   ``host_ms_critical`` (host time the device waited on: from each read to the next
   replay, the scheduler's own included) beside ``host_ms_overlapped`` (an observe
   run while the next step runs, ``--overlap-observe``).
4. The same grid in the simulator (``policies_sim.repeated_cell``: each cell the mean of the protocol's
   ``policy_repeats`` seeds, the expectation a single measured run scatters around): the measured
   profile (with the draft share and the drafting rule, rows still drafting or every
   row, fitted to the ragged steps, ``tabletune.cost``), the scoring half of the same traces replayed, the
   measured prefill cost, and per step the host time the engine waited on for the policy beyond a fixed k's
   (``charged_host_ms``); per cell the simulated ratio and its difference from the measured one. The headroom oracle (``tabletune.sim.oracle``) runs in the
   simulator: per cell ``oracle_ratio`` and each policy's share of that headroom.

5. ``--switch`` (instead of 1-4's grid, after the profile): two waves of code requests, then ``--rounds`` waves of
   chat, closed loop through one engine at each load, for the code-tuned table (stale), the table per phase
   (oracle: the chat-tuned table from the first chat admission), ``controller`` and ``controller:per-request``
   (both from code's prior); throughput per window of ``--window-steps`` steps, and per load the share of the
   stale table's loss recovered over the first 3 windows from the switch, (policy - stale) / (oracle - stale).

Results go to OUT.json / OUT.md, rewritten after every cell (``--resume`` skips
the cells already there when the fingerprint matches). A grid whose estimated time
exceeds ``--budget-s`` is refused before anything is measured.

Step timing in ``engine_timing.py``, the switch in ``engine_switch.py``, the simulator side in ``engine_grid_sim.py``.

    python benchmarks/engine_policies.py --workloads code --out benchmarks/results/engine_policies     # GPU
    python benchmarks/engine_policies.py --quick --out out/engine_policies                              # CPU
    python benchmarks/engine_policies.py --switch --loads 8,32 --max-load 32 --out benchmarks/results/engine_switch
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_grid_sim import (GridGroup, add_ratios, commands_of, grid_inputs, markdown, oracle_cell,  # noqa: E402
                             protocol_of, sim_only, simulate_cell, trace_offset, workload_data)
from engine_serving import make_predictable, staggered_len, window_start  # noqa: E402
from engine_switch import serve_switch  # noqa: E402
from engine_timing import (draft_profile, engine_cost, measure_profile, mixed_check, plan_check,  # noqa: E402
                           pricing, probe_step_ms)
from policies_sim import (NGRAM_PARTNER, Protocol, calibrate, explore_steps, gate_state, split_specs,  # noqa: E402
                          workload_preset)

from tabletune import fileio  # noqa: E402
from tabletune.cost import StepCost  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import resolve  # noqa: E402
from tabletune.engine.profiling import ENGINE_VERSION, RUNNER, device_name  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, policy_context, steady_throughput  # noqa: E402
from tabletune.engine.trace_replay import TracedReplayDrafter  # noqa: E402
from tabletune.padding import geometric_batch_sizes  # noqa: E402
from tabletune.policies import REGISTRY, make_policy  # noqa: E402
from tabletune.policies.timed import timed  # noqa: E402
from tabletune.profile import Fingerprint, StepProfile  # noqa: E402
from tabletune.sim.traces import signal_noise_for_auc  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402

ZOO = ("tabletune", "controller", "controller:per-request", "vllm-av", "turbospec", "nightjar", "sglang", "disco", "tapout", "dsde", "gammatune",
       "adaptive-verification", "hybrid-spark", "hybrid-static")
QUICK = {"model": "tiny", "device": "cpu", "loads": "1,2", "workloads": "code", "k_max": 3, "prompt_len": 8,
         "output_len": 16, "rounds": 2, "max_load": None, "profile_steps": 2, "warmup_steps": 2, "measured_steps": 4,
         "fixed_repeats": 2, "policies": "tabletune,gammatune,disco,hybrid-spark", "measured_row_steps": 0}
HOST_MS_PER_STEP = 1.0  # the estimate's host time a step (policy, bookkeeping) on top of the step's device time


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--loads", default="1,4,16,64,128")
    ap.add_argument("--max-load", type=int, default=None,
                    help="the engine's largest batch bucket (default: the largest load; keep it across --resume calls)")
    ap.add_argument("--workloads", default="code,code-edit,chat")
    ap.add_argument("--policies", default=",".join(ZOO),
                    help="besides fixed:0..k_max: specs, comma-separated (a spec's options with it) or ';'-separated")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=8, help="requests per cell = rounds * load (at least 4)")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--warmup-steps", type=int, default=200, help="steps of each cell before its window")
    ap.add_argument("--measured-steps", type=int, default=500, help="fewest measured steps a cell should have")
    ap.add_argument("--measured-row-steps", type=int, default=2000,
                    help="and fewest measured row-steps (steps x load): 2,000 / load steps below load 4 (500 steps "
                         "at load 1 hold about 4 requests: the simulator's seeds put per-request at code-edit 1 13%% "
                         "apart, 2.6%% over 2,000)")
    ap.add_argument("--fixed-repeats", type=int, default=3, help="runs of each fixed-k cell (noise band)")
    ap.add_argument("--all-fixed", action="store_true",
                    help="measure every fixed k (default: the modelled best k, then the best measured k's neighbours "
                         "until both are measured)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="refuse a grid whose serving part is estimated to take longer (set-up comes first)")
    ap.add_argument("--overlap-observe", action="store_true",
                    help="policies that allow it (observe_may_lag) observe step t while step t + 1 runs")
    ap.add_argument("--host-stop", action="store_true", help="stop rules on the host even where the device can")
    ap.add_argument("--model-trace", default="early-exit", choices=sorted(NGRAM_PARTNER),
                    help="the model chain's traces: early-exit (every workload) or eagle (the trained head's), each "
                         "paired with its n-gram partner (policies_sim.trace_files)")
    ap.add_argument("--no-sim", action="store_true", help="measure only (simulate later with --sim-only)")
    ap.add_argument("--sim-only", action="store_true", help="simulate every cell of OUT.json afresh (CPU)")
    ap.add_argument("--resume", action="store_true", help="keep the cells of OUT.json (same fingerprint)")
    ap.add_argument("--remeasure", default="",
                    help="with --resume: these of --policies (';'-separated) are measured again at this call's "
                         "workloads and loads, their old cells dropped (a policy whose code changed)")
    ap.add_argument("--switch", action="store_true",
                    help="instead of the grid: code then chat requests through one engine at each load (OUT.json/.md)")
    ap.add_argument("--window-steps", type=int, default=100, help="--switch: steps a throughput window")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shape, tiny grid")
    ap.add_argument("--out", default="benchmarks/results/engine_policies")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
        args.window_steps = 4
    elif args.output_len < 512 or args.measured_steps < 500:
        ap.error("the protocol needs --output-len >= 512 and --measured-steps >= 500 (use --quick for a smoke run)")
    elif args.rounds < 3:
        # the window runs from the first wave's last replacement to the last full-load step: with 2 rounds the
        # second wave's first finisher ends it about where it starts, and a cell measures a handful of steps
        ap.error(f"--rounds {args.rounds}: at least 3 (the steady window needs a third wave)")
    return args


def policy_names(args) -> list[str]:
    """fixed:0..k_max, then the zoo; a name not in the registry (e.g. sglang before it lands) is skipped."""
    out = [f"fixed:{k}" for k in range(args.k_max + 1)]
    for name in split_specs(args.policies):
        if name.partition(":")[0].partition(",")[0] in REGISTRY:
            out.append(name)
        else:
            print(f"policy {name!r} is not registered: skipped", flush=True)
    return out


def cell_run_s(args, step_ms: float) -> float:
    """Wall estimate of one run of a cell: it stops once its window is complete, ~ max(warm-up, output_len / 2) +
    measured steps (the mean over ``--loads`` of the window: ``--measured-steps``, or ``--measured-row-steps`` /
    load where more), at ``step_ms``."""
    protocol = Protocol(measured_steps=args.measured_steps, measured_row_steps=getattr(args, "measured_row_steps", 0))
    window = statistics.fmean(protocol.window_steps(int(b)) for b in args.loads.split(","))
    steps = max(args.warmup_steps, args.output_len / 2.0) + window
    return steps * (step_ms + HOST_MS_PER_STEP) / 1e3


def fixed_runs(args) -> int:
    """Runs of the fixed-k cells of one group: all k_max + 1 with ``--all-fixed``, else about 3, each
    ``fixed_repeats`` times."""
    fixed = args.k_max + 1 if getattr(args, "all_fixed", False) else min(3, args.k_max + 1)
    return fixed * getattr(args, "fixed_repeats", 1)


def estimate_s(args, step_ms: float, num_policies: int, num_loads: int, num_workloads: int) -> float:
    """Wall estimate: ``num_policies`` (the fixed ks among them) at each load and workload (``cell_run_s``,
    ``fixed_runs``), and the step profile."""
    runs = (num_policies - (args.k_max + 1) + fixed_runs(args)) * num_loads * num_workloads
    profile = (args.profile_steps + 2) * (args.k_max + 1) * len(geometric_batch_sizes(max(
        int(x) for x in args.loads.split(","))))
    return runs * cell_run_s(args, step_ms) + profile * step_ms / 1e3


def cells_to_measure(policies: list[str], workloads: list[str], loads: list[int], done: set) -> tuple[int, int]:
    """What this call will measure: (policy cells not in ``done``, groups without a fixed-k cell yet: each measures
    its fixed ks, about 3, or k_max + 1 with ``--all-fixed``)."""
    rest = [p for p in policies if not p.startswith("fixed:")]
    groups = [(w, load) for w in workloads for load in loads]
    with_fixed = {(w, load) for w, load, p in done if p.startswith("fixed:")}
    return sum((w, load, p) not in done for w, load in groups for p in rest), len(set(groups) - with_fixed)


def modelled_fixed_k(cost: StepCost, rates, load: int, k_max: int) -> int:
    """The fixed k of the largest modelled throughput E[tokens | k] / T(b, k), E = 1 + sum_{j<=k} prod_{l<=j} a_l."""
    gains = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(np.asarray(rates[:k_max], float)))])
    return int(np.argmax([gains[k] / cost.step_ms(load, k) for k in range(k_max + 1)]))


def next_fixed_k(measured: dict[int, float], start: int, k_max: int) -> int | None:
    """The fixed k to measure next (None: done), given tok/s by k measured so far: ``start`` first, then the
    neighbours of the best measured k until both are measured. Throughput is unimodal in k (E[tokens | k] grows by
    ever smaller survivals, T(b, k) by about the same time a position), so the best k measured with both neighbours
    below it is the best of 0..k_max, up to the noise band."""
    if not measured:
        return start
    best = max(measured, key=measured.__getitem__)
    return next((k for k in (best - 1, best + 1) if 0 <= k <= k_max and k not in measured), None)


def fixed_specs(args, wname: str, load: int, cost: StepCost, rates, cells: list[dict]):
    """The fixed-k specs of one (workload, load) to measure, in order (``--all-fixed``: every k; else the search of
    ``next_fixed_k`` from ``modelled_fixed_k``, reading the cells measured so far each time)."""
    if args.all_fixed:
        yield from (f"fixed:{k}" for k in range(args.k_max + 1))
        return
    start = modelled_fixed_k(cost, rates, load, args.k_max)
    while True:
        measured = {int(c["policy"].removeprefix("fixed:")): c["throughput_tok_s"] for c in cells
                    if c["workload"] == wname and c["load"] == load and c["policy"].startswith("fixed:")
                    and c.get("throughput_tok_s")}
        k = next_fixed_k(measured, start, args.k_max)
        if k is None:
            return
        yield f"fixed:{k}"


def serve_cell(engine, args, policy_spec, ctx, load, prompts, oracle, pairs, seed: int = 0) -> dict:
    """One engine run: the window starts after the first wave was replaced and after ``--warmup-steps``."""
    measured = protocol_of(args).window_steps(load)
    # enough requests for the warm-up and the window at up to k_max + 1 tokens a row-step
    n = min(len(prompts), max(4, args.rounds * load,
                              -(-(args.warmup_steps + measured) * load * (args.k_max + 1) // args.output_len)))
    reqs = [Request(list(prompts[i]), staggered_len(i, load, args.output_len), i, oracle=oracle[i],
                    trace=pairs[i % len(pairs)], trace_offset=trace_offset(i, pairs[i % len(pairs)]))
            for i in range(n)]
    policy = timed(make_policy(policy_spec, ctx))

    window: list[int] = []  # its start, once the first wave was replaced (found once: this runs every step)

    def window_done(stats) -> bool:  # the first wave replaced, the warm-up and the measured steps run
        if not window:
            if any(i not in stats.replaced_at_step for i in range(load)):
                return False
            window.append(max(window_start(stats, load), args.warmup_steps))
        return len(stats.step_batch_sizes) >= window[0] + measured

    stats = Scheduler(engine, policy, max_num_seqs=load, seed=load + 1000 * seed, device_stop=not args.host_stop,
                      overlap_observe=args.overlap_observe).run(reqs, stop=window_done)
    end = max(i for i, b in enumerate(stats.step_batch_sizes) if b == load) + 1
    start = min(max(window_start(stats, load), args.warmup_steps), end - 1)
    adm = sum(stats.step_admitted[start:end])
    wall_ms = 1e3 * sum(stats.step_wall_s[start:end]) / max(end - start, 1)
    return {"throughput_tok_s": round(steady_throughput(stats.step_batch_sizes, stats.step_wall_s,
                                                        stats.step_tokens, load, start), 2),
            "mean_k": round(sum(stats.step_drafts[start:end]) / max(sum(stats.step_batch_sizes[start:end]), 1), 3),
            # drafted positions a row (fused: every row drafts the step's longest draft), against mean_k verified
            "drafted_per_row": round(sum(stats.step_drafted[start:end])
                                     / max(sum(stats.step_batch_sizes[start:end]), 1), 3),
            "explore_steps": explore_steps(policy), **gate_state(policy),
            "num_steps": stats.num_steps, "window_start": start, "measured_steps": end - start,
            "step_ms": round(wall_ms, 4), "host_ms_per_step": round(policy.mean_ms(start), 4),
            "host_ms_critical": round(1e3 * statistics.fmean(stats.step_host_critical_s[start:end] or [0.0]), 4),
            # the median beside the mean: a mean far above it is spikes (a collection, the OS), not every step's work
            "host_ms_critical_median": round(1e3 * statistics.median(stats.step_host_critical_s[start:end] or [0.0]),
                                             4),
            "host_ms_overlapped": round(1e3 * statistics.fmean(stats.step_host_overlapped_s[start:end] or [0.0]), 4),
            # parts of host_ms_critical: the scheduler's bookkeeping and the policy's decide
            "host_ms_bookkeeping": round(1e3 * statistics.fmean(stats.step_host_bookkeeping_s[start:end] or [0.0]), 4),
            "host_ms_decide": round(1e3 * statistics.fmean(stats.step_host_decide_s[start:end] or [0.0]), 4),
            # and their medians: a part slow on every step, or on a few
            "host_ms_bookkeeping_median": round(1e3 * statistics.median(stats.step_host_bookkeeping_s[start:end]
                                                                        or [0.0]), 4),
            "host_ms_decide_median": round(1e3 * statistics.median(stats.step_host_decide_s[start:end] or [0.0]), 4),
            # steps launched before the last one's read-back (a policy that decides ahead: ``Scheduler.launch_ahead``)
            "ahead_share": round(sum(stats.step_ahead[start:end]) / max(end - start, 1), 4),
            # steps decided on the lookup after the last read-back, and the critical time of those and of the rest
            # (a policy that does both, the gated per-request controller, is charged by step in the simulator)
            **lookup_split(stats, start, end),
            "prefill_ms_per_token": round(1e3 * sum(stats.step_prefill_s[start:end]) / (adm * args.prompt_len), 5)
            if adm else None,
            "rates": [None if r is None else round(r, 4) for r in stats.counts.rates()],
            **step_residuals(stats, ctx.cost, start, end)}


def step_residuals(stats, cost, start: int, end: int) -> dict:
    """What the cost model leaves out of the window's steps: each step's wall time (its prefills aside) minus
    ``cost.mixed_ms`` of the ks it verified and the positions its rows drafted, the mean over fused and over split
    steps (ms; None where there is none), the critical host time in each (part of that residual: the cost model
    prices device time), and the share of steps that split."""
    fused, split, host = [], [], ([], [])
    for i in range(start, end):
        ks, drafted = stats.step_rows[i]
        measured_ms = 1e3 * (stats.step_wall_s[i] - stats.step_prefill_s[i])
        (split if stats.step_split[i] else fused).append(measured_ms - cost.mixed_ms(ks, drafted, drafted < ks))
        host[stats.step_split[i]].append(1e3 * stats.step_host_critical_s[i])
    return {"residual_ms_fused": round(statistics.fmean(fused), 4) if fused else None,
            "residual_ms_split": round(statistics.fmean(split), 4) if split else None,
            # of which the host time the device waited on
            "host_ms_critical_fused": round(statistics.fmean(host[0]), 4) if host[0] else None,
            "host_ms_critical_split": round(statistics.fmean(host[1]), 4) if host[1] else None,
            "split_share": round(len(split) / max(end - start, 1), 4)}


def serve_fixed(engine, args, spec, ctx, load, prompts, oracle, pairs) -> dict:
    """A fixed-k cell run ``--fixed-repeats`` times: the mean tok/s, every run's, and the band (max - min) / mean."""
    runs = [serve_cell(engine, args, spec, ctx, load, prompts, oracle, pairs, seed)
            for seed in range(args.fixed_repeats)]
    tok = [r["throughput_tok_s"] for r in runs]
    mean = statistics.fmean(tok)
    return {**runs[0], "throughput_tok_s": round(mean, 2), "throughput_repeats": tok,
            "noise_band": round((max(tok) - min(tok)) / mean, 4) if mean else None}


def lookup_split(stats, start: int, end: int) -> dict:
    """``lookup_share`` of steps start..end-1 decided on the lookup after the last read-back
    (``RunStats.step_looked_up``), and the mean critical host ms of those (``host_ms_critical_lookup``) and of the
    rest (``host_ms_critical_other``; None where there is none)."""
    looked = stats.step_looked_up[start:end]
    crit = stats.step_host_critical_s[start:end]
    parts = [[1e3 * c for c, flag in zip(crit, looked) if flag == want] for want in (True, False)]
    return {"lookup_share": round(len(parts[0]) / max(end - start, 1), 4),
            "host_ms_critical_lookup": round(statistics.fmean(parts[0]), 4) if parts[0] else None,
            "host_ms_critical_other": round(statistics.fmean(parts[1]), 4) if parts[1] else None}


def grid_groups(grid: str, groups: list[tuple[str, int]]) -> Iterator[GridGroup]:
    """Each (workload, load) of ``groups`` of the measured grid ``grid`` (OUT, OUT.json read: ``grid_inputs``),
    each workload calibrated once on the calibration half."""
    args = parse_args(["--sim-only", "--out", grid])
    result, cost = grid_inputs(args)
    cells = result["cells"]
    with tempfile.TemporaryDirectory() as tmp:
        calibs: dict = {}
        for w, load in groups:
            if w not in calibs:
                calibs[w] = calibrate(w, args.k_max, cost, Path(tmp), protocol_of(args))
            best = max(c["sim_tok_s"] for c in cells if c["workload"] == w and c["load"] == load
                       and c["policy"].startswith("fixed:") and c.get("sim_tok_s"))
            yield GridGroup(w, load, cost, calibs[w], args, cells, best)


def serve_workload(engine, args, wname, loads, policies, cost, result, done, prompts, oracle,
                   folder: Path) -> None:
    """Every cell of one workload, checkpointed after each; the (simulated) oracle closes each load."""
    out_json = Path(args.out + ".json")
    data = workload_data(wname, args.k_max, args.model_trace)
    calib = calibrate(wname, args.k_max, cost, folder, protocol_of(args))  # the calibration half
    data["signal_noise"] = signal_noise_for_auc(data["top1_auc"], workload_preset(wname), args.k_max, 2000)
    result["workloads"][wname] = {"rates": calib.rates, "ngram_rates": calib.ngram_rates[:9],
                                  "disco_tau": calib.disco_tau, "hybrid_static_m": calib.hybrid_static_m,
                                  "top1_auc": round(data["top1_auc"], 4),
                                  "span_start_prob": round(data["span_start_prob"], 5),
                                  "span_mean_len": round(data["span_mean_len"], 3),
                                  "signal_noise": round(data["signal_noise"], 4)}
    ctx = policy_context(engine, cost, calib.rates, calib.ngram_rates)
    rest = [p for p in policies if not p.startswith("fixed:")] + ([] if args.no_sim else ["oracle"])
    for load in loads:
        for spec in itertools.chain(fixed_specs(args, wname, load, cost, calib.rates, result["cells"]), rest):
            if (wname, load, spec) in done:
                continue
            t0 = time.perf_counter()
            if spec == "oracle":
                cell = oracle_cell(cost, calib, args, load, result["cells"])
            else:
                serve = serve_fixed if spec.startswith("fixed:") else serve_cell
                cell = {"workload": wname, "load": load, "policy": spec, "engine_version": ENGINE_VERSION,
                        "pricing": pricing(result),
                        **serve(engine, args, calib.spec(spec), ctx, load, prompts, oracle, data["pairs"])}
                if not args.no_sim:
                    cell.update(simulate_cell(cost, calib, args, spec, load, cell, result["cells"]))
            result["cells"].append(cell)
            add_ratios(result["cells"])
            fileio.write_json(str(out_json), result)  # checkpoint: a cut run keeps its cells
            fileio.write_text(args.out + ".md", markdown(result))
            print(f"{wname:9s} load {load:4d} {spec:24s} tok/s {cell['throughput_tok_s']} ratio {cell['ratio']} "
                  f"sim {cell['sim_ratio']} host {cell.get('host_ms_per_step')} ms, critical "
                  f"{cell.get('host_ms_critical')} (bookkeeping {cell.get('host_ms_bookkeeping')}, decide "
                  f"{cell.get('host_ms_decide')}) ({time.perf_counter() - t0:.1f} s)", flush=True)


def greedy_outputs(engine: SpecEngine, args, prompts: list[list[int]], resume: bool) -> list[list[int]]:
    """The target's greedy continuation of every prompt (what the replayed drafts copy), at k = 0; kept beside
    OUT.json as OUT.greedy.npy, and read back under ``--resume`` (same fingerprint: same weights, same outputs)."""
    path = Path(args.out + ".greedy.npy")
    n_new = args.output_len + args.k_max + 2
    if resume and path.exists():
        saved = np.load(path)
        if saved.shape == (len(prompts), n_new):
            return [row.tolist() for row in saved]
    record = [Request(p, n_new, i) for i, p in enumerate(prompts)]
    Scheduler(engine, DraftTable.fixed(0)).run(record)
    out = np.array([r.output for r in record], np.int64)
    with fileio.atomic_path(path) as tmp:  # suffix .npy kept: np.save adds none
        np.save(tmp, out)
    return [row.tolist() for row in out]


def compatible(key: dict) -> dict:
    """A file's key with the engine's version cut to major.minor: a patch release runs fused steps as before, so
    --resume keeps the cells of another patch (each cell records the version it ran on); without the row-steps a
    window holds (each cell records its steps, and ``short_window`` ones are measured again)."""
    fp = key["fingerprint"]
    rest = {k: v for k, v in key.items() if k != "measured_row_steps"}
    return {**rest, "fingerprint": {**fp, "engine_version": ".".join(fp["engine_version"].split(".")[:2])}}


def short_window(cell: dict, protocol: Protocol) -> bool:
    """A measured cell whose window holds less than 90% of the steps ``protocol`` asks at its load."""
    return cell.get("measured_steps") is not None and cell["measured_steps"] < 0.9 * protocol.window_steps(cell["load"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sim_only:
        return sim_only(args)
    command = "python benchmarks/engine_policies.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    loads = [int(x) for x in args.loads.split(",")]
    workloads = args.workloads.split(",")
    policies = policy_names(args)
    again = split_specs(args.remeasure)  # policies whose cells of this call are measured anew
    unknown = [name for name in again if name not in policies]
    if unknown:
        print(f"refused: --remeasure {unknown[0]!r} is not one of --policies", flush=True)
        return 2
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    t_start = time.perf_counter()
    target = Decoder(resolve(args.model), torch.bfloat16 if cuda else torch.float32, args.device)
    make_predictable(target)
    t_model = time.perf_counter()
    max_load = args.max_load or max(loads)
    if max_load < max(loads):
        print(f"refused: --max-load {max_load} below the largest load {max(loads)}", flush=True)
        return 2
    cfg = EngineConfig(max_num_seqs=max_load, max_len=args.prompt_len + args.output_len + args.k_max + 16,
                       k_max=args.k_max, buckets=tuple(geometric_batch_sizes(max_load)), split_steps=True)
    engine = SpecEngine(target, TracedReplayDrafter(), cfg)
    print(f"start-up: target {t_model - t_start:.0f} s, engine and its {len(engine.graphs)} graphs "
          f"{time.perf_counter() - t_model:.0f} s", flush=True)
    step_ms = probe_step_ms(engine, args, loads)
    est = estimate_s(args, step_ms, len(policies), len(loads), len(workloads))
    if not args.switch:
        print(f"estimate {est:.0f} s for {len(policies)} policies x {len(loads)} loads x {len(workloads)} workloads "
              f"(probe step {step_ms:.2f} ms)", flush=True)
    if est > args.budget_s and not args.switch:
        print(f"refused: the grid needs ~{est:.0f} s > --budget-s {args.budget_s:.0f}; run fewer --workloads or "
              "--policies per call (with --resume)", flush=True)
        return 2
    fp = Fingerprint(engine="builtin", engine_version=ENGINE_VERSION, device=device_name(engine),
                     model=f"{args.model} (shape, random weights)", dtype=str(target.dtype).removeprefix("torch."),
                     runner=RUNNER + "+ragged", drafter="trace-replay", command=command)
    key = {"fingerprint": {k: v for k, v in fp.__dict__.items() if k != "command"}, "switch": args.switch,
           "window_steps": args.window_steps if args.switch else None, "k_max": args.k_max,
           "prompt_len": args.prompt_len, "output_len": args.output_len, "rounds": args.rounds, "max_load": max_load,
           "warmup_steps": args.warmup_steps, "measured_steps": args.measured_steps,
           "measured_row_steps": args.measured_row_steps,
           "fixed_repeats": args.fixed_repeats, "overlap_observe": args.overlap_observe, "host_stop": args.host_stop,
           "model_trace": args.model_trace}
    out_json = Path(args.out + ".json")
    old = json.loads(out_json.read_text()) if args.resume and out_json.exists() else None
    if old is not None and compatible(old["key"]) != compatible(key):
        print("refused: --resume over results of another setting (fingerprint or grid differs)", flush=True)
        return 2
    if old is not None:
        profile = StepProfile.from_json(old["profile"], str(out_json))
        mixed = old["mixed_check"]
    else:
        profile = measure_profile(engine, args, fp)
        mixed = mixed_check(engine, profile, args, loads)
    drafts = old.get("draft_profile") if old is not None else None
    if drafts is None:
        t0 = time.perf_counter()
        drafts = draft_profile(engine, profile, args)
        print(f"draft profile: {time.perf_counter() - t0:.0f} s", flush=True)
    cost = engine_cost(profile, mixed, drafts)
    plans = old.get("plan_check") if old is not None else None
    if (plans is None or any("read_ms" not in r for r in plans["rows"])) and not args.switch:
        t0 = time.perf_counter()
        plans = plan_check(engine, cost, args, max_load)  # measured afresh where an older run lacks the read timing
        print(f"plan check: {time.perf_counter() - t0:.0f} s, split extra by b {plans['split_extra_ms']}, read extra "
              f"{plans['read_extra_ms']}, each further read {plans['position_read_extra_ms']}", flush=True)
    cost = engine_cost(profile, mixed, drafts, plans)  # the policies' and the simulator's: split steps' extra too
    rng = random.Random(0)
    prompts = [[rng.randrange(target.cfg.vocab_size) for _ in range(args.prompt_len)]
               for _ in range(max(4, args.rounds * max_load))]
    oracle = greedy_outputs(engine, args, prompts, resume=old is not None)
    # what the set-up made (weights, graphs, buffers, traces) lives as long as the process: frozen, a collection
    # never scans it again, so a cycle collection inside a step's critical host stretch costs what serving allocated
    # (vLLM's workers freeze after start-up for the same reason)
    gc.collect()
    gc.freeze()
    try:
        if args.switch:
            return serve_switch(engine, args, cost, loads, prompts, oracle, key, command, fp, profile, mixed, drafts,
                                old)
        version = old["key"]["fingerprint"]["engine_version"] if old else None  # of the cells kept
        result = {"schema": "tabletune.engine_policies", "version": 2, "key": key, "device": fp.device,
                  "model": args.model, "prompt_len": args.prompt_len, "output_len": args.output_len,
                  "command": command, "commands": commands_of(old, command), "profile": profile.to_json(),
                  "mixed_check": mixed, "draft_profile": drafts, "plan_check": plans,
                  "cells": [c if c["policy"] == "oracle" else {"engine_version": version, **c}
                            for c in old["cells"]] if old else [],
                  "workloads": old.get("workloads", {}) if old else {}}
        protocol = protocol_of(args)
        ours = [c["workload"] in workloads and c["load"] in loads for c in result["cells"]]
        short = sum(mine and short_window(c, protocol) for c, mine in zip(result["cells"], ours))
        if short:
            print(f"measured again: {short} cells of this call's groups whose window is short of the protocol's "
                  f"({args.measured_row_steps} row-steps)", flush=True)
        result["cells"] = [c for c, mine in zip(result["cells"], ours)
                           if not (mine and (c["policy"] in again or short_window(c, protocol)))]
        done = {(c["workload"], c["load"], c["policy"]) for c in result["cells"]}
        cells, bare = cells_to_measure(policies, workloads, loads, done)
        todo_s = cell_run_s(args, step_ms) * (cells + bare * fixed_runs(args))
        print(f"this call: {cells} policy cells and the fixed ks of {bare} groups, about {todo_s:.0f} s after "
              f"{time.perf_counter() - t_start:.0f} s of set-up (and each workload's calibration)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:  # calibrated files (DISCO, n-gram table) live for the run
            for wname in workloads:
                serve_workload(engine, args, wname, loads, policies, cost, result, done, prompts, oracle,
                               Path(tmp))
        return 0
    finally:
        gc.unfreeze()  # a caller in the same process (a test) gets its collector back whole


if __name__ == "__main__":
    raise SystemExit(main())
