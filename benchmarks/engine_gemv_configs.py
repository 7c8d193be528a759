"""Would longer K tiles stream the skinny decode GEMMs faster? (GPU diagnostic, one call, a few minutes.)

At M <= 16 the engine's GEMMs stream their weights at 2.9-4.0 TB/s against a 4.2-4.3 TB/s copy rate, and the
small-N projections (o, qkv: N = 4096-6144, K = 4096) are the slowest: 11.8 us for the o weight's 33.5 MB,
about 3 µs over its copy time. Doubling N barely raises the rate (``engine_launch_cost.py``), so the loss is in
the steady state, not only a fixed cost a launch. The chooser's pointer configs read tiles of at most 256 K
columns (512 contiguous bytes a weight row a stage). This times, for each 8B decode shape at M = 1, 8 and 16,
the chooser's pick (``gemm.choose``, every candidate it has) against pointer configs of 16 or 32 weight rows and
512 or 1024 K columns (1-2 KB contiguous a row a stage), splits 1, 2, 4, with ``gemm._fastest``'s protocol
(results checked against torch, 10 calls in a CUDA graph, weights rotated over copies larger than L2), and
prints what the best of those would save per decode step (x 36 layers; the LM head once).

    python benchmarks/engine_gemv_configs.py --out $OUT/gemv_configs
"""

from __future__ import annotations

import argparse

import torch

from tabletune.engine import gemm
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import write_diagnostic


def long_k_configs() -> list[gemm.Config]:
    """Pointer configs of one 16-row block with 1-2 KB contiguous a weight row a stage, fitting shared memory."""
    cands = [gemm.Config(16, bn, bk, s, w, st) for bn, bk, st in ((16, 512, 6), (16, 1024, 3), (32, 512, 4),
                                                                  (32, 1024, 2))
             for s in (1, 2, 4) for w in (4, 8)]
    return [c for c in cands if gemm.fits_smem(c)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--out", default="gemv_configs")
    args = ap.parse_args(argv)
    cfg = resolve(args.model)
    shapes = cfg.step_gemm_shapes()
    per_step = {"qkv": cfg.num_layers, "o": cfg.num_layers, "gate_up": cfg.num_layers, "down": cfg.num_layers,
                "lm_head": 1}
    extra = long_k_configs()
    lines, rows = [], []
    for m in (int(v) for v in args.rows.split(",")):
        saved_us = 0.0
        for name, (n, k) in shapes.items():
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
            pick = gemm.choose(m, w)
            pick_us = gemm._scores((m, n, k, False))[pick]
            key = (m, n, k, "long-k")
            cands = {c: (lambda x, w_, c=c: gemm.triton_linear(x, w_, c)) for c in extra}
            best = gemm._fastest(key, w, k, cands, gemm._reference(False))
            best_us = gemm._scores(key)[best]
            gain = max(0.0, pick_us - best_us) * per_step[name]
            saved_us += gain
            gbs = n * k * 2 / best_us / 1e3
            lines.append(f"M={m:2d} {name:8s} N={n:6d} K={k:5d}: chooser {pick} {pick_us:7.2f} us; best long-K "
                         f"{tuple(best)[:6]} {best_us:7.2f} us ({gbs:.0f} GB/s); a step saves {gain:6.1f} us")
            print(lines[-1], flush=True)
            rows.append({"m": m, "gemm": name, "n": n, "k": k, "chooser": str(pick), "chooser_us": round(pick_us, 2),
                         "long_k": list(best)[:6], "long_k_us": round(best_us, 2),
                         "all_long_k_us": {str(tuple(c)[:6]): round(t, 2) for c, t in gemm._scores(key).items()}})
            del w
        lines.append(f"M={m:2d}: the best long-K config where it wins saves {saved_us / 1e3:.3f} ms a decode step")
        print(lines[-1], flush=True)
    write_diagnostic(args.out, lines, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
