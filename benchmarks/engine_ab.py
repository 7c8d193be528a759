"""Same-card A/B of two engine trees: step time of each cell, alternating rounds, one engine process a side.

Each side runs this file as a worker (``--worker``) with ``PYTHONPATH`` at its own tree: it builds the engine the
way every engine version builds it (``Decoder``, the replay drafter, ``EngineConfig`` with only the cells' buckets
and k values), says READY, and on each ``measure`` line times every cell (``profiling.time_steps``: wall time from
the upload to the read-back, each sample from the same context) and prints one RESULT line. The parent starts both
workers one after the other (their start-ups do not overlap), then asks them in turn, ABBA order, and reports per
cell the median of all rounds' samples of each side and the change, with the gate: median change <= +2%, no cell
slower by more than 5%.

    python benchmarks/engine_ab.py --before .ab/before --after .ab/after --out $OUT/engine_ab
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODEL, CONTEXT, K_MAX = "qwen3-8b", 1024, 7
BATCHES, KS = (1, 8, 32, 128), (0, 3, 7)
MEDIAN_LIMIT, CELL_LIMIT = 0.02, 0.05


def worker(steps: int, model: str, device: str) -> None:
    """Build this tree's engine, then answer ``measure`` lines with the cells' step times (ms) until ``quit``."""
    import torch

    from tabletune.engine.drafters import make_drafter
    from tabletune.engine.model import Decoder
    from tabletune.engine.presets import resolve
    from tabletune.engine.profiling import ENGINE_VERSION, time_steps
    from tabletune.engine.runner import EngineConfig, SpecEngine

    t0 = time.perf_counter()
    torch.manual_seed(0)
    target = Decoder(resolve(model), torch.bfloat16, device)
    ecfg = EngineConfig(max_num_seqs=max(BATCHES), max_len=CONTEXT + K_MAX + 16, k_max=K_MAX, buckets=BATCHES, ks=KS)
    engine = SpecEngine(target, make_drafter("replay", target, K_MAX), ecfg)
    ready = {"engine_version": ENGINE_VERSION, "build_s": round(time.perf_counter() - t0, 1),
             "device": torch.cuda.get_device_name() if device == "cuda" else device}
    print("READY " + json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() != "measure":
            break
        cells = {}
        for b in BATCHES:
            engine.set_context(b, CONTEXT)
            for k in KS:
                cells[f"{b}:{k}"] = [round(s, 4) for s in time_steps(engine, b, k, steps, CONTEXT)]
        print("RESULT " + json.dumps(cells), flush=True)


def _read(proc, tag: str) -> dict:
    """The JSON of the worker's next line that starts with ``tag`` (other lines are echoed)."""
    for line in proc.stdout:
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
        print("  | " + line.rstrip(), flush=True)
    raise RuntimeError(f"worker ended before {tag} (exit {proc.wait()})")


def start_worker(tree: str, args) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), PYTHONUNBUFFERED="1")
    argv = ["--worker", "--steps", str(args.steps), "--model", args.model, "--device", args.device]
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.path.abspath(tree))
    return proc, _read(proc, "READY")


def summarize(samples: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Per cell: each side's median over all its rounds' samples and the change after / before - 1."""
    rows = []
    for cell in samples["before"]:
        b, k = (int(v) for v in cell.split(":"))
        before, after = (statistics.median(samples[side][cell]) for side in ("before", "after"))
        rows.append({"batch_size": b, "k": k, "before_ms": round(before, 4), "after_ms": round(after, 4),
                     "change": round(after / before - 1, 4)})
    return rows


def write(out: str, rows: list[dict], meta: dict) -> None:
    changes = [r["change"] for r in rows]
    median, worst = statistics.median(changes), max(rows, key=lambda r: r["change"])
    gate = median <= MEDIAN_LIMIT and worst["change"] <= CELL_LIMIT
    result = {**meta, "median_change": round(median, 4), "worst_cell": worst, "gate_passed": gate, "rows": rows}
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    md = [f"# Engine A/B: {meta['model']}, context {meta['context_len']}, {meta['device']}", "",
          f"before: engine {meta['before']['engine_version']} ({meta['before_tree']}); after: engine "
          f"{meta['after']['engine_version']}; {meta['rounds']} rounds a side ({meta['order']}), "
          f"{meta['steps']} steps a cell a round; wall ms a step, median of all samples.", "",
          "| b | k | before ms | after ms | change |", "|---|---|---|---|---|"]
    md += [f"| {r['batch_size']} | {r['k']} | {r['before_ms']:.3f} | {r['after_ms']:.3f} | {r['change']:+.1%} |"
           for r in rows]
    md += ["", f"Median change {median:+.1%}; worst cell b={worst['batch_size']} k={worst['k']} "
           f"{worst['change']:+.1%}; gate (median <= +{MEDIAN_LIMIT:.0%}, no cell > +{CELL_LIMIT:.0%}): "
           f"{'passed' if gate else 'FAILED'}.", "", f"Command: `{meta['command']}`"]
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--before", default=".ab/before")
    ap.add_argument("--after", default=".ab/after")
    ap.add_argument("--before-label", default="681b912")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=4, help="measure rounds a side, in ABBA order")
    ap.add_argument("--out", default="benchmarks/results/engine_ab")
    ap.add_argument("--model", default=MODEL, help="another shape only to try the script (the gate is the 8B's)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.worker:
        worker(args.steps, args.model, args.device)
        return 0
    command = " ".join(["python"] + sys.argv)
    out_dir = os.environ.get("OUT")
    command = command.replace(out_dir, "$OUT") if out_dir else command
    procs, ready = {}, {}
    for side, tree in (("before", args.before), ("after", args.after)):
        procs[side], ready[side] = start_worker(tree, args)
        print(f"{side}: {ready[side]}", flush=True)
    order = [("before", "after") if i % 2 == 0 else ("after", "before") for i in range(args.rounds)]
    order = [side for pair in order for side in pair]
    samples = {"before": {}, "after": {}}
    meta = {"model": args.model, "dtype": "bfloat16", "context_len": CONTEXT, "drafter": "replay", "k_max": K_MAX,
            "device": ready["before"]["device"], "before_tree": args.before_label, "before": ready["before"],
            "after": ready["after"], "steps": args.steps, "rounds": args.rounds,
            "order": "".join("B" if s == "before" else "A" for s in order), "command": command}
    for i, side in enumerate(order):
        procs[side].stdin.write("measure\n")
        procs[side].stdin.flush()
        for cell, times in _read(procs[side], "RESULT").items():
            samples[side].setdefault(cell, []).extend(times)
        print(f"round {i + 1}/{len(order)} {side} done", flush=True)
        if all(samples.values()) and i % 2 == 1:  # a partial result after every pair of rounds
            write(args.out, summarize(samples), meta)
    for proc in procs.values():
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
