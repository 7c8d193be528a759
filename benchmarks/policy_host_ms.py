"""Host milliseconds per step (decide + keep_drafting + observe) of every policy at one batch size, CPU.

Each policy runs in the simulator at a closed-loop load (default 128) on the replayed early-exit
traces of a workload (signals included, so feature policies do their full work), wrapped by
``tabletune.policies.timed``; the first ``--warmup`` steps are not counted. The machine may be
shared, so each policy runs ``--repeats`` times and the minimum of the per-run means is reported.
Single-threaded numpy is the caller's job (OMP_NUM_THREADS=1 etc.).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/policy_host_ms.py --out benchmarks/results/policy_host_ms
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from tabletune import fileio
from tabletune.cost import StepCost
from tabletune.policies import make_policy
from tabletune.policies.timed import timed
from tabletune.profile import StepProfile
from tabletune.sim import Schedule, SimConfig, Simulator, preset
from tabletune.sim.replay import load_ngram_trace, load_traces

ROOT = Path(__file__).resolve().parents[1]
ZOO = ("fixed:3", "tabletune", "controller", "turbospec", "nightjar", "sglang", "disco", "tapout", "dsde",
       "gammatune", "adaptive-verification", "hybrid-spark")
BUDGET_MS = 0.3


def host_ms(spec: str, load: int, steps: int, warmup: int, workload: str) -> float:
    eagle = StepProfile.load(ROOT / "profiles/h200/qwen3-8b_eagle_ctx1024.json")
    ngram = StepProfile.load(ROOT / "profiles/h200/qwen3-8b_ngram_ctx1024.json")
    cost = StepCost.split(eagle, lambda b, k: eagle.step_ms(b, k) - ngram.step_ms(b, k))
    w = dataclasses.replace(preset(workload), output_len=10**6, prompt_len_mean=0.0)
    duration_s = (steps + warmup) * cost.step_ms(load, 7) / 1e3  # at least this many steps
    traces = ROOT / "profiles/traces"
    sim = Simulator(cost, Schedule.constant(w), SimConfig(duration_s=duration_s, load=load, max_num_seqs=max(load, 128)),
                    replay=load_traces([traces / f"early-exit_{workload}_T0.csv.gz"]),
                    ngram_replay=load_ngram_trace(traces / f"ngram_{workload}_T0.csv.gz"))
    policy = timed(make_policy(spec, sim.context()))
    sim.run(policy)
    return policy.mean_ms(warmup)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workload", default="code")
    ap.add_argument("--policies", default=",".join(ZOO))
    ap.add_argument("--out", default=None, help="write OUT.json")
    args = ap.parse_args(argv)
    rows = []
    for spec in args.policies.split(","):
        ms = min(host_ms(spec, args.load, args.steps, args.warmup, args.workload) for _ in range(args.repeats))
        rows.append({"policy": spec, "load": args.load, "host_ms_per_step": round(ms, 4), "within_budget": ms < BUDGET_MS})
        print(f"{spec:24s} b={args.load:4d} host {ms:7.3f} ms/step{'' if ms < BUDGET_MS else '  OVER 0.3 ms'}", flush=True)
    if args.out:
        command = "python benchmarks/policy_host_ms.py " + " ".join(argv if argv is not None else sys.argv[1:])
        fileio.write_json(args.out + ".json", {"schema": "tabletune.policy_host_ms", "version": 1, "command": command,
                                               "budget_ms": BUDGET_MS, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
