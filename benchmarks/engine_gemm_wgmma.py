"""The Gluon wgmma GEMM (``tabletune.engine.gemm_wgmma``) against cuBLAS at the decode shapes of M = 16-256 rows
(GPU diagnostic, Hopper).

For each projection of the model's layer and each M: cuBLAS at M and at M padded to 64 / 128 rows (the faster),
the engine's chooser pick (``gemm.linear`` after its own timing), and every ``gemm_wgmma.configs(M)`` candidate,
each checked against torch on two fresh inputs first (relative error, and the second call catches a ticket counter
left set by the first); the best split-K config and the best stream-K config (``WgmmaConfig.programs``) are
reported too. Timing as ``engine_gemm_midm.py``: 10 calls captured in a CUDA graph over 3 copies of the
weight (L2-cold), best of 5 replays. The best candidate is timed again launched with PDL (``pdl``: back to back,
so each call's first W tiles are asked for while the previous call ends, as they would be after the kernel before
it in the step).

    python benchmarks/engine_gemm_wgmma.py --out $OUT/gemm_wgmma

``--fixed-cost M``: the o projection's N = 4096 rows at K = 512 ... 16384 columns (4-134 MB of W) and M rows, cuBLAS
and the best candidate of each K (alone and launched with PDL), and a least-squares line time = fixed + bytes / rate
through each: the intercept is what one launch costs beyond streaming its weights. The weights rotate through
copies of at least 180 MB, so that every point reads W from HBM.
"""

from __future__ import annotations

import argparse
import time

import torch

from tabletune import fileio
from tabletune.engine import gemm, gemm_wgmma

# a sibling script: benchmarks/ is sys.path[0] when run
from engine_gemm_sweep import add_layer_shape_args, layer_shapes, padded_cublas, rotating_weights


def check(m: int, n: int, k: int, w: torch.Tensor, cfg, use_pdl: bool = False) -> float:
    """The larger relative error of two calls on fresh inputs (NaN or inf anywhere: inf)."""
    worst = 0.0
    for _ in range(2):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        y = gemm_wgmma.wgmma_linear(x, w, cfg, use_pdl)
        torch.cuda.synchronize()
        if not torch.isfinite(y).all():
            return float("inf")
        worst = max(worst, gemm._rel_err(y, torch.mm(x.float(), w.float().t())))
    return worst


def sweep(args, shapes: dict) -> list[dict]:
    rows = []
    for name, (n, kk) in shapes.items():
        ws, pick = rotating_weights(n, kk)
        for m in (int(v) for v in args.ms.split(",")):
            xs, cublas = padded_cublas(m, kk, pick)
            engine = gemm._time_us(lambda: gemm.linear(xs[m], pick())) if args.engine else float("nan")
            best, best_cfg, failed = float("inf"), None, []
            family = {"split": (float("inf"), None), "stream_k": (float("inf"), None)}  # best of each kernel
            for cfg in gemm_wgmma.configs(m) + gemm_wgmma.stream_k_configs(m):
                t0 = time.time()
                try:
                    err = check(m, n, kk, ws[0], cfg)
                except Exception as exc:  # a config this Triton cannot compile or launch: say so, go on
                    failed.append(f"{tuple(cfg)}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                    continue
                if err > gemm.MAX_REL_ERR:
                    failed.append(f"{tuple(cfg)}: relative error {err:.2e}")
                    continue
                us = gemm._time_us(lambda: gemm_wgmma.wgmma_linear(xs[m], pick(), cfg))
                if args.verbose:
                    print(f"  {name} M={m} {tuple(cfg)}: {us:.1f} us (err {err:.1e}, {time.time() - t0:.1f} s)",
                          flush=True)
                if us < best:
                    best, best_cfg = us, cfg
                fam = "stream_k" if cfg.programs else "split"
                if us < family[fam][0]:
                    family[fam] = (us, cfg)
            pdl = float("inf")
            if best_cfg and check(m, n, kk, ws[0], best_cfg, use_pdl=True) <= gemm.MAX_REL_ERR:
                pdl = gemm._time_us(lambda: gemm_wgmma.wgmma_linear(xs[m], pick(), best_cfg, use_pdl=True))
            nbytes = n * kk * 2
            row = {"proj": name, "m": m, "n": n, "k": kk, "stream_us": round(nbytes / args.stream_tbs / 1e6, 2),
                   "cublas_us": round(cublas, 2), "engine_us": round(engine, 2), "wgmma_us": round(best, 2),
                   "wgmma_pdl_us": round(pdl, 2), "config": list(best_cfg) if best_cfg else None,
                   **{f"{fam}_us": round(us, 2) for fam, (us, _) in family.items()},
                   **{f"{fam}_config": list(c) if c else None for fam, (_, c) in family.items()},
                   "failed": failed}
            rows.append(row)
            print(f"{name:8s} M={m:4d}: stream {row['stream_us']:5.1f}  cublas {cublas:6.1f}  engine {engine:6.1f}  "
                  f"wgmma {best:6.1f} ({nbytes / best / 1e6:4.2f} TB/s) pdl {pdl:6.1f}  {tuple(best_cfg or ())}  "
                  f"split {family['split'][0]:6.1f} stream-K {family['stream_k'][0]:6.1f}"
                  + (f"  [{len(failed)} failed: {failed[0]}]" if failed else ""), flush=True)
        del ws
    return rows


def fit_line(bytes_: list[float], us: list[float]) -> tuple[float, float]:
    """(intercept us, slope TB/s) of the least-squares line us = a + bytes / rate."""
    n = len(us)
    mx, my = sum(bytes_) / n, sum(us) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(bytes_, us)) / sum((x - mx) ** 2 for x in bytes_)
    return my - slope * mx, 1e-6 / slope


