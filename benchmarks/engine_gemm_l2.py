"""Skinny decode GEMMs with the weight L2-cold vs L2-hot (GPU diagnostic).

The L2 prefetch of the o weight during attention (engine 0.5, ``EngineConfig.prefetch_max_batch``)
gave no gain at b <= 8, with 16, 64 or 128 prefetch programs. This asks the question under it:
does the engine's chosen GEMM for a projection at M = 1, 8, 16 run faster at all when its weight
is already in L2? Each is timed as 10 calls in a CUDA graph (``gemm._time_us``), once rotating
over copies of the weight that together exceed L2 (cold, as in the model) and once on one copy
(hot when it fits in L2: the 8B o and qkv weights are 32 and 48 MB, the H200's L2 is 50 MB).
If hot is not much faster than cold, the kernel is bound by latency or issue rate, not by DRAM.

    python benchmarks/engine_gemm_l2.py --out $OUT/gemm_l2
"""

from __future__ import annotations

import argparse

import torch

from tabletune.engine import gemm
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import write_diagnostic


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--out", default="gemm_l2")
    ap.add_argument("--sweep", action="store_true", help="also time configs outside the chooser's set (o, qkv, M=1)")
    args = ap.parse_args(argv)
    cfg = resolve(args.model)
    shapes = cfg.layer_gemm_shapes()
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    rows, lines = [], []
    for name, (n, kk) in shapes.items():
        w = torch.randn(n, kk, dtype=torch.bfloat16, device="cuda") * 0.02
        copies = [w] + [torch.randn_like(w) * 0.02 for _ in range(max(1, -(-3 * l2_bytes // w.nbytes)))]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, kk, dtype=torch.bfloat16, device="cuda")
            choice = gemm.choose(m, w)
            i = [0]

            def cold():
                i[0] = (i[0] + 1) % len(copies)
                return gemm._run(x, copies[i[0]], choice)
            cold_us = gemm._time_us(cold)
            hot_us = gemm._time_us(lambda: gemm._run(x, w, choice))
            tb = w.nbytes / 1e6
            row = {"proj": name, "m": m, "n": n, "k": kk, "choice": str(choice), "weight_mb": round(w.nbytes / 2**20, 1),
                   "cold_us": round(cold_us, 2), "hot_us": round(hot_us, 2),
                   "cold_tb_s": round(tb / cold_us, 3), "hot_tb_s": round(tb / hot_us, 3)}
            rows.append(row)
            lines.append(f"{name:8s} M={m:3d} ({row['weight_mb']:6.1f} MB, {choice}): cold {cold_us:6.1f} us "
                         f"({row['cold_tb_s']:.2f} TB/s), hot {hot_us:6.1f} us ({row['hot_tb_s']:.2f} TB/s), "
                         f"hot/cold {hot_us / cold_us:.2f}")
            print(lines[-1], flush=True)
    sweep = []
    if args.sweep:  # configs outside the chooser's set, for the small projections at M = 1 (weights cold)
        for name in ("o", "qkv"):
            n, kk = shapes[name]
            copies = [torch.randn(n, kk, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(4)]
            x = torch.randn(1, kk, dtype=torch.bfloat16, device="cuda")
            i = [0]

            def nxt():
                i[0] = (i[0] + 1) % len(copies)
                return copies[i[0]]
            results = []
            for bn in (16, 32, 64):
                for bk in (128, 256):
                    for warps in (4, 8):
                        for stages in (4, 8):
                            if not gemm.fits_smem(gemm.Config(16, bn, bk, 1, warps, stages)):
                                continue
                            for split in (1, 2, 4):
                                c = gemm.Config(16, bn, bk, split, warps, stages)
                                us = gemm._time_us(lambda: gemm.triton_linear(x, nxt(), c))
                                results.append((us, tuple(c)))
            results.sort()
            nbytes = n * kk * 2
            for us, c in results[:8]:
                sweep.append({"proj": name, "m": 1, "config": c, "us": round(us, 2),
                              "tb_s": round(nbytes / us / 1e6, 3)})
                lines.append(f"sweep {name} M=1 {c}: {us:.1f} us ({nbytes / us / 1e6:.2f} TB/s)")
                print(lines[-1], flush=True)
    write_diagnostic(args.out, lines, l2_bytes=l2_bytes, rows=rows, sweep=sweep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
