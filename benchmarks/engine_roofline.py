"""Step time over the roofline floor for the built-in engine (GPU, one invocation).

Measures the copy bandwidth and the bf16 matrix rate before and after the grid (the floor uses the higher reading
of each), then times the verify step (target forward over q = k + 1 tokens, LM head, greedy verification, state
update; the replay drafter costs a gather) of a random-weight model for every b in 1, 2, 4, ..., max_batch and k in
0..k_max, and reports step / floor, the GPU time of the graph replay alone, and step / serial floor (attention and
the GEMMs not overlapped). The floor of one verify step of b sequences with q = k + 1 tokens each at context c:

    bytes(b, k)  = weights read once + KV read = W + b * (c + q) * kv_bytes_per_token
    flops(b, k)  = 2 * P_matmul * b * q + 4 * b * q * (c + q) * H * D * layers
    floor(b, k)  = max(bytes / bandwidth, flops / matrix_rate)

W counts every weight a step reads: all layers and the LM head, not the embedding table (a step gathers b * q of
its rows). For MoE only the routed experts count, at most min(E, b * q * top_k) of them per layer.

    python benchmarks/engine_roofline.py --model qwen3-8b --context 1024 --out benchmarks/results/engine_roofline
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import torch

from tabletune import fileio
from tabletune.engine.presets import ModelConfig
from tabletune.engine.profiling import ENGINE_VERSION, build_engine, command_line, device_name, time_steps
from tabletune.engine.runner import SpecEngine
from tabletune.padding import geometric_batch_sizes


@dataclass(frozen=True)
class Ceilings:
    bandwidth_gb_s: float  # device copy, bytes read + written
    matrix_tflop_s: float  # bf16 8192^3 matmul


def measure_ceilings(device: str = "cuda") -> Ceilings:
    """A 4 GiB device copy and a bf16 8192^3 matmul, median of timed repeats."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.float32, device=device).normal_()
    b = torch.empty_like(a)
    copy_ms = _median_ms(lambda: b.copy_(a), 20)
    del a, b
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    mm_ms = _median_ms(lambda: x @ y, 20)
    return Ceilings(2 * 4 * n / copy_ms / 1e6, 2 * 8192 ** 3 / mm_ms / 1e9)


def _median_ms(fn, reps: int, inner: int = 1) -> float:
    """Median over ``reps`` of the mean time of ``inner`` back-to-back calls (queued, so launches overlap)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    return sorted(times)[len(times) // 2]


def weight_bytes(cfg: ModelConfig, tokens: int, dtype_bytes: int = 2) -> int:
    """Weights one step reads for ``tokens`` tokens: layers + LM head (MoE: routed experts only)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * d * h
    if cfg.is_moe:
        experts = min(cfg.num_experts, tokens * cfg.num_experts_per_tok)
        mlp = experts * 3 * h * cfg.moe_intermediate_size + cfg.num_experts * h
    else:
        mlp = 3 * h * cfg.intermediate_size
    return (cfg.num_layers * (attn + mlp) + cfg.vocab_size * h) * dtype_bytes


def _parts(cfg: ModelConfig, batch_size: int, k: int, context_len: int) -> tuple[float, float, float, float]:
    """(weight bytes, GEMM FLOPs, KV bytes, attention FLOPs) of one step."""
    q = k + 1
    tokens = batch_size * q
    kv = batch_size * (context_len + q) * cfg.kv_bytes_per_token()
    active = cfg.num_params(active_only=True) - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_embeddings else 1)
    attn_flops = 4 * tokens * (context_len + q) * cfg.num_heads * cfg.head_dim * cfg.num_layers
    return weight_bytes(cfg, tokens), 2 * active * tokens, kv, attn_flops


def step_floor_ms(cfg: ModelConfig, batch_size: int, k: int, context_len: int, ceil: Ceilings) -> float:
    w, f_gemm, kv, f_attn = _parts(cfg, batch_size, k, context_len)
    return max((w + kv) / ceil.bandwidth_gb_s / 1e6, (f_gemm + f_attn) / ceil.matrix_tflop_s / 1e9)


def serial_floor_ms(cfg: ModelConfig, batch_size: int, k: int, context_len: int, ceil: Ceilings) -> float:
    """Floor of an engine that runs attention and the GEMMs one after the other (not overlapped):

        serial = max(W / bandwidth, F_gemm / rate) + max(KV / bandwidth, F_attn / rate)  >=  floor
    """
    w, f_gemm, kv, f_attn = _parts(cfg, batch_size, k, context_len)
    return (max(w / ceil.bandwidth_gb_s / 1e6, f_gemm / ceil.matrix_tflop_s / 1e9)
            + max(kv / ceil.bandwidth_gb_s / 1e6, f_attn / ceil.matrix_tflop_s / 1e9))


def time_replays_gpu(engine: SpecEngine, batch_size: int, k: int, num_steps: int, context_len: int) -> list[float]:
    """GPU time (ms, CUDA events) of the step's launch alone (the graph replay without the read-back), rows
    0 .. b-1 put back at ``context_len`` before each."""
    slots, out = list(range(batch_size)), []
    for _ in range(num_steps):
        engine.reset_rows(batch_size, context_len)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        engine.launch(slots, k)
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1))
    return out


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
