"""The shape of the paper's llm-d experiment, simulated: 2 replicas of Qwen3-32B + EAGLE on measured H200 step times.

    .venv/bin/python benchmarks/fleet_sim.py [--rates 5,10,20,40,80] [--duration 120] [--seeds 0,1]

Each replica runs its own policy (`tabletune simulate --replicas 2 --router ...`): vLLM's documented
table, the tuned table (`tabletune`), or the online controller (`controller`, starting from the tuned
table's prior). Open-loop Poisson arrivals. Below saturation every policy serves the arrivals, so the
gain shows in time per output token (TPOT); at saturation it shows in throughput. Reports both, as
ratios to the documented table, per arrival rate and router. Writes benchmarks/results/fleet_sim.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "h200" / "qwen3-32b_eagle_ctx1024.json"
RATES = (0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)  # EAGLE-like, general text (tabletune.experiments.settings)
POLICIES = ("documented", "tabletune", "controller")


def run(policy: str, rate: float, router: str, duration: float, seed: int) -> dict:
    from tabletune.cost import StepCost
    from tabletune.policies import make_policy
    from tabletune.profile import StepProfile
    from tabletune.sim import Schedule, SimConfig, Simulator, preset
    from tabletune.sim.fleet import run_fleet

    workload = dataclasses.replace(preset("chat"), rates=RATES)
    sim = Simulator(StepCost(StepProfile.load(PROFILE), 0.5), Schedule.constant(workload),
                    SimConfig(duration_s=duration, arrival_rate=rate, max_num_seqs=128, seed=seed))
    fleet = run_fleet(sim, lambda i: make_policy(policy, sim.context(seed=seed + i)), 2, router)
    return fleet.summary()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="5,10,20,40,80")
    ap.add_argument("--routers", default="round-robin,least-loaded")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args()
    from tabletune import fileio

    rows = []
    for router in args.routers.split(","):
        for rate in (float(r) for r in args.rates.split(",")):
            cell = {}
            for policy in POLICIES:
                runs = [run(policy, rate, router, args.duration, int(s)) for s in args.seeds.split(",")]
                cell[policy] = {k: sum(r[k] for r in runs) / len(runs)
                                for k in ("throughput_tok_s", "tpot_ms", "mean_k", "mean_batch_size")}
            base = cell["documented"]
            for policy in POLICIES:
                c = cell[policy]
                rows.append({"router": router, "arrival_rate": rate, "policy": policy, **c,
                             "throughput_gain_pct": 100 * (c["throughput_tok_s"] / base["throughput_tok_s"] - 1),
                             "tpot_gain_pct": 100 * (base["tpot_ms"] / c["tpot_ms"] - 1)})
                print(json.dumps(rows[-1]))
    command = "python benchmarks/fleet_sim.py " + " ".join(sys.argv[1:])
    fileio.write_json(ROOT / "benchmarks" / "results" / "fleet_sim.json", {"command": command, "rows": rows})
    lines = ["# Two replicas behind a router, simulated from the measured H200 profile", "",
             f"Profile `{PROFILE.relative_to(ROOT)}`, acceptance {list(RATES)}, open loop, {args.duration:.0f} s "
             f"simulated, seeds {args.seeds}. Gains are against vLLM's documented table on the same arrivals.", "",
             "| router | req/s | policy | tok/s | TPOT ms | mean k | mean batch | throughput gain | TPOT gain |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['router']} | {r['arrival_rate']:g} | {r['policy']} | {r['throughput_tok_s']:.0f} | "
                     f"{r['tpot_ms']:.2f} | {r['mean_k']:.2f} | {r['mean_batch_size']:.1f} | "
                     f"{r['throughput_gain_pct']:+.1f}% | {r['tpot_gain_pct']:+.1f}% |")
    lines += ["", f"Command: `{command}`"]
    fileio.write_text(ROOT / "benchmarks" / "results" / "fleet_sim.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
