"""GPU time per kernel of one step, per engine setting (GPU diagnostic, about a minute with a warm Triton cache).

For each (b, k) and each setting (engine attributes, e.g. the fused-norm layers) this prints the CUPTI kernel
breakdown of one eager step and the GPU time of the same step replayed from a CUDA graph (median of 15), so that a
variant that is slower as a whole shows which kernel is. With ``--replay-trace`` also the kernels of one graph
replay (CUPTI timestamps): busy time, idle time between kernels, the largest gaps and the kernel after each, and
the kernel totals inside the replay (a kernel can run slower there than eagerly: PDL overlap, early launches).
8B shape, random bf16 weights.

    python benchmarks/engine_step_breakdown.py --cells 1:0,8:1 --replay-trace --out $OUT/breakdown
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from engine_roofline import (capture_variants, engine_settings, kernel_breakdown, parse_cells,  # noqa: E402
                             variant_compare)

from tabletune.engine.profiling import build_engine, write_diagnostic  # noqa: E402

SETTINGS = {"standard": {"fuse_norm_max_rows": 0}, "fused-norm": {"fuse_norm_max_rows": 16},
            "cublas-only": {"gemm.enabled": False}}  # every GEMM torch.mm: cuBLAS's own pick


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--cells", default="1:0,8:1")
    ap.add_argument("--replay-trace", action="store_true", help="also trace one graph replay per cell and setting")
    ap.add_argument("--settings", default="standard,fused-norm", help=f"a subset of {','.join(SETTINGS)}, the "
                    "first the baseline")
    ap.add_argument("--out", default="breakdown")
    args = ap.parse_args(argv)
    settings = {name: SETTINGS[name] for name in args.settings.split(",") if name in SETTINGS}
    if list(settings) != args.settings.split(","):
        raise SystemExit(f"engine_step_breakdown.py: --settings {args.settings!r}: names are {','.join(SETTINGS)}")
    cells = parse_cells(args.cells)
    buckets = tuple(sorted({b for b, _ in cells}))
    engine = build_engine(args.model, "replay", max(k for _, k in cells), max(buckets), args.context,
                          buckets=buckets)
    lines, rows = [], []
    for b, k in cells:
        for name, setting in settings.items():
            with engine_settings(engine, setting):
                kernel_breakdown(engine, b, k, args.context)  # warm-up: choices and compiles outside the profile
                part = kernel_breakdown(engine, b, k, args.context, top=16)
            lines += [f"[{name}] " + part[0]] + part[1:]
            print("\n".join(lines[-len(part):]), flush=True)
            if args.replay_trace:
                trace = replay_trace(engine, b, k, args.context, setting)
                lines += [f"[{name}] " + trace[0]] + trace[1:]
                print("\n".join(lines[-len(trace):]), flush=True)
    compared, rows = variant_compare(engine, cells, args.context, lambda b: settings)
    lines += compared
    write_diagnostic(args.out, lines, rows=rows)
    return 0


def replay_trace(engine, b: int, k: int, context_len: int, settings: dict, top: int = 8) -> list[str]:
    """The kernels of one replay of the step graph (captured with ``settings``): busy and idle time, the largest
    gaps between one kernel's end and the next one's start, and the GPU time per kernel name."""
    from torch.profiler import ProfilerActivity, profile

    graph = capture_variants(engine, b, k, {"trace": settings}, upload=False)["trace"]
    engine.reset_rows(b, context_len)
    graph.replay()
    torch.cuda.synchronize()
    engine.reset_rows(b, context_len)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((ev.time_range.start, ev.time_range.end, ev.name[:50]) for ev in prof.events()
                     if ev.device_type.name == "CUDA")
    if not kernels:
        return [f"replay of b={b} k={k}: no kernel events (CUPTI saw none inside the graph)"]
    busy = sum(end - start for start, end, _ in kernels)
    span = max(end for _, end, _ in kernels) - kernels[0][0]
    gaps = sorted(((kernels[i][0] - kernels[i - 1][1], kernels[i - 1][2], kernels[i][2])
                   for i in range(1, len(kernels))), reverse=True)
    idle = sum(max(0.0, g) for g, _, _ in gaps)
    lines = [f"replay of b={b} k={k}: {len(kernels)} kernels over {span / 1e3:.3f} ms, busy {busy / 1e3:.3f} ms, "
             f"idle between kernels {idle / 1e3:.3f} ms, overlapped {max(0.0, busy - span + idle) / 1e3:.3f} ms"]
    lines += [f"  gap {g:7.2f} us  {before} -> {after}" for g, before, after in gaps[:top]]
    totals: dict[str, list[float]] = {}
    for start, end, name in kernels:
        totals.setdefault(name, []).append(end - start)
    for name, us in sorted(totals.items(), key=lambda t: -sum(t[1]))[:top]:
        lines.append(f"  {sum(us) / 1e3:7.3f} ms {len(us):5d}x  {name}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
