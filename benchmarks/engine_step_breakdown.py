"""GPU time per kernel of one step, per engine setting (GPU diagnostic, about a minute with a warm Triton cache).

For each (b, k) and each setting (engine attributes, e.g. the fused-norm layers) this prints the CUPTI kernel
breakdown of one eager step and the GPU time of the same step replayed from a CUDA graph (median of 15), so that a
variant that is slower as a whole shows which kernel is. 8B shape, random bf16 weights.

    python benchmarks/engine_step_breakdown.py --cells 1:0,8:1 --out $OUT/breakdown
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_roofline import engine_settings, kernel_breakdown, variant_compare  # noqa: E402

from tabletune.engine.profiling import build_engine, write_diagnostic  # noqa: E402

SETTINGS = {"standard": {"fuse_norm_max_rows": 0}, "fused-norm": {"fuse_norm_max_rows": 16}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--cells", default="1:0,8:1")
    ap.add_argument("--out", default="breakdown")
    args = ap.parse_args(argv)
    cells = [tuple(int(v) for v in c.split(":")) for c in args.cells.split(",")]
    buckets = tuple(sorted({b for b, _ in cells}))
    engine = build_engine(args.model, "replay", max(k for _, k in cells), max(buckets), args.context,
                          buckets=buckets)
    lines, rows = [], []
    for b, k in cells:
        for name, settings in SETTINGS.items():
            with engine_settings(engine, settings):
                kernel_breakdown(engine, b, k, args.context)  # warm-up: choices and compiles outside the profile
                part = kernel_breakdown(engine, b, k, args.context, top=16)
            lines += [f"[{name}] " + part[0]] + part[1:]
            print("\n".join(lines[-len(part):]), flush=True)
    compared, rows = variant_compare(engine, cells, args.context, lambda b: SETTINGS)
    lines += compared
    write_diagnostic(args.out, lines, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
