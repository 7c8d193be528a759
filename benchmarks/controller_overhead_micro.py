"""The plugin's per-step work without vLLM around it (benchmark, not a test).

``ControllerHook._step`` does: ``StepObservation.from_drafts`` on the step's (k, m) pairs,
``Controller.observe``, ``maybe_rebuild`` (throttled) and ``explore_next``. This times exactly
those calls on the committed fitted profile, per load, in thread CPU time (minimum of 5 runs),
to separate the code's own cost from the inflation of a machine shared by many jobs
(``controller_overhead.md`` measures inside vLLM on that machine).

Run:  python benchmarks/controller_overhead_micro.py
"""

from __future__ import annotations

import random
import time

import controller_common as cc

from tabletune.controller import load_controller


def per_step_us(load: int, steps: int = 2000) -> float:
    c = load_controller(cc.RESULTS / "controller_profile", "", None, 4, 64)
    rng = random.Random(load)
    batches = [[(4, min(int(rng.expovariate(0.5)), 4)) for _ in range(load)] for _ in range(64)]
    from tabletune.controller.estimator import StepObservation

    runs = []
    for _ in range(5):
        t0 = time.thread_time()
        for i in range(steps):
            obs = StepObservation.from_drafts(load, 4, batches[i % 64], time_s=i * 0.01, k_max=4)
            c.observe(obs)
            c.maybe_rebuild(i * 0.01)
            c.explore_next(load)
        runs.append((time.thread_time() - t0) / steps * 1e6)
    return min(runs)


def main() -> None:
    rows = [{"load": b, "per_step_us": round(per_step_us(b), 2)} for b in (4, 16, 64)]
    md = ["# Controller per-step cost outside vLLM (thread CPU time, min of 5 x 2000 steps)", "",
          "`python benchmarks/controller_overhead_micro.py`", "", "| load | per-step us |", "|---|---|"]
    md += [f"| {r['load']} | {r['per_step_us']} |" for r in rows] + [""]
    cc.write_results("controller_overhead_micro", {"rows": rows}, "\n".join(md))


if __name__ == "__main__":
    main()
