"""Closed-loop serving on the built-in engine (GPU), and the profile the simulator needs for it.

Target: a random-weight shape; drafts: the target's own greedy continuation
(recorded by a k=0 pass) replayed through the forced-rejection cap with the given
conditional rates, so acceptance follows them and outputs stay the target's
greedy outputs. For each load L (requests always open) and each policy (``--policy``,
repeatable, the simulator's spellings; default a fixed k and the tuned table) it records the steady-state throughput and the realised
acceptance. The first wave of requests has staggered output lengths (so requests
finish at different steps from the start, as in a steady closed loop); the
measuring window runs from the step after the whole first wave was replaced to
the last step that ran the full load (prefills included), so neither warm-up
nor drain counts. The prefills inside that window (eager, host-bound, so their
cost varies from run to run) give the run's own prefill cost per prompt token. It also measures
T(b, k) of the same engine at the mean serving context and the prefill cost per
prompt token, so that the simulator can run on the same profile and acceptance.

``--sim-agreement`` (CPU; reads the GPU run's files) is that comparison: for every (load, policy) of
``--serving`` (default ``benchmarks/results/engine_serving.json``) it runs ``tabletune.sim`` with the same
step-time profile (measured by that run, at the mean serving context), the acceptance that run realised (its
conditional rates per position), the same output length, prompt length and prefill cost per token, and reports
measured vs simulated throughput.

    python benchmarks/engine_serving.py --model qwen3-8b --out benchmarks/results/engine_serving_h200
    python benchmarks/engine_serving.py --sim-agreement     # writes benchmarks/results/engine_sim_agreement.{json,md}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tabletune import fileio
from tabletune.engine.drafters import ReplayDrafter
from tabletune.engine.model import Decoder
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import ENGINE_VERSION, RUNNER, command_line, device_name, time_steps
from tabletune.engine.runner import EngineConfig, SpecEngine
from tabletune.cost import StepCost
from tabletune.engine.scheduler import Request, Scheduler, policy_context, steady_throughput
from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.padding import geometric_batch_sizes
from tabletune.policies import make_policy
from tabletune.policies import resolve as resolve_policy
from tabletune.profile import Fingerprint, StepPoint, StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, preset
from tabletune.table import DraftTable

RATES = (0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)
RESULTS = Path("benchmarks/results")


def make_predictable(target: Decoder) -> None:
    """Random weights whose greedy output survives bf16 differences between batch shapes.

    A random model's logits are nearly tied, so a recorded greedy continuation would not
    match the same model at another batch shape. Scaling the embeddings and making the
    LM head a permutation of them makes the last token's embedding dominate the logits:
    greedy decoding becomes a robust function of the context. Shapes and cost are unchanged.
    """
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        target.embed.mul_(4.0)
        perm = torch.randperm(target.cfg.vocab_size, generator=g).to(target.device)
        if target.lm_head is not target.embed:
            target.lm_head.copy_(target.embed[perm])


def measure_profile(engine: SpecEngine, context_len: int, k_max: int, steps: int, command: str) -> StepProfile:
    points = []
    for b in engine.buckets:
        engine.set_context(b, context_len)
        for k in range(k_max + 1):
            s = time_steps(engine, b, k, steps, context_len)
            points.append(StepPoint(b, k, tuple(round(x, 4) for x in s)))
    fp = Fingerprint(engine="builtin", engine_version=ENGINE_VERSION, device=device_name(engine),
                     model=f"{engine.target.cfg.name} (shape, random bf16 weights)", dtype="bfloat16",
                     runner=RUNNER, drafter="replay+cap", command=command)
    return StepProfile(points=tuple(points), context_len=context_len, fingerprint=fp)


def staggered_len(i: int, load: int, output_len: int) -> int:
    """Output length of request i: the first wave is spread over (0, output_len] so that requests finish
    at different steps from the start, as in a steady closed loop; later requests get output_len."""
    return max(8, round(output_len * (i + 1) / load)) if i < load else output_len


def window_start(stats, load: int) -> int:
    """First step after every request of the first wave was replaced (the warm-up the window leaves out)."""
    return max([stats.replaced_at_step.get(i, 1) for i in range(load)] + [1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--loads", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--k-fixed", type=int, default=3)
    ap.add_argument("--policy", action="append", default=None,
                    help="NAME[:ARG] as in `tabletune simulate --policy`, repeatable (default: fixed:K-FIXED, tabletune)")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=6, help="requests per load = rounds * load (at least 4)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefill-graph-max-len", type=int, default=512,
                    help="prompts up to this length prefill from a CUDA graph per length (EngineConfig; 0: eager)")
    ap.add_argument("--out", default=None, help="OUT.json and OUT.md (default benchmarks/results/engine_serving, "
                    "with --sim-agreement benchmarks/results/engine_sim_agreement)")
    ap.add_argument("--sim-agreement", action="store_true", help="simulate the runs of --serving instead (CPU)")
    ap.add_argument("--serving", default=str(RESULTS / "engine_serving.json"), help="--sim-agreement: its input")
    ap.add_argument("--duration", type=float, default=60.0, help="--sim-agreement: simulated s per run")
    ap.add_argument("--seeds", type=int, default=3, help="--sim-agreement: seeds per run")
    args = ap.parse_args(argv)
    if args.sim_agreement:
        return sim_agreement(args.serving, args.duration, args.seeds, args.out or str(RESULTS / "engine_sim_agreement"))
    args.out = args.out or str(RESULTS / "engine_serving")
    command = command_line(os.environ.get("OUT")) if argv is None else \
        "python benchmarks/engine_serving.py " + " ".join(argv)
    loads = [int(x) for x in args.loads.split(",")]
    max_load = max(loads)
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    target = Decoder(resolve(args.model), torch.bfloat16 if cuda else torch.float32, args.device)
    make_predictable(target)
    policies = args.policy or [f"fixed:{args.k_fixed}", "tabletune"]
    for spec in policies:
        resolve_policy(spec.partition(":")[0])
    cfg = EngineConfig(max_num_seqs=max_load, split_steps=True, max_len=args.prompt_len + args.output_len + args.k_max + 16,
                       prefill_graph_max_len=args.prefill_graph_max_len,
                       k_max=args.k_max, buckets=tuple(geometric_batch_sizes(max_load)))
    engine = SpecEngine(target, ReplayDrafter(), cfg)
    mean_ctx = args.prompt_len + args.output_len // 2
    profile = measure_profile(engine, mean_ctx, args.k_max, 8, command)
    table = optimize_table(profile, list(RATES), OptimizeOptions(max_batch=max_load)).table
    print(f"profile at context {mean_ctx} measured; table {table}", flush=True)

    rng = random.Random(0)
    n_prompts = max(4, args.rounds * max_load)
    prompts = [[rng.randrange(target.cfg.vocab_size) for _ in range(args.prompt_len)] for _ in range(n_prompts)]
    t0 = time.perf_counter()
    record = [Request(p, args.output_len + args.k_max + 2, i) for i, p in enumerate(prompts)]
    Scheduler(engine, DraftTable.fixed(0)).run(record)
    oracle = [r.output for r in record]
    print(f"recorded greedy continuations in {time.perf_counter() - t0:.1f} s", flush=True)

    # prefill cost per prompt token, as the simulator charges it
    engine.cached.zero_()
    pre = []
    for i in range(10):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        engine.prefill(0, prompts[i % len(prompts)])
        if cuda:
            torch.cuda.synchronize()
        pre.append((time.perf_counter() - t) * 1e3)
    prefill_ms = statistics.median(pre)

    runs = []
    for load in loads:
        for name in policies:
            n = max(4, args.rounds * load)
            reqs = [Request(list(prompts[i]), staggered_len(i, load, args.output_len), i, oracle=oracle[i])
                    for i in range(n)]
            policy = make_policy(name, policy_context(engine, StepCost(profile), RATES))
            stats = Scheduler(engine, policy, max_num_seqs=load, cap_rates=RATES, seed=load).run(reqs)
            start = window_start(stats, load)
            st = stats.step_batch_sizes, stats.step_wall_s, stats.step_tokens
            end = max(i for i, b in enumerate(stats.step_batch_sizes) if b == load) + 1
            n_adm = sum(stats.step_admitted[start:end])
            pre_ms_tok = 1e3 * sum(stats.step_prefill_s[start:end]) / (n_adm * args.prompt_len) if n_adm else None
            k_mean = sum(stats.step_drafts[start:end]) / max(sum(stats.step_batch_sizes[start:end]), 1)
            runs.append({"load": load, "policy": name, "k": round(k_mean, 3), "window_start": start,
                         "prefill_ms_per_token": pre_ms_tok and round(pre_ms_tok, 5),
                         "throughput_tok_s": round(steady_throughput(*st, load, start), 2),
                         "overall_tok_s": round(stats.throughput_tok_s, 2), "num_steps": stats.num_steps,
                         "rates": [None if r is None else round(r, 4) for r in stats.counts.rates()],
                         "reached": stats.counts.reached, "accepted": stats.counts.accepted})
            print(f"load {load:4d} {name:12s} k={runs[-1]['k']} {runs[-1]['throughput_tok_s']:9.1f} tok/s "
                  f"rates {runs[-1]['rates'][:4]}", flush=True)
    result = {"device": device_name(engine), "model": args.model, "engine_version": ENGINE_VERSION,
              "prompt_len": args.prompt_len, "output_len": args.output_len, "cap_rates": list(RATES),
              "table": table.as_lists(), "prefill_ms": round(prefill_ms, 3),
              "prefill_ms_per_token": round(prefill_ms / args.prompt_len, 5), "command": command, "runs": runs,
              "profile": profile.to_json()}
    fileio.write_json(args.out + ".json", result)
    fileio.write_text(args.out + ".md", "\n".join(markdown(result)) + "\n")
    return 0


def markdown(result: dict) -> list[str]:
    """The serving runs as a table: steady-state throughput of each load under fixed k and the tuned table."""
    md = [f"# Built-in engine serving: {result['model']} shape, {result['device']}", "",
          f"Closed loop, prompt {result['prompt_len']} / output {result['output_len']} tokens, acceptance replayed by "
          f"the forced-rejection cap (rates {result['cap_rates']}); table {result['table']} (optimised from the "
          f"step profile measured first). Prefill {result['prefill_ms']} ms a prompt.", "",
          "| load | policy | mean k | steady tok/s | realised rates (first 4) |", "|---|---|---|---|---|"]
    md += [f"| {r['load']} | {r['policy']} | {r['k']} | {r['throughput_tok_s']:.0f} | {r['rates'][:4]} |"
           for r in result["runs"]]
    return md + ["", f"Command: `{result['command']}`"]


def simulate(profile, run, serving, table_file: str, duration_s: float, seed: int, own_prefill: bool = True) -> float:
    # realised conditional rates where at least 50 drafts reached the position, else the cap's rate
    rates = [r if n >= 50 else c for r, n, c in zip(run["rates"], run["reached"], serving["cap_rates"])]
    rates += serving["cap_rates"][len(rates):]
    w = dataclasses.replace(preset("chat"), rates=tuple(rates), heterogeneity=0.0,
                            prompt_len_mean=float(serving["prompt_len"]), output_len=serving["output_len"])
    prefill = (own_prefill and run.get("prefill_ms_per_token")) or serving["prefill_ms_per_token"]
    cfg = SimConfig(duration_s=duration_s, load=run["load"], max_num_seqs=max(128, run["load"]),
                    prefill_ms_per_token=prefill, seed=seed)
    sim = Simulator(StepCost(profile), Schedule.constant(w), cfg)
    spec = f"table:{table_file}" if run["policy"] in ("table", "tabletune") else run["policy"]
    return sim.run(make_policy(spec, sim.context())).throughput_tok_s


def sim_agreement(serving_file: str, duration_s: float, seeds: int, out: str) -> int:
    """Measured against simulated throughput of every run of ``serving_file`` (module docstring)."""
    serving = json.loads(Path(serving_file).read_text())
    profile = StepProfile.from_json(serving["profile"], serving_file)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        table_file = str(Path(tmp) / "table.json")
        fileio.write_json(table_file, DraftTable.from_ranges(serving["table"]).to_vllm())
        for run in serving["runs"]:
            sims = [simulate(profile, run, serving, table_file, duration_s, s) for s in range(seeds)]
            sim_tok_s = sum(sims) / len(sims)
            diff = sim_tok_s / run["throughput_tok_s"] - 1
            one = [simulate(profile, run, serving, table_file, duration_s, s, False) for s in range(seeds)]
            rows.append({"load": run["load"], "policy": run["policy"], "k": run["k"],
                         "measured_tok_s": run["throughput_tok_s"], "simulated_tok_s": round(sim_tok_s, 1),
                         "difference": round(diff, 4), "prefill_ms_per_token": run.get("prefill_ms_per_token"),
                         "difference_one_prefill_cost": round(sum(one) / len(one) / run["throughput_tok_s"] - 1, 4)})
            print(f"load {run['load']:4d} {run['policy']:8s} measured {run['throughput_tok_s']:9.1f} "
                  f"simulated {sim_tok_s:9.1f} tok/s  {diff:+.1%}", flush=True)
    worst = max(abs(r["difference"]) for r in rows)
    worst_one = max(abs(r["difference_one_prefill_cost"]) for r in rows)
    fileio.write_json(out + ".json", {"serving": serving_file, "worst_abs_difference": worst,
                                      "worst_abs_difference_one_prefill_cost": worst_one, "rows": rows})
    md = [f"# Simulator vs built-in engine serving ({serving['device']}, {serving['model']} shape)", "",
          f"Closed loop, prompt {serving['prompt_len']} / output {serving['output_len']} tokens, acceptance "
          f"replayed by the forced-rejection cap (rates {serving['cap_rates']}), table {serving['table']}. "
          f"Worst |sim/measured - 1| = {worst:.1%}, with each run's own prefill cost per prompt token (the eager "
          f"prefill is host-bound and varies between runs); with one cost for all runs "
          f"({serving['prefill_ms_per_token']} ms/token, measured apart): worst {worst_one:.1%}.", "",
          "| load | policy | k | measured tok/s | simulated tok/s | difference | run's prefill ms/token | "
          "difference, one prefill cost |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['load']} | {r['policy']} | {r['k']} | {r['measured_tok_s']:.0f} | {r['simulated_tok_s']:.0f} | "
           f"{r['difference']:+.1%} | {r['prefill_ms_per_token']} | {r['difference_one_prefill_cost']:+.1%} |"
           for r in rows]
    fileio.write_text(out + ".md", "\n".join(md) + "\n")
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
