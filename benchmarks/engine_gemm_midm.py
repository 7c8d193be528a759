"""Mid-M decode GEMMs (GPU diagnostic): the TMA kernel as the chooser has it and with its tile computed as W x^T
(``Config.swap``), against cuBLAS.

At M = 64-256 rows (b = 16-32 with k >= 3) the N = 4096 / 6144 projections run at 1.4-2.3x their weight-streaming
time on cuBLAS and the Triton configs are slower still (benchmarks/results/engine_gemm_sweep_h200.md: o at M = 128
13.5 us on cuBLAS, 20.6 us on Triton, 7.5 us to stream its 33.5 MB). Each (projection, M) times cuBLAS at M and
at M padded to 64 / 128 rows, and every config of ``configs()`` (checked against torch first), as 10 calls in a
CUDA graph over 3 copies of the weight (L2-cold); the report gives the best of each family and its TB/s.

    python benchmarks/engine_gemm_midm.py --out $OUT/gemm_midm

``--ncu PROJ:M`` runs only the cuBLAS call and the best config of each family from ``--from`` (a JSON this script
wrote), 3 eager calls each, for ``ncu`` to profile (kernel names ``_gemm_tma_kernel`` and ``nvjet``).
"""

from __future__ import annotations

import argparse
import json

import torch

from tabletune import fileio
from tabletune.engine import gemm

# a sibling script: benchmarks/ is sys.path[0] when run
from engine_gemm_sweep import add_layer_shape_args, layer_shapes, padded_cublas, rotating_weights

FAMILIES = ("tma", "swap")


def configs(lean: bool = False) -> list[gemm.Config]:
    """The TMA candidates: the chooser's mid-M tiles, and W x^T tiles of 64-256 tokens; splits 1, 2, 4. ``lean``:
    also tiles of at most ~100 KB of pipeline, so that two or three programs share an SM (more programs in flight
    to even out the tail), plain and W x^T.

    Session 15 also timed each with the K loop as ``tl.range(..., warp_specialize=True)`` (Triton 3.6 on the H200:
    some configs failed to compile, others gave wrong sums or an illegal address that ended the CUDA context;
    benchmarks/results/engine_gemm_midm_h200_warp_spec.log), an option since removed."""
    plain = [(128, 128, 64, 8, 4), (64, 128, 64, 4, 6), (128, 256, 64, 8, 3)]
    swap = [(64, 128, 64, 4, 6), (128, 128, 64, 8, 4), (128, 64, 64, 4, 6), (256, 128, 64, 8, 3), (256, 64, 64, 4, 4)]
    out = []
    if lean:
        small = [(64, 128, 64, 4, 3), (64, 64, 64, 4, 4), (128, 64, 64, 4, 3), (128, 128, 64, 8, 2)]
        plain, swap = plain + small, swap + small
    for tiles, is_swap in ((plain, False), (swap, True)):
        for bm, bn, bk, warps, stages in tiles:
            for split in (1, 2, 4):
                out.append(gemm.Config(bm, bn, bk, split, warps, stages, True, 0, is_swap))
    return [c for c in out if gemm.fits_smem(c)]


def family(c: gemm.Config) -> str:
    return "swap" if c.swap else "tma"


def sweep(args, shapes: dict) -> list[dict]:
    rows = []
    cands = configs(args.lean)
    for name, (n, kk) in shapes.items():
        ws, pick = rotating_weights(n, kk)
        for m in (int(v) for v in args.ms.split(",")):
            xs, cublas = padded_cublas(m, kk, pick)
            ref = torch.mm(xs[m], ws[0].t()).float()
            best: dict[str, tuple[float, gemm.Config]] = {}
            for c in cands:
                try:
                    err = gemm._rel_err(gemm.triton_linear(xs[m], ws[0], c), ref)
                except Exception as exc:  # a config this Triton cannot compile or launch
                    print(f"{name} M={m} {tuple(c)}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                          flush=True)
                    continue
                if err > gemm.MAX_REL_ERR:
                    print(f"{name} M={m} {tuple(c)}: relative error {err:.2e}, dropped", flush=True)
                    continue
                us = gemm._time_us(lambda: gemm.triton_linear(xs[m], pick(), c))
                f = family(c)
                if us < best.get(f, (float("inf"),))[0]:
                    best[f] = (us, c)
            nbytes = n * kk * 2
            row = {"proj": name, "m": m, "n": n, "k": kk, "cublas_us": round(cublas, 2),
                   "stream_us": round(nbytes / args.stream_tbs / 1e6, 2),
                   **{f"{f}_us": round(best[f][0], 2) for f in FAMILIES if f in best},
                   "configs": {f: list(best[f][1]) for f in FAMILIES if f in best}}
            rows.append(row)
            line = f"{name:8s} M={m:4d}: cublas {cublas:6.1f}us ({nbytes / cublas / 1e6:4.2f} TB/s)  " + "  ".join(
                f"{f} {best[f][0]:6.1f}us ({nbytes / best[f][0] / 1e6:4.2f})" for f in FAMILIES if f in best)
            print(line + f"  streaming {row['stream_us']:.1f}us", flush=True)
        del ws
    return rows


def ncu_calls(args, shapes: dict) -> None:
    proj, m = args.ncu.split(":")
    m = int(m)
    n, kk = shapes[proj]
    row = next(r for r in json.load(open(args.source))["rows"] if r["proj"] == proj and r["m"] == m)
    x, w = torch.randn(m, kk, dtype=torch.bfloat16, device="cuda"), torch.randn(n, kk, dtype=torch.bfloat16,
                                                                                   device="cuda")
    for f, cfg in [("cublas", None)] + list(row["configs"].items()):
        for _ in range(3):
            y = torch.mm(x, w.t()) if cfg is None else gemm.triton_linear(
                x, w, gemm.Config(*cfg[:len(gemm.Config._fields)]))  # session 15's JSON has one more field
        torch.cuda.synchronize()
        print(f"ncu calls: {f} {cfg} -> {tuple(y.shape)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layer_shape_args(ap, ms="64,80,96,128,160,192,224,256")
    ap.add_argument("--lean", action="store_true", help="also the small-pipeline tiles (see configs())")
    ap.add_argument("--ncu", default="", help="PROJ:M: only the calls for ncu, configs from --from")
    ap.add_argument("--from", dest="source", default="")
    ap.add_argument("--out", default="gemm_midm")
    args = ap.parse_args(argv)
    shapes = layer_shapes(args)
    if args.ncu:
        ncu_calls(args, shapes)
        return 0
    rows = sweep(args, shapes)
    fileio.write_json(args.out + ".json", {"model": args.model, "gpu": torch.cuda.get_device_name(),
                                           "triton": __import__("triton").__version__, "rows": rows})
    lines = ["| proj | M | streaming | cuBLAS | " + " | ".join(FAMILIES) + " |",
             "|---|---|---|---|" + "---|" * len(FAMILIES)]
    for r in rows:
        lines.append(f"| {r['proj']} | {r['m']} | {r['stream_us']} | {r['cublas_us']} | "
                     + " | ".join(str(r.get(f"{f}_us", "-")) for f in FAMILIES) + " |")
    fileio.write_text(args.out + ".md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
