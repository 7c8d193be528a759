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

    python benchmarks/engine_policies.py --workloads code --out benchmarks/results/engine_policies     # GPU
    python benchmarks/engine_policies.py --quick --out out/engine_policies                              # CPU
    python benchmarks/engine_policies.py --switch --loads 8,32 --max-load 32 --out benchmarks/results/engine_switch
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_serving import make_predictable, staggered_len, window_start  # noqa: E402
from policies_sim import (NGRAM_PARTNER, Calibration, Protocol, calibrate, explore_steps,  # noqa: E402
                         gate_state, repeated_cell, split_specs, trace_files, workload_preset)

from tabletune import fileio  # noqa: E402
from tabletune.cost import MixedStep, StepCost, fit_active_share, fit_draft_share  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import resolve  # noqa: E402
from tabletune.engine.profiling import ENGINE_VERSION, RUNNER, device_name, time_steps  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, policy_context, steady_throughput  # noqa: E402
from tabletune.engine.trace_replay import (TracedReplayDrafter, load_token_traces, ngram_length_rates,  # noqa: E402
                                           pair_traces, replay_rates)
from tabletune.padding import geometric_batch_sizes  # noqa: E402
from tabletune.policies import REGISTRY, make_policy  # noqa: E402
from tabletune.policies.base import MODEL, NGRAM  # noqa: E402
from tabletune.policies.timed import timed  # noqa: E402
from tabletune.profile import Fingerprint, StepPoint, StepProfile  # noqa: E402
from tabletune.sim.oracle import headroom_share  # noqa: E402
from tabletune.sim.replay import prompt_half  # noqa: E402
from tabletune.sim.traces import auc, signal_noise_for_auc  # noqa: E402
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


def protocol_of(args) -> Protocol:
    return Protocol(warmup_steps=args.warmup_steps, measured_steps=args.measured_steps, output_len=args.output_len,
                    prompt_len=args.prompt_len, fixed_repeats=args.fixed_repeats, overlap_observe=args.overlap_observe,
                    model_trace=args.model_trace,
                    measured_row_steps=getattr(args, "measured_row_steps", Protocol.measured_row_steps))


def cell_run_s(args, step_ms: float) -> float:
    """Wall estimate of one run of a cell: it stops once its window is complete, ~ max(warm-up, output_len / 2) +
    measured steps (about 2 tokens a request-step), and at most rounds * output_len / 2, at ``step_ms``."""
    steps = min(args.rounds * args.output_len / 2.0,
                max(args.warmup_steps, args.output_len / 2.0) + args.measured_steps)
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


