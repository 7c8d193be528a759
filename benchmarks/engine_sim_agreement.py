"""The simulator against real serving on the built-in engine (CPU; reads the GPU run's files).

For every (load, policy) of ``benchmarks/results/engine_serving.json`` it runs
``tabletune.sim`` with the same step-time profile (measured by that run, at the
mean serving context), the acceptance that run realised (its conditional rates
per position), the same output length, prompt length and prefill cost per
token, and reports measured vs simulated throughput.

    python benchmarks/engine_sim_agreement.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from tabletune import fileio
from tabletune.policies import make_policy
from tabletune.profile import StepProfile
from tabletune.cost import StepCost
from tabletune.sim import Schedule, SimConfig, Simulator, preset
from tabletune.table import DraftTable

RESULTS = Path("benchmarks/results")


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serving", default=str(RESULTS / "engine_serving.json"))
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "engine_sim_agreement"))
    args = ap.parse_args(argv)
    serving = json.loads(Path(args.serving).read_text())
    profile = StepProfile.from_json(serving["profile"], args.serving)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        table_file = str(Path(tmp) / "table.json")
        fileio.write_json(table_file, DraftTable.from_ranges(serving["table"]).to_vllm())
        for run in serving["runs"]:
            sims = [simulate(profile, run, serving, table_file, args.duration, s) for s in range(args.seeds)]
            sim_tok_s = sum(sims) / len(sims)
            diff = sim_tok_s / run["throughput_tok_s"] - 1
            one = [simulate(profile, run, serving, table_file, args.duration, s, False) for s in range(args.seeds)]
            rows.append({"load": run["load"], "policy": run["policy"], "k": run["k"],
                         "measured_tok_s": run["throughput_tok_s"], "simulated_tok_s": round(sim_tok_s, 1),
                         "difference": round(diff, 4), "prefill_ms_per_token": run.get("prefill_ms_per_token"),
                         "difference_one_prefill_cost": round(sum(one) / len(one) / run["throughput_tok_s"] - 1, 4)})
            print(f"load {run['load']:4d} {run['policy']:8s} measured {run['throughput_tok_s']:9.1f} "
                  f"simulated {sim_tok_s:9.1f} tok/s  {diff:+.1%}", flush=True)
    worst = max(abs(r["difference"]) for r in rows)
    worst_one = max(abs(r["difference_one_prefill_cost"]) for r in rows)
    fileio.write_json(args.out + ".json", {"serving": args.serving, "worst_abs_difference": worst,
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
    fileio.write_text(args.out + ".md", "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