def fixed_cost(args, m: int) -> dict:
    n, ks = 4096, (512, 1024, 2048, 4096, 8192, 16384)
    rows = []
    for kk in ks:
        # copies enough for 3x the 60 MB L2 (the session-16 run used 3 copies: its K <= 2048 points read W from L2)
        ws, pick = rotating_weights(n, kk, copies=max(3, -(-180_000_000 // (n * kk * 2))))
        x = torch.randn(m, kk, dtype=torch.bfloat16, device="cuda")
        cublas = gemm._time_us(lambda: torch.mm(x, pick().t()))
        best, best_cfg = float("inf"), None
        for cfg in gemm_wgmma.configs(m):
            if check(m, n, kk, ws[0], cfg) > gemm.MAX_REL_ERR:
                continue
            us = gemm._time_us(lambda: gemm_wgmma.wgmma_linear(x, pick(), cfg))
            if us < best:
                best, best_cfg = us, cfg
        pdl = gemm._time_us(lambda: gemm_wgmma.wgmma_linear(x, pick(), best_cfg, use_pdl=True))
        rows.append({"k": kk, "w_bytes": n * kk * 2, "cublas_us": round(cublas, 2), "wgmma_us": round(best, 2),
                     "wgmma_pdl_us": round(pdl, 2), "config": list(best_cfg)})
        print(f"fixed cost M={m} K={kk:6d} ({n * kk * 2 / 1e6:6.1f} MB): cublas {cublas:6.1f} us, wgmma {best:6.1f} "
              f"us, wgmma PDL {pdl:6.1f} us {tuple(best_cfg)}", flush=True)
        del ws
    fits = {}
    for col in ("cublas_us", "wgmma_us", "wgmma_pdl_us"):
        a, rate = fit_line([r["w_bytes"] for r in rows], [r[col] for r in rows])
        fits[col] = {"fixed_us": round(a, 2), "rate_tb_s": round(rate, 3)}
        print(f"fixed cost M={m} {col:13s}: {a:5.2f} us + bytes / {rate:4.2f} TB/s", flush=True)
    return {"m": m, "n": n, "rows": rows, "fits": fits}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layer_shape_args(ap, ms="16,32,64,96,128,192,256")
    ap.add_argument("--verbose", action="store_true", help="print every candidate's time")
    ap.add_argument("--engine", action="store_true", help="also time the engine's own pick (its chooser runs first)")
    ap.add_argument("--fixed-cost", default="", help="comma-separated M: only the fixed-cost sweep over K")
    ap.add_argument("--out", default="gemm_wgmma")
    args = ap.parse_args(argv)
    if not gemm_wgmma.available():
        raise SystemExit("this Triton has no Gluon")
    if args.fixed_cost:
        runs = [fixed_cost(args, int(m)) for m in args.fixed_cost.split(",")]
        fileio.write_json(args.out + ".json", {"gpu": torch.cuda.get_device_name(), "runs": runs})
        return 0
    shapes = layer_shapes(args)
    rows = sweep(args, shapes)
    fileio.write_json(args.out + ".json", {"model": args.model, "gpu": torch.cuda.get_device_name(),
                                           "triton": __import__("triton").__version__, "rows": rows})
    lines = ["| proj | M | streaming | cuBLAS | engine pick | wgmma | wgmma, PDL | config (W rows, K, split, stages, "
             "warps) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['proj']} | {r['m']} | {r['stream_us']} | {r['cublas_us']} | {r['engine_us']} | "
                     f"{r['wgmma_us']} | {r['wgmma_pdl_us']} | {r['config']} |")
    fileio.write_text(args.out + ".md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