def probe_step_ms(engine: SpecEngine, args, loads: list[int]) -> float:
    """Mean of T(b, k_max / 2) over the loads, a few steps each (for the estimate)."""
    ctx = args.prompt_len + args.output_len // 2
    times = []
    for b in loads:
        engine.set_context(b, ctx)
        times.append(statistics.median(time_steps(engine, b, args.k_max // 2, 3, ctx, warmup=1)))
    return sum(times) / len(times)


def measure_profile(engine: SpecEngine, args, fp: Fingerprint) -> StepProfile:
    ctx = args.prompt_len + args.output_len // 2
    points = []
    for b in engine.buckets:
        engine.set_context(b, ctx)
        for k in range(args.k_max + 1):
            s = time_steps(engine, b, k, args.profile_steps, ctx)
            points.append(StepPoint(b, k, tuple(round(x, 4) for x in s)))
    return StepProfile(points=tuple(points), context_len=ctx, fingerprint=fp)


def median_step_ms(engine: SpecEngine, num_rows: int, ctx: int, steps: int, step: Callable[[], None]) -> float:
    """Median wall ms of ``step()`` (which ends with a read), rows 0..num_rows-1 reset to ctx before each, after
    2 untimed runs."""
    out = []
    for i in range(steps + 2):
        engine.reset_rows(num_rows, ctx)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if i >= 2:
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def time_ragged(engine: SpecEngine, ks: list[int], steps: int, ctx: int, split: bool) -> float:
    """Median wall ms of a ragged step of these k_i (rows 0..b-1 reset to ctx before each); ``split``: draft
    k_max, read the signals, verify (a feature policy's step)."""
    if not split:
        return statistics.median(time_steps(engine, len(ks), ks, steps, ctx))
    slots = list(range(len(ks)))

    def step() -> None:
        for j in range(engine.k_max):
            engine.draft_position(slots, j, engine.k_max)
        engine.read_drafts(slots, engine.k_max)
        engine.read(engine.verify_drafted(slots, ks), len(ks), engine.k_max)
    return median_step_ms(engine, len(ks), ctx, steps, step)


def mixed_check(engine: SpecEngine, profile: StepProfile, args, loads: list[int]) -> dict:
    """Ragged step times against ``StepCost.mixed_ms`` (verification by tokens, D = f (T - T0)) at the simulator's
    f = 0.5 and at the f fitted to them, under the drafting rule (rows still drafting, ``fit_active_share``; or
    every row until the longest draft ends, ``fit_draft_share``) whose worst error is smaller."""
    ctx, k_top, rng = profile.context_len, args.k_max, random.Random(0)
    rows, ragged = [], []
    for b in loads:
        engine.set_context(b, ctx)
        patterns = {"one-long": [k_top] + [0] * (b - 1), "half": [k_top if i % 2 else 1 for i in range(b)],
                    "random": [rng.randrange(k_top + 1) for _ in range(b - 1)] + [k_top]}
        for name, ks in patterns.items():
            fused = time_ragged(engine, ks, args.profile_steps, ctx, False)
            split = time_ragged(engine, ks, args.profile_steps, ctx, True)
            ragged.append((np.array(ks), fused))
            rows.append({"batch_size": b, "pattern": name, "ks": ks if b <= 16 else None, "k_top": max(ks),
                         "k_bar": round(sum(ks) / b, 4), "measured_ms": round(fused, 4),
                         "split_ms": round(split, 4)})
    fits = {}
    for rows_rule in ("active", "batch"):  # an engine that compacts the draft batch, or one that drafts every row
        try:
            if rows_rule == "active":
                f = fit_active_share(profile, ragged)
            else:
                f = fit_draft_share(profile, [MixedStep(len(ks), int(ks.max()), float(ks.mean()), ms)
                                              for ks, ms in ragged])
        except ValueError:  # no mixed step (a batch of one): nothing to fit
            f = 1.0
        cost = StepCost(profile, draft_share=f, draft_rows=rows_rule)
        worst = max(abs(ms / cost.mixed_ms(ks) - 1) for ks, ms in ragged)
        fits[rows_rule] = (worst, f)
    rows_rule = min(fits, key=lambda r: fits[r][0])
    share = fits[rows_rule][1]
    for r, (ks, _) in zip(rows, ragged):
        for label, cost in (("sim_default", StepCost(profile, draft_share=0.5)),
                            ("fitted", StepCost(profile, draft_share=share, draft_rows=rows_rule))):
            pred = cost.mixed_ms(ks)
            r[f"predicted_ms_{label}"] = round(pred, 4)
            r[f"error_{label}"] = round(r["measured_ms"] / pred - 1, 4)
    return {"fitted_draft_share": round(share, 4), "draft_rows": rows_rule,
            "worst_abs_error_by_rule": {k: round(v[0], 4) for k, v in fits.items()}, "rows": rows,
            "worst_abs_error_sim_default": max(abs(r["error_sim_default"]) for r in rows),
            "worst_abs_error_fitted": max(abs(r["error_fitted"]) for r in rows)}


PLAN_CHECK_LOADS = (4, 16, 64, 128)
# (model rows' k, n-gram rows' k); (1, 7) and (4, 4) verify the same tokens, (1 + 1 + 7 + 1) / 2 = 4 + 1 a row, with
# rows padded to 8 positions and to 5: their verify_ms apart is the padding's cost
PLAN_CHECK_KS = ((2, 7), (2, 4), (1, 7), (4, 4))


def time_plan(engine: SpecEngine, ks: list[int], kinds: list[int], steps: int, ctx: int, split: bool,
              draft: bool = True, read: str = "") -> float:
    """Median ms of a planned step whose n-gram rows (``kinds``) verify the lookup's proposal: split as the
    scheduler runs it when they outrun the model rows (draft the model rows only, look up the n-gram rows, verify),
    or fused (every row drafts the longest k, the n-gram rows' drafts replaced by the lookup). ``draft=False``: the
    split step without its model drafting (the lookup and the verification alone). ``read``: the split step with
    its drafted signals read back on the host, ``"once"`` after the drafting (a policy that decides on them) or
    ``"each"`` after every drafted position (a stop rule evaluated on the host): the device waits from each read to
    the next launch."""
    slots = list(range(len(ks)))
    model = [s for s, g in zip(slots, kinds) if g == MODEL]
    ngram = [s for s, g in zip(slots, kinds) if g == NGRAM]
    k_model = max((k for k, g in zip(ks, kinds) if g == MODEL), default=0)

    def step() -> None:
        if split:
            for j in range(k_model if draft else 0):
                engine.draft_position(model, j, k_model)
                if read == "each" or (read == "once" and j == k_model - 1):
                    engine.read_drafts(model, j + 1)
            engine.lookup_rows(ngram)
            buf = engine.verify_drafted(slots, ks, kinds=kinds)
        else:
            buf = engine.launch(slots, ks, kinds=kinds)
        engine.read(buf, len(ks), engine.k_max)
    return median_step_ms(engine, len(ks), ctx, steps, step)


def plan_check(engine: SpecEngine, cost: StepCost, args, max_load: int) -> dict:
    """Planned steps with n-gram rows (half the rows, verifying longer than the model rows draft, or as long) against
    ``StepCost.mixed_ms``, which prices their verification only: the split step as the scheduler runs it, the fused
    one, the split one without its drafting (``verify_ms``, against ``StepCost.verify_ms`` at the mean verified
    length), and what the split costs beyond the price (``split_extra_ms``, per batch size, the median over
    patterns)."""
    ctx = cost.profile.context_len
    loads = [b for b in PLAN_CHECK_LOADS if b <= max_load] or [max(max_load, 2)]
    rows = []
    for b in loads:
        engine.set_context(b, ctx)
        for k_model, k_ngram in PLAN_CHECK_KS:
            k_model, k_ngram = min(k_model, args.k_max), min(k_ngram, args.k_max)
            ks, kinds = plan_rows(b, k_model, k_ngram)
            rows.append({"batch_size": b, "k_model": k_model, "k_ngram": k_ngram,
                         "split_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True), 4),
                         "fused_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, False), 4),
                         "verify_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True, draft=False),
                                            4),
                         "read_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True, read="once"), 4),
                         "read_each_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True,
                                                         read="each"), 4),
                         **plan_price(cost, ks, kinds)})
    return {"rows": rows, "split_extra_ms": split_extra_ms(rows), **read_extra_ms(rows)}


