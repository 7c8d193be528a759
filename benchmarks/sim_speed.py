"""Simulator speed: (1) 60 simulated seconds at 128 open requests (target <= 1 s), and
(2) `tabletune report`, every experiment on the measured inputs (target <= 10 minutes).

    .venv/bin/python benchmarks/sim_speed.py [--skip-all] [--repeats 5]

Prints the numbers and writes benchmarks/results/sim_speed.json and .md. Wall times on a
shared machine are noisy: (1) reports the median of the repeats, and both report the CPU
load average at the start so a reader can judge the contention.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "starter" / "h200_qwen3-8b-shape_ctx1024_eagle-like.csv"
RESULTS = ROOT / "benchmarks" / "results"


def time_sim(policy: str, repeats: int) -> dict:
    from tabletune.policies import make_policy
    from tabletune.profile import StepProfile
    from tabletune.cost import StepCost
    from tabletune.sim import Schedule, SimConfig, Simulator, preset

    cost = StepCost(StepProfile.load(PROFILE))
    walls, steps = [], 0
    for seed in range(repeats):
        sim = Simulator(cost, Schedule.constant(preset("chat")), SimConfig(duration_s=60.0, load=128, seed=seed))
        pol = make_policy(policy, sim.context())
        t0 = time.perf_counter()
        result = sim.run(pol)
        walls.append(time.perf_counter() - t0)
        steps = result.num_steps
    return {"policy": policy, "median_s": round(statistics.median(walls), 4), "min_s": round(min(walls), 4),
            "steps": steps, "target_s": 1.0}


def time_all() -> dict:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tabletune", "report", "--out", out], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        cpu = os.times()
    return {"wall_s": round(wall, 1), "children_cpu_s": round(cpu.children_user + cpu.children_system, 1),
            "target_s": 600.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-all", action="store_true", help="skip timing `tabletune report`")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    result = {"load_average_at_start": os.getloadavg()[0], "cpus": os.cpu_count(),
              "sim_60s_128_requests": [time_sim(p, args.repeats) for p in ("fixed:3", "tabletune", "nightjar",
                                                                           "controller")]}
    if not args.skip_all:
        result["experiment_all"] = time_all()
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Simulator speed", "", f"Load average at start: {result['load_average_at_start']:.1f} "
             f"on {result['cpus']} CPUs.", "", "| 60 simulated s, 128 open requests | median s | steps |",
             "|---|---|---|"]
    lines += [f"| {r['policy']} | {r['median_s']} | {r['steps']} |" for r in result["sim_60s_128_requests"]]
    if "experiment_all" in result:
        a = result["experiment_all"]
        lines += ["", f"`tabletune report`: {a['wall_s']} s wall, {a['children_cpu_s']} s CPU (target 600 s)."]
    (RESULTS / "sim_speed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
