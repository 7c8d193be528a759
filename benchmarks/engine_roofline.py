"""Step time over the roofline floor for the built-in engine (GPU, one invocation).

Measures the copy bandwidth and the bf16 matrix rate before and after the grid (the floor uses the higher reading
of each), then times the verify step (target forward over q = k + 1 tokens, LM head, greedy verification, state
update; the replay drafter costs a gather) of a random-weight model for every b in 1, 2, 4, ..., max_batch and k in
0..k_max, and reports step / floor with floor = max(bytes / bandwidth, FLOPs / matrix rate)
(``tabletune.engine.profiling``), the GPU time of the graph replay alone, and step / serial floor (attention and
the GEMMs not overlapped).

    python benchmarks/engine_roofline.py --model qwen3-8b --context 1024 --out benchmarks/results/engine_roofline
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from tabletune import fileio
from tabletune.engine.profiling import (ENGINE_VERSION, Ceilings, build_engine, command_line, device_name,
                                        measure_ceilings, serial_floor_ms, step_floor_ms, time_replays_gpu,
                                        time_steps)
from tabletune.padding import geometric_batch_sizes


def grid(engine, buckets, k_max: int, context_len: int, steps: int) -> list[tuple[int, int, list[float], float]]:
    """(b, k, wall ms samples, median GPU ms of the replay) of every cell."""
    timed = []
    for b in buckets:
        engine.set_context(b, context_len)
        for k in range(k_max + 1):
            samples = time_steps(engine, b, k, steps, context_len)
            gpu_ms = statistics.median(time_replays_gpu(engine, b, k, steps, context_len))
            timed.append((b, k, samples, gpu_ms))
        print(f"b={b:4d} " + " ".join(f"k{k}:{statistics.median(s):7.2f}ms" for _, k, s, _ in timed[-k_max - 1:]),
              flush=True)
    return timed


def rows_of(timed, cfg, context_len: int, ceil: Ceilings) -> list[dict]:
    rows = []
    for b, k, samples, gpu_ms in timed:
        ms = statistics.median(samples)
        floor, serial = step_floor_ms(cfg, b, k, context_len, ceil), serial_floor_ms(cfg, b, k, context_len, ceil)
        rows.append({"batch_size": b, "k": k, "step_ms": round(ms, 4), "gpu_ms": round(gpu_ms, 4),
                     "floor_ms": round(floor, 4), "ratio": round(ms / floor, 3), "gpu_ratio": round(gpu_ms / floor, 3),
                     "serial_floor_ms": round(serial, 4), "serial_ratio": round(ms / serial, 3)})
    return rows


def write_results(out: str, args, ceil: Ceilings, readings, rows: list[dict], device: str, buckets,
                  choices: dict[str, str]) -> None:
    small = [r for r in rows if r["batch_size"] == 1]
    ratios = [r["ratio"] for r in rows]
    summary = {"ratio_range": [min(ratios), max(ratios)],
               "ratio_range_b1": [min(r["ratio"] for r in small), max(r["ratio"] for r in small)] if small else None}
    fileio.write_json(out + ".json", {
        "device": device, "model": args.model, "dtype": "bfloat16", "context_len": args.context,
        "engine_version": ENGINE_VERSION, "drafter": "replay", "bandwidth_gb_s": round(ceil.bandwidth_gb_s, 1),
        "matrix_tflop_s": round(ceil.matrix_tflop_s, 1), **summary,
        "ceiling_readings": [{"bandwidth_gb_s": round(c.bandwidth_gb_s, 1),
                              "matrix_tflop_s": round(c.matrix_tflop_s, 1)} for c in readings],
        "command": command_line(os.environ.get("OUT")), "rows": rows, "gemm_choices": choices})
    md = [f"# Step / roofline floor: {args.model}, context {args.context}, {device}, engine {ENGINE_VERSION}", "",
          f"Copy {ceil.bandwidth_gb_s:.0f} GB/s, bf16 matmul {ceil.matrix_tflop_s:.0f} TFLOP/s. Step / floor "
          f"{summary['ratio_range'][0]:.2f}-{summary['ratio_range'][1]:.2f}x"
          + (f", b = 1: {summary['ratio_range_b1'][0]:.2f}-{summary['ratio_range_b1'][1]:.2f}x." if small else "."),
          "", "Cells: wall ms a step (wall / floor, GPU replay / floor, wall / serial floor).", "",
          "| b | " + " | ".join(f"k={k}" for k in range(args.k_max + 1)) + " |", "|---|" + "---|" * (args.k_max + 1)]
    for b in buckets:
        md.append(f"| {b} | " + " | ".join(
            f"{r['step_ms']:.2f} ({r['ratio']:.2f}x, {r['gpu_ratio']:.2f}x, {r['serial_ratio']:.2f}x)"
            for r in rows if r["batch_size"] == b) + " |")
    md += ["", f"Command: `{command_line(os.environ.get('OUT'))}`"]
    fileio.write_text(out + ".md", "\n".join(md) + "\n")
    print("\n".join(md), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--buckets", default="", help="batch sizes to capture and time (default: 1, 2, 4, ..., max-batch)")
    ap.add_argument("--out", default="benchmarks/results/engine_roofline")
    args = ap.parse_args(argv)
    first = measure_ceilings()
    print(f"ceilings: copy {first.bandwidth_gb_s:.0f} GB/s, bf16 matmul {first.matrix_tflop_s:.0f} TFLOP/s", flush=True)
    buckets = tuple(int(v) for v in args.buckets.split(",")) if args.buckets else \
        tuple(geometric_batch_sizes(args.max_batch))
    t0 = time.perf_counter()
    engine = build_engine(args.model, "replay", args.k_max, max(buckets), args.context, buckets=buckets)
    print(f"built + captured {len(engine.graphs)} graphs in {time.perf_counter() - t0:.1f} s", flush=True)
    timed = grid(engine, buckets, args.k_max, args.context, args.steps)
    readings = [first, measure_ceilings()]
    ceil = Ceilings(max(c.bandwidth_gb_s for c in readings), max(c.matrix_tflop_s for c in readings))
    rows = rows_of(timed, engine.target.cfg, args.context, ceil)
    gemm = getattr(engine.target.ops, "gemm", None)  # the GEMM chooser's picks, "M N K gated" -> choice
    choices = {" ".join(map(str, key)): str(c) for key, c in sorted(gemm.choices.items())} if gemm else {}
    write_results(args.out, args, ceil, readings, rows, device_name(engine), buckets, choices)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