def plan_rows(b: int, k_model: int, k_ngram: int) -> tuple[list[int], list[int]]:
    """(ks, kinds) of a plan-check step of b rows: the first b - b // 2 on the model chain at ``k_model``, the rest
    on the n-gram chain at ``k_ngram``."""
    kinds = [MODEL] * (b - b // 2) + [NGRAM] * (b // 2)
    return [k_model if g == MODEL else k_ngram for g in kinds], kinds


def plan_price(cost: StepCost, ks: list[int], kinds: list[int]) -> dict:
    """A plan-check step's price (its n-gram rows draft nothing) and its verification's at the mean verified
    length."""
    verified = np.array(ks)
    drafted = np.where(np.array(kinds) == MODEL, verified, 0)
    return {"priced_verify_ms": round(float(cost.verify_ms(len(ks), float(verified.mean()))), 4),
            "priced_ms": round(cost.mixed_ms(verified, drafted, drafted < verified), 4)}


def medians_by_batch(pairs) -> dict[str, float]:
    """(b, ms) pairs (one per plan-check pattern) as the median ms per batch size, keyed by b as a string."""
    by_b: dict[int, list[float]] = {}
    for b, ms in pairs:
        by_b.setdefault(b, []).append(ms)
    return {str(b): round(statistics.median(v), 4) for b, v in by_b.items()}


def split_extra_ms(rows: list[dict]) -> dict[str, float]:
    """Per batch size, the median over the plan check's patterns of what a split step costs beyond its price."""
    return medians_by_batch((r["batch_size"], r["split_ms"] - r["priced_ms"]) for r in rows)


def read_extra_ms(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per batch size, the medians over the plan check's patterns of what reading the drafted signals back costs a
    split step: once (``read_extra_ms``: read_ms - split_ms), and each read after a further drafted position
    (``position_read_extra_ms``: (read_each_ms - read_ms) / (model rows' k - 1), patterns drafting 2 or more);
    none from a plan check that did not time reads."""
    if any("read_ms" not in r for r in rows):
        return {}
    return {"read_extra_ms": medians_by_batch((r["batch_size"], r["read_ms"] - r["split_ms"]) for r in rows),
            "position_read_extra_ms": medians_by_batch(
                (r["batch_size"], (r["read_each_ms"] - r["read_ms"]) / (r["k_model"] - 1))
                for r in rows if r["k_model"] >= 2)}


def draft_profile(engine: SpecEngine, profile: StepProfile, args) -> dict:
    """D(b, k): the drafting of a step alone, timed at the profile's (b, k): positions 1..k of b rows (the split
    path's draft graphs), then a read of their signals, less the read alone. The rest of T(b, k) is verification;
    the share drafting takes falls with b as verifying k more tokens a row turns compute-bound."""
    ctx, rows = profile.context_len, []
    for b in profile.batch_sizes:
        engine.set_context(b, ctx)
        slots = list(range(b))

        def step(k: int = 0) -> None:
            for j in range(k):
                engine.draft_position(slots, j, k)
            engine.read_drafts(slots, max(k, 1))
        read_ms = median_step_ms(engine, b, ctx, args.profile_steps, step)
        rows.append({"batch_size": b, "draft_ms": [0.0] + [
            round(max(median_step_ms(engine, b, ctx, args.profile_steps, lambda k=k: step(k)) - read_ms, 0.0), 4)
            for k in range(1, args.k_max + 1)]})
    return {"rows": rows}


def engine_cost(profile: StepProfile, mixed: dict, drafts: dict | None = None, plans: dict | None = None) -> StepCost:
    """The engine's cost: its profile with the drafting rule the mixed-k check chose, drafting priced by the
    measured D(b, k) (``draft_profile``), else by the share of T(b, k) - T(b, 0) that check fitted, and a split
    step's extra (``StepCost.split_extra``) from the plan check where there is one."""
    rows_rule = mixed.get("draft_rows", "active")

    def pairs(name: str) -> tuple[tuple[int, float], ...]:  # (b, ms >= 0) of one of the plan check's extras
        return tuple(sorted((int(b), max(float(ms), 0.0)) for b, ms in (plans or {}).get(name, {}).items()))

    extras = {"split_extra": pairs("split_extra_ms"), "read_extra": pairs("read_extra_ms"),
              "position_read_extra": pairs("position_read_extra_ms")}
    if drafts is None:
        return StepCost(profile, draft_share=mixed["fitted_draft_share"], draft_rows=rows_rule, **extras)
    by_b = {r["batch_size"]: r["draft_ms"] for r in drafts["rows"]}
    # at most T(b, k) - T(b, 0): verifying k more tokens never costs less than verifying none
    cost = StepCost.split(profile, lambda b, k: min(by_b[b][k], profile.step_ms(b, k) - profile.step_ms(b, 0)),
                          draft_rows=rows_rule)
    return dataclasses.replace(cost, **extras)


def pricing(result: dict) -> str:
    """How the policies of a cell priced drafting: the measured D(b, k), or a share of T(b, k) - T(b, 0)."""
    return "draft profile" if result.get("draft_profile") else "draft share"


def reprice(result: dict, cost: StepCost) -> None:
    """The mixed-k and plan checks' steps priced by ``cost`` (the simulator's now, without a split step's extra,
    which the plan check's ``split_extra_ms`` then measures afresh)."""
    for r in result["mixed_check"]["rows"]:
        if r.get("ks") is not None:
            r["priced_ms"] = round(cost.mixed_ms(np.array(r["ks"])), 4)
    plans = result.get("plan_check")
    if plans:
        for r in plans["rows"]:
            r.update(plan_price(cost, *plan_rows(r["batch_size"], r["k_model"], r["k_ngram"])))
        plans["split_extra_ms"] = split_extra_ms(plans["rows"])


def span_fit(ngram: list) -> tuple[float, float]:
    """The simulator's copyable spans from an n-gram trace: (span_start_prob, span_mean_len).

    A span is a maximal run of positions with an n-gram row, one missing position bridged (the bonus token after
    a fully accepted draft has no row): span_mean_len = mean run length, span_start_prob = runs / positions
    outside runs (per emitted token).
    """
    runs, outside = [], 0
    for t in ngram:
        present = t.present.copy()
        present[1:-1] |= present[:-2] & present[2:]  # bridge single gaps
        length = 0
        for p in present.tolist() + [False]:
            if p:
                length += 1
            elif length:
                runs.append(length)
                length = 0
        outside += int((~present).sum())
    if not runs:
        return 0.0, 1.0
    return min(len(runs) / max(outside, 1), 1.0), max(float(np.mean(runs)), 1.0)


def workload_data(name: str, k_max: int, model_trace: str = "early-exit") -> dict:
    """The engine's replay pairs of the scoring half of the prompts, and the trace statistics of the workload."""
    model_file, ngram_file = trace_files(model_trace, name)
    model, ngram = load_token_traces(model_file), load_token_traces(ngram_file)
    top1 = np.concatenate([t.signals[t.present, 0] for t in model])
    ok = np.concatenate([t.accepted[t.present] for t in model])
    start_prob, mean_len = span_fit(ngram)
    pairs = [p for p in pair_traces(model, ngram) if prompt_half(p[0].request) == "scoring"]
    return {"pairs": pairs, "rates": replay_rates(model, k_max), "ngram_rates": ngram_length_rates(ngram),
            "top1_auc": auc(top1, ok), "span_start_prob": start_prob, "span_mean_len": mean_len}


def trace_offset(i: int, pair) -> int:
    """Request i's first row of its traces: drawn per request (as the simulator's ``Segments`` start), so that many
    requests over few traces do not run in step."""
    return int(np.random.default_rng(i).integers(len(pair[0].accepted)))


def serve_cell(engine, args, policy_spec, ctx, load, prompts, oracle, pairs, seed: int = 0) -> dict:
    """One engine run: the window starts after the first wave was replaced and after ``--warmup-steps``."""
    n = max(4, args.rounds * load)
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
        return len(stats.step_batch_sizes) >= window[0] + args.measured_steps

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


def charged_lookup_ms(cell: dict, cells: list[dict]) -> float | None:
    """Where some of a cell's steps were decided on the lookup and some not (``0 < lookup_share < 1``: the gated
    per-request controller), what the simulator charges a step decided on the lookup (``charged_host_ms`` of
    ``host_ms_critical_lookup``; the others are charged that of ``host_ms_critical_other``); None where every step
    is alike."""
    if not 0 < (cell.get("lookup_share") or 0) < 1:
        return None
    return charged_host_ms({**cell, "host_ms_critical": cell["host_ms_critical_lookup"]}, cells)


def charged_host_ms(cell: dict, cells: list[dict]) -> float:
    """The host time the simulator charges a cell a step: what the engine's device waited on for it beyond what
    it waits on at a fixed k of the same (workload, load) (the step profile holds none of the scheduler's own
    bookkeeping, so every cell pays it alike): ``host_ms_critical`` minus the fixed-k cells' mean, at least 0;
    a file without ``host_ms_critical`` charges ``host_ms_per_step``."""
    if cell["policy"].startswith("fixed:"):
        return 0.0
    base = [c["host_ms_critical"] for c in cells if c["workload"] == cell["workload"] and c["load"] == cell["load"]
            and c["policy"].startswith("fixed:") and c.get("host_ms_critical") is not None]
    if cell.get("host_ms_critical") is None or not base:
        return cell.get("host_ms_per_step") or 0.0
    return max(cell["host_ms_critical"] - statistics.fmean(base), 0.0)


def simulate_cell(cost, calib, args, policy_spec, load, cell, cells: list[dict]) -> dict:
    """The simulated cell (``policies_sim.repeated_cell``, the mean over the protocol's policy repeats): the engine's
    cost, scoring traces, prefill cost, and the host time the engine waited on for this policy
    (``charged_host_ms``; by step for a cell decided on the lookup on some steps only: ``charged_lookup_ms``)."""
    lookup = charged_lookup_ms(cell, cells)
    charged = charged_host_ms(cell if lookup is None else {**cell, "host_ms_critical": cell["host_ms_critical_other"]},
                              cells)
    protocol = protocol_of(args)
    out = repeated_cell(cost, calib, policy_spec, load, protocol, protocol.policy_repeats,
                        prefill_ms_per_token=cell.get("prefill_ms_per_token") or 0.0, host_ms_per_step=charged,
                        host_ms_lookup_step=lookup)
    return {"sim_tok_s": out["sim_tok_s"], "sim_device_tok_s": out["sim_device_tok_s"],
            "sim_host_ms_charged": round(charged, 4),
            **({} if lookup is None else {"sim_host_ms_charged_lookup": round(lookup, 4)})}


def oracle_cell(cost, calib, args, load, cells) -> dict:
    """The headroom oracle of one (workload, load), simulated (it needs each draft's fate)."""
    prefill = next((c.get("prefill_ms_per_token") for c in cells
                    if c["workload"] == calib.workload and c["load"] == load and c.get("prefill_ms_per_token")), 0.0)
    protocol = protocol_of(args)
    out = repeated_cell(cost, calib, "oracle", load, protocol, protocol.policy_repeats,
                        prefill_ms_per_token=prefill or 0.0)
    return {"workload": calib.workload, "load": load, "policy": "oracle", "throughput_tok_s": None, "mean_k": None,
            "sim_tok_s": out["sim_tok_s"]}


def protocol_from_key(args, key: dict) -> None:
    """Set ``args``' protocol fields to those a file was measured with (its ``key``), the traces replayed among
    them (a file from before the key recorded them: early exit)."""
    args.prompt_len, args.output_len, args.k_max = key["prompt_len"], key["output_len"], key["k_max"]
    args.warmup_steps, args.measured_steps = key["warmup_steps"], key["measured_steps"]
    args.fixed_repeats = key["fixed_repeats"]
    args.model_trace = key.get("model_trace", "early-exit")
    args.overlap_observe = key.get("overlap_observe", args.overlap_observe)


def grid_inputs(args) -> tuple[dict, StepCost]:
    """OUT.json and the engine's cost from it (``args``' protocol set to the file's), its cells repriced: what the
    simulator side of a measured grid starts from."""
    out_json = Path(args.out + ".json")
    result = json.loads(out_json.read_text())
    protocol_from_key(args, result["key"])
    profile = StepProfile.from_json(result["profile"], str(out_json))
    reprice(result, engine_cost(profile, result["mixed_check"], result.get("draft_profile")))  # the rule alone
    return result, engine_cost(profile, result["mixed_check"], result.get("draft_profile"), result.get("plan_check"))


@dataclasses.dataclass(frozen=True)
class GridGroup:
    """One (workload, load) of a measured grid, with what a what-if simulated on its inputs needs."""

    workload: str
    load: int
    cost: StepCost
    calib: Calibration
    args: argparse.Namespace  # the grid's protocol (``protocol_from_key``)
    cells: list[dict]  # every cell of the grid
    best_sim_tok_s: float  # the best fixed k's simulated tok/s at this (workload, load)

    @property
    def protocol(self) -> Protocol:
        return protocol_of(self.args)

    def cell(self, policy: str) -> dict:
        return next(c for c in self.cells
                    if c["workload"] == self.workload and c["load"] == self.load and c["policy"] == policy)


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


def what_if_main(argv: list[str] | None, doc: str, script: str, name: str, default_groups: str,
                 rows_of: Callable[[str, list[tuple[str, int]]], list[dict]]) -> int:
    """The command line of a what-if on a measured grid's groups (``benchmarks/SCRIPT``: ``gate_predict.py``,
    ``plan_ahead.py``): ``--grid``, ``--groups workload:load,...``; its rows go to ``--out``
    (benchmarks/results/NAME.json, schema tabletune.NAME)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--grid", default="benchmarks/results/engine_policies", help="the grid's OUT (OUT.json read)")
    ap.add_argument("--groups", default=default_groups, help="workload:load,...")
    ap.add_argument("--out", default=f"benchmarks/results/{name}.json")
    args = ap.parse_args(argv)
    groups = [(w, int(n)) for w, n in (g.split(":") for g in args.groups.split(","))]
    rows = rows_of(args.grid, groups)
    fileio.write_json(args.out, {"schema": f"tabletune.{name}", "version": 1, "grid": args.grid + ".json",
                                 "command": f"python benchmarks/{script} --groups {args.groups}", "groups": rows})
    return 0


def sim_only(args) -> int:
    """Simulate every measured cell of OUT.json and each (workload, load)'s oracle afresh (CPU, no engine): the
    simulator's side always comes from the current simulator."""
    out_json = Path(args.out + ".json")
    result, cost = grid_inputs(args)
    result["cells"] = [c for c in result["cells"] if c["policy"] != "oracle"]
    with tempfile.TemporaryDirectory() as tmp:
        calibs: dict = {}
        for cell in list(result["cells"]):
            w = cell["workload"]
            if w not in calibs:
                calibs[w] = calibrate(w, args.k_max, cost, Path(tmp), protocol_of(args))
            cell.update(simulate_cell(cost, calibs[w], args, cell["policy"], cell["load"], cell, result["cells"]))
            print(f"{w:9s} load {cell['load']:4d} {cell['policy']:24s} sim {cell['sim_tok_s']:9.1f} tok/s", flush=True)
        for w, load in sorted({(c["workload"], c["load"]) for c in result["cells"]}):
            result["cells"].append(oracle_cell(cost, calibs[w], args, load, result["cells"]))
    add_ratios(result["cells"])
    fileio.write_json(str(out_json), result)
    fileio.write_text(args.out + ".md", markdown(result))
    return 0


def add_ratios(cells: list[dict]) -> None:
    """Each cell's tok/s over the best fixed k of its (workload, load), measured and simulated; the oracle's
    ratio (simulated) and each policy's share of that headroom, measured and simulated."""
    for key, out in (("throughput_tok_s", "ratio"), ("sim_tok_s", "sim_ratio")):  # absent sim_tok_s: None
        best: dict[tuple, float] = {}
        for c in cells:
            if c["policy"].startswith("fixed:") and c.get(key):
                g = (c["workload"], c["load"])
                best[g] = max(best.get(g, 0.0), c[key])
        for c in cells:
            b = best.get((c["workload"], c["load"]))
            c[out] = round(c[key] / b, 4) if b and c.get(key) else None
    oracle = {(c["workload"], c["load"]): c["sim_ratio"] for c in cells if c["policy"] == "oracle"}
    for c in cells:
        c["difference"] = round(c["sim_ratio"] - c["ratio"], 4) if c.get("ratio") and c.get("sim_ratio") else None
        o = oracle.get((c["workload"], c["load"]))
        c["oracle_ratio"] = o
        for ratio, share in (("ratio", "headroom_share"), ("sim_ratio", "sim_headroom_share")):
            h = headroom_share(c[ratio], o) if o and c.get(ratio) else None
            c[share] = None if h is None else round(h, 3)


def markdown(result: dict) -> str:
    mc = result["mixed_check"]
    key = result["key"]
    md = [f"# Policies on the built-in engine: {result['model']} shape, {result['device']}", "",
          f"Closed loop, prompt {result['prompt_len']} / output {result['output_len']} tokens, acceptance and "
          f"signals replayed from the scoring half of the traces ({key.get('model_trace', 'early-exit')} model "
          f"chain, n-gram chain); "
          f"every learned rule fit on the calibration half. Warm-up {key['warmup_steps']} steps, at least "
          f"{key['measured_steps']} measured steps wanted; fixed k repeated {key['fixed_repeats']} times. Ratio: "
          "tok/s over the best fixed k of the same workload and load; difference: simulated ratio - measured "
          "ratio; headroom: (ratio - 1) / (oracle ratio - 1), the oracle simulated.", "",
          f"Mixed-k cost (verification by tokens, drafting by {mc.get('draft_rows', 'active')} rows): fitted draft "
          f"share {mc['fitted_draft_share']}; worst |error| {mc['worst_abs_error_sim_default']:.1%} at the simulator's "
          f"0.5, {mc['worst_abs_error_fitted']:.1%} fitted.", "",
          "| workload | load | policy | mean k | tok/s | ratio | sim ratio | difference | oracle ratio | headroom |"
          " host ms/step | critical host ms | step ms | unpriced ms, fused / split (share split) | measured steps |"
          " noise band |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        tok = "" if c.get("throughput_tok_s") is None else f"{c['throughput_tok_s']:.0f}"
        unpriced = "" if "split_share" not in c else \
            f"{c['residual_ms_fused']} / {c['residual_ms_split']} ({c['split_share']})"
        md.append(f"| {c['workload']} | {c['load']} | {c['policy']} | {c.get('mean_k')} | {tok} | {c.get('ratio')} |"
                  f" {c.get('sim_ratio')} | {c.get('difference')} | {c.get('oracle_ratio')} | "
                  f"{c.get('headroom_share')} | {c.get('host_ms_per_step')} | {c.get('host_ms_critical')} | "
                  f"{c.get('step_ms')} | {unpriced} | "
                  f"{c.get('measured_steps')} | {c.get('noise_band', '')} |")
    md += ["", "| b | pattern | k_top | k_bar | measured ms | split ms | sim 0.5 ms | fitted ms | priced ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['batch_size']} | {r['pattern']} | {r['k_top']} | {r['k_bar']} | {r['measured_ms']} | "
           f"{r['split_ms']} | {r['predicted_ms_sim_default']} | {r['predicted_ms_fitted']} | "
           f"{r.get('priced_ms', '')} |" for r in mc["rows"]]
    drafts = result.get("draft_profile")
    if drafts:
        ks = range(len(drafts["rows"][0]["draft_ms"]))
        md += ["", "Drafting alone, D(b, k) ms (the draft profile; priced ms above and below use it), and its share "
               "of T(b, k) - T(b, 0):", "", "| b | " + " | ".join(f"k = {k}" for k in ks if k) + " | share at k_max |",
               "|---|" + "---|" * len(ks)]
        t = {(p["batch_size"], p["k"]): p["median_ms"] for p in result["profile"]["points"]}
        for r in drafts["rows"]:
            b, d = r["batch_size"], r["draft_ms"]
            span = t.get((b, len(d) - 1), 0.0) - t.get((b, 0), 0.0)
            share = f"{d[-1] / span:.2f}" if span > 0 else ""
            md.append(f"| {b} | " + " | ".join(str(x) for x in d[1:]) + f" | {share} |")
        n = sum(1 for c in result["cells"] if c.get("pricing") == "draft profile")
        md += ["", f"Cells whose policies priced drafting by the draft profile: {n} of "
               f"{sum(1 for c in result['cells'] if c['policy'] != 'oracle')} (the others by the fitted share)."]
    if result.get("plan_check"):
        md += ["", "Planned steps, half the rows on the n-gram chain (priced: their verification only; verify: the "
               "split step without its drafting, priced at the mean verified length):", "",
               "| b | model rows' k | n-gram rows' k | split ms | fused ms | priced ms | verify ms | priced verify ms"
               " | read once ms | read each ms |", "|---|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['batch_size']} | {r['k_model']} | {r['k_ngram']} | {r['split_ms']} | {r['fused_ms']} | "
               f"{r['priced_ms']} | {r.get('verify_ms', '')} | {r.get('priced_verify_ms', '')} | "
               f"{r.get('read_ms', '')} | {r.get('read_each_ms', '')} |"
               for r in result["plan_check"]["rows"]]
    return "\n".join(md + [""] + command_lines(result)) + "\n"


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


class PhaseTable:
    """The switch's oracle: the table tuned for the first workload until a request of the second is admitted (id >=
    ``first_id``), then the table tuned for the second."""

    name, uses_features = "oracle (table per phase)", False

    def __init__(self, before, after, first_id: int) -> None:
        self.before, self.after, self.first_id, self.switched = before, after, first_id, False

    def decide(self, state):
        self.switched = self.switched or bool((state.request_ids >= self.first_id).any())
        return (self.after if self.switched else self.before).decide(state)

    def observe(self, outcome) -> None:
        (self.after if self.switched else self.before).observe(outcome)


SWITCH_POLICIES = ("stale", "oracle", "controller", "controller:per-request")
SWITCH_WINDOWS_AFTER = 3  # windows after the switch that the recovered share averages


def switch_run(engine, args, policy, load: int, prompts, oracle, pairs_a, pairs_b) -> dict:
    """``2 rounds`` waves of code requests, then ``rounds`` waves of chat, closed loop at ``load``; throughput per
    window of ``--window-steps`` steps, the switch at the step the first chat request is admitted."""
    n_a, n_b = 2 * load, max(4, args.rounds * load)
    pairs = [pairs_a[i % len(pairs_a)] for i in range(n_a)] + [pairs_b[i % len(pairs_b)] for i in range(n_b)]
    reqs = [Request(list(prompts[i % len(prompts)]), staggered_len(i, load, args.output_len), i,
                    oracle=oracle[i % len(prompts)], trace=pairs[i], trace_offset=trace_offset(i, pairs[i]))
            for i in range(n_a + n_b)]
    w = args.window_steps
    stats = Scheduler(engine, policy, max_num_seqs=load, seed=load, overlap_observe=args.overlap_observe).run(reqs)
    admitted = np.cumsum([0] + stats.step_admitted)  # requests admitted before step t (ids in order)
    switch = int(np.searchsorted(admitted, n_a, side="right")) - 1  # the step whose admissions include id n_a
    full = [t for t, b in enumerate(stats.step_batch_sizes) if b == load]
    last = full[-1] + 1 if full else 0
    starts = list(range(switch % w, last - w + 1, w))  # windows aligned on the switch
    tok = [sum(stats.step_tokens[t: t + w]) / sum(stats.step_wall_s[t: t + w]) for t in starts]
    mean_k = sum(stats.step_drafts) / max(sum(stats.step_batch_sizes), 1)
    # the step from which no code request runs (the last one retired before it)
    drained = max(stats.replaced_at_step.get(i, stats.num_steps) for i in range(n_a))
    return {"switch_step": switch, "drained_step": drained, "window_starts": starts,
            "tok_s": [round(x, 2) for x in tok], "num_steps": stats.num_steps, "mean_k": round(mean_k, 3)}


def recovered(runs: dict, start: str = "switch_step", skip: int = 0,
              count: int | None = SWITCH_WINDOWS_AFTER) -> dict[str, float] | None:
    """(policy - stale) / (oracle - stale) on the mean throughput of each run's windows from its step ``start``
    (``switch_step``, or ``drained_step``: no code request left), ``skip`` of them skipped, then ``count`` (None:
    to the end); None where the oracle gains under 0.5%, or a run lacks ``start``."""
    if any(start not in run for run in runs.values()):
        return None

    def after(run):
        tok = [x for t, x in zip(run["window_starts"], run["tok_s"]) if t >= run[start]][skip:]
        tok = tok if count is None else tok[:count]
        return statistics.fmean(tok) if tok else float("nan")
    stale, best = after(runs["stale"]), after(runs["oracle"])
    if not best > stale * 1.005:
        return None
    return {name: round((after(run) - stale) / (best - stale), 3) for name, run in runs.items()}


def serve_switch(engine, args, cost, loads, prompts, oracle, key, command, fp, profile, mixed, drafts, old) -> int:
    """``--switch``: each policy of SWITCH_POLICIES through the code -> chat stream at each load, checkpointed per
    (load, policy) in OUT.json; per load the recovered share (module ``recovered``)."""
    out_json = Path(args.out + ".json")
    result = {"schema": "tabletune.engine_switch", "version": 1, "key": key, "device": fp.device,
              "model": args.model, "command": command, "commands": commands_of(old, command),
              "profile": profile.to_json(), "mixed_check": mixed, "draft_profile": drafts,
              "runs": old.get("runs", {}) if old else {}}
    with tempfile.TemporaryDirectory() as tmp:
        calib = {w: calibrate(w, args.k_max, cost, Path(tmp) / w, protocol_of(args)) for w in ("code", "chat")}
    pairs = {w: workload_data(w, args.k_max, args.model_trace)["pairs"] for w in ("code", "chat")}
    ctx = {w: policy_context(engine, cost, calib[w].rates, calib[w].ngram_rates) for w in ("code", "chat")}
    for load in loads:
        runs = result["runs"].setdefault(str(load), {})
        for name in SWITCH_POLICIES:
            if name in runs:
                continue
            if name == "stale":
                policy = make_policy("tabletune", ctx["code"])
            elif name == "oracle":
                policy = PhaseTable(make_policy("tabletune", ctx["code"]), make_policy("tabletune", ctx["chat"]),
                                    2 * load)
            else:
                policy = make_policy(name, ctx["code"])
            t0 = time.perf_counter()
            runs[name] = switch_run(engine, args, policy, load, prompts, oracle, pairs["code"], pairs["chat"])
            fileio.write_json(str(out_json), result)
            print(f"switch load {load:4d} {name:24s} tok/s by window {runs[name]['tok_s']} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        if all(name in runs for name in SWITCH_POLICIES):
            set_recovered(result, str(load))
            fileio.write_json(str(out_json), result)
    fileio.write_text(args.out + ".md", switch_markdown(result))
    return 0


def set_recovered(result: dict, load: str) -> None:
    """The load's recovered shares (``recovered``): from the switch (the first SWITCH_WINDOWS_AFTER windows, and the
    windows after those to the end of the run) and from the step no code request is left."""
    runs = result["runs"][load]
    result.setdefault("recovered", {})[load] = recovered(runs)
    result.setdefault("recovered_later", {})[load] = recovered(runs, skip=SWITCH_WINDOWS_AFTER, count=None)
    result.setdefault("recovered_drained", {})[load] = recovered(runs, start="drained_step")


def switch_markdown(result: dict) -> str:
    w = SWITCH_WINDOWS_AFTER
    md = [f"# Workload switch code -> chat on the built-in engine ({result['device']})", "",
          "Throughput (tok/s) per window of steps; the switch at the step the first chat request is admitted, the "
          "drain at the step from which no code request runs. recovered = (policy - stale) / (oracle - stale) on "
          f"the mean of: the first {w} windows from the switch (`switch`), the windows after those to the end of the "
          f"run (`later`), the first {w} windows from the drain (`drained`); none where the oracle gains under 0.5%.",
          "", "| load | policy | switch step | drain step | tok/s by window | recovered: switch | later | drained |",
          "|---:|---|---:|---:|---|---:|---:|---:|"]
    for load, runs in result["runs"].items():
        recs = [(result.get(key) or {}).get(load) or {} for key in ("recovered", "recovered_later",
                                                                    "recovered_drained")]
        for name, run in runs.items():
            md.append(f"| {load} | {name} | {run['switch_step']} | {run.get('drained_step', '-')} | "
                      f"{' '.join(f'{x:.0f}' for x in run['tok_s'])} | "
                      + " | ".join(str(rec.get(name, '-')) for rec in recs) + " |")
    return "\n".join(md + [""] + command_lines(result)) + "\n"


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
    --resume keeps the cells of another patch (each cell records the version it ran on)."""
    fp = key["fingerprint"]
    return {**key, "fingerprint": {**fp, "engine_version": ".".join(fp["engine_version"].split(".")[:2])}}


def commands_of(old: dict | None, command: str) -> list[str]:
    """The commands whose cells OUT.json holds, in order: those of the file resumed, then this one (once)."""
    before = (old.get("commands") or [old["command"]]) if old else []
    return before + [command] if command not in before else before


def command_lines(result: dict) -> list[str]:
    """The markdown's closing lines: every command that wrote cells (a resumed grid has several)."""
    commands = result.get("commands") or [result["command"]]
    if len(commands) == 1:
        return [f"Command: `{commands[0]}`"]
    return ["Commands (each resumed the file):", ""] + [f"- `{c}`" for c in commands]


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
        result["cells"] = [c for c in result["cells"]
                           if not (c["policy"] in again and c["workload"] in workloads and c["load"] in loads)]
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
