"""Wall time of a whole ``tabletune tune`` on the built-in engine, by phase, start-up included.

Runs the tune as the CLI does (adapter start, acceptance, grid, rechecks, refinement,
close calls, optimise, write) with a timing proxy around the engine, and writes one
result file with the wall time of each phase, the points and steps measured, and the
target (2 minutes for the 8B grid below on an H200).

    # H200 (the target): 8B shape, EAGLE, k 0..7, b 1..256, context 1024
    python benchmarks/tune_speed.py --out benchmarks/results/tune_speed
    # CPU smoke run
    python benchmarks/tune_speed.py --model tiny --k-max 3 --max-num-seqs 8 --context-len 64 --out out/tune_speed
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

TARGET_S = 120.0


class TimedEngine:
    """Forwards to the engine; adds each call's wall time to the current phase."""

    def __init__(self, engine, phases: dict[str, float], counts: dict[str, int]) -> None:
        self._engine, self.phases, self.counts = engine, phases, counts
        self.phase = "grid + refinement"
        self.first_step = True

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def measure_acceptance(self, prompts, k, max_tokens):
        t0 = time.perf_counter()
        try:
            return self._engine.measure_acceptance(prompts, k, max_tokens)
        finally:
            self.phases["acceptance (replay engine build + decode)"] += time.perf_counter() - t0

    def measure_step(self, batch_size, k, num_steps):
        t0 = time.perf_counter()
        got = self._engine.measure_step(batch_size, k, num_steps)
        dt = time.perf_counter() - t0
        if self.first_step:  # the built-in engine builds its timing engine (graph capture) on first use
            self.phases["first step (timing engine build + graph capture)"] += dt
            self.first_step = False
        else:
            self.phases[self.phase] += dt
        self.counts["measure_step calls"] += 1
        self.counts["timed steps"] += len(got.samples_ms)
        return got


def phase_of(text: str) -> str:
    word = text.split()[0] if text else ""
    return {"recheck": "rechecks", "close": "close calls"}.get(word, "grid + refinement")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--method", default="eagle")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--context-len", type=int, default=1024)
    ap.add_argument("--synthetic-acceptance", default="0.8,0.75,0.7,0.65,0.6,0.55,0.5,0.45")
    ap.add_argument("--point-budget-s", type=float, default=4.0)
    ap.add_argument("--out", required=True, help="folder: the tune's files and tune_speed.json")
    args = ap.parse_args()

    t_start = time.perf_counter()
    from tabletune.cli.tune import build_spec, load_adapter, load_prompt_texts
    from tabletune.tuner import TunePlan
    from tabletune.tuner.files import write_runs
    from tabletune.tuner.run import run_contexts

    phases: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    rates = ",".join(args.synthetic_acceptance.split(",")[:args.k_max])
    spec, sizes = build_spec(args.model, args.method, None, args.k_max, args.max_num_seqs, None, rates,
                             args.context_len, 0)
    adapter = load_adapter("builtin")
    workload, prompts = load_prompt_texts("code", 16)
    plan = TunePlan(batch_sizes=sizes, ks=tuple(range(args.k_max + 1)), point_budget_s=args.point_budget_s)
    phases["imports"] = time.perf_counter() - t_start
    t0 = time.perf_counter()
    raw = adapter.start(spec)
    phases["engine start (target model)"] = time.perf_counter() - t0
    engine = TimedEngine(raw, phases, counts)

    def progress(text: str, frac: float) -> None:
        engine.phase = phase_of(text)

    try:
        t0 = time.perf_counter()
        outcomes = run_contexts(engine, plan, prompts, [args.context_len], workload=workload, progress=progress)
        measured = time.perf_counter() - t0
    finally:
        raw.close()
    t0 = time.perf_counter()
    results, _ = write_runs(Path(args.out) / "tune", outcomes, lambda r: adapter.speculative_config(spec, r)
                            if hasattr(adapter, "speculative_config") else {"num_speculative_tokens_per_batch_size": r})
    phases["optimise + write"] = time.perf_counter() - t0
    accounted = sum(v for k, v in phases.items() if k not in ("imports", "engine start (target model)",
                                                               "optimise + write"))
    phases["tuner's own work (outside engine calls)"] = max(0.0, measured - accounted)
    total = time.perf_counter() - t_start
    profile = outcomes[0].profile
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "fingerprint": {"device": profile.fingerprint.device, "engine_version": profile.fingerprint.engine_version,
                        "model": profile.fingerprint.model, "flags": profile.fingerprint.flags},
        "total_s": round(total, 2),
        "target_s": TARGET_S,
        "meets_target": total <= TARGET_S,
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "points": len(profile.points),
        "batch_sizes": profile.batch_sizes,
        **counts,
        "table": results[0].table.as_lists(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
