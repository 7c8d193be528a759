"""Per-request policies against the best fixed k, across loads, in the simulator; plus their CPU cost per step.

For each workload (code: EAGLE-like model drafter; code-edit: the same, with n-gram spans
that Hybrid Spark can use) and each closed-loop load, every fixed k, TableTune's tuned
table and the six per-request policies run ``--duration`` simulated seconds for each seed
on the starter H200 8B profile. Reported: mean throughput as % of the best fixed k at that
load, the worst share over loads, and the policy's CPU time per simulated step (the whole
run's process time over its steps, simulator included).

    python benchmarks/per_request_policies.py [--duration 20] [--seeds 2] [--loads 1,4,16,64,128]

Writes benchmarks/results/per_request_policies.{csv,md}.
"""

from __future__ import annotations

import argparse
import csv
import io
import time
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.policies import make_policy
from tabletune.profile import step_profile_from_csv
from tabletune.cost import StepCost
from tabletune.sim import SimConfig, Simulator, preset
from tabletune.sim.workload import Schedule

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "starter" / "h200_qwen3-8b-shape_ctx1024_eagle-like.csv"
CAVEAT = ("Caveat: policies that read draft features consume the simulator's random stream differently from "
          "fixed k, so they do not share random numbers with the baselines; a feature policy that always picks "
          "k = 3 measured 96-100% of fixed:3 over 3 seeds (eagle, load 128, 20 s), so differences of a few % are noise.")
POLICIES = ("tabletune", "disco", "disco:variant=threshold", "tapout", "dsde", "gammatune",
            "adaptive-verification", "hybrid-spark")


def run_point(cost: StepCost, workload: str, load: int, seed: int, spec: str, duration_s: float) -> tuple[float, float]:
    """(throughput tok/s, CPU ms per step) of one run."""
    sim = Simulator(cost, Schedule.constant(preset(workload)), SimConfig(duration_s=duration_s, load=load, seed=seed))
    policy = make_policy(spec, sim.context())
    t0 = time.process_time()
    result = sim.run(policy)
    cpu_s = time.process_time() - t0
    return result.throughput_tok_s, 1000.0 * cpu_s / max(result.num_steps, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--loads", default="1,4,16,64,128")
    ap.add_argument("--workloads", default="code,code-edit")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "per_request_policies"))
    args = ap.parse_args()
    loads = [int(x) for x in args.loads.split(",")]
    cost = StepCost(step_profile_from_csv(PROFILE))
    fixed = [f"fixed:{k}" for k in cost.ks]
    rows, md = [], []
    for workload in args.workloads.split(","):
        share: dict[str, list[float]] = {p: [] for p in POLICIES}
        cpu: dict[str, list[float]] = {p: [] for p in POLICIES}
        for load in loads:
            tput: dict[str, float] = {}
            for spec in (*fixed, *POLICIES):
                runs = [run_point(cost, workload, load, seed, spec, args.duration) for seed in range(args.seeds)]
                tput[spec] = float(np.mean([r[0] for r in runs]))
                if spec in cpu:
                    cpu[spec].append(float(np.mean([r[1] for r in runs])))
            best = max(fixed, key=lambda f: tput[f])
            for spec in POLICIES:
                share[spec].append(100.0 * tput[spec] / tput[best])
                rows.append({"workload": workload, "load": load, "policy": spec, "throughput_tok_s": round(tput[spec], 1),
                             "best_fixed": best, "best_fixed_tok_s": round(tput[best], 1),
                             "share_pct": round(share[spec][-1], 2), "cpu_ms_per_step": round(cpu[spec][-1], 3)})
            print(workload, load, best, {p: round(share[p][-1], 1) for p in POLICIES}, flush=True)
        md.append(f"### {workload}\n\n| policy | " + " | ".join(f"load {x}" for x in loads)
                  + " | worst | CPU ms/step |\n|---" * 1 + "|---" * (len(loads) + 2) + "|\n")
        for spec in POLICIES:
            md[-1] += (f"| {spec} | " + " | ".join(f"{v:.1f}" for v in share[spec])
                       + f" | {min(share[spec]):.1f} | {np.mean(cpu[spec]):.2f} |\n")
    header = (f"Throughput as % of the best fixed k (mean of {args.seeds} seeds, {args.duration:.0f} simulated s per "
              f"point, closed loop, starter H200 8B EAGLE-like profile). Command: `python "
              f"benchmarks/per_request_policies.py --duration {args.duration:g} --seeds {args.seeds} "
              f"--loads {args.loads} --workloads {args.workloads}`\n\n"
              f"{CAVEAT}\n\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    fileio.write_text(args.out + ".csv", buf.getvalue())
    fileio.write_text(args.out + ".md", header + "\n".join(md))
    print(f"wrote {args.out}.csv and .md")


if __name__ == "__main__":
    main()
