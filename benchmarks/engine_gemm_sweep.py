"""Decode GEMMs of one layer at mid M (GPU diagnostic): cuBLAS, cuBLAS on padded M, cuBLASLt's heuristic list,
and the Triton configs.

For M = b*(k+1) in the range where the roofline grid is furthest from its floor (b=16..128,
k>=2), each of the 8B layer's four projections (and, with ``--lm-head``, the LM head) is timed as 10
calls in a CUDA graph over L2-cold weights (``gemm._time_us``): cuBLAS at M, cuBLAS at M rounded up to a
multiple of 64 and 128 (the rows past M are wasted work), cuBLASLt's default, the fastest of the first
``--lt-algos`` kernels of cuBLASLt's heuristic list (``cublaslt.heuristics``; each checked against torch
first) and, unless ``--no-triton``, the best Triton config of ``gemm._configs``.
Achieved TFLOP/s (at M) and TB/s (weights) are printed next to each.

    python benchmarks/engine_gemm_sweep.py --out $OUT/gemm_sweep
"""

from __future__ import annotations

import argparse

import torch

from tabletune import fileio
from tabletune.engine import cublaslt, gemm
from tabletune.engine.presets import resolve


def rotating_weights(n: int, k: int, copies: int = 3):
    """``copies`` random bf16 weights [n, k] and a function that returns the next one in turn, so that timed calls
    read W from HBM rather than from L2 (3 copies of the 8B layer's smallest W, 33.5 MB, exceed the 50 MB L2)."""
    ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
    i = [0]

    def pick() -> torch.Tensor:
        i[0] = (i[0] + 1) % len(ws)
        return ws[i[0]]
    return ws, pick


def padded_cublas(m: int, k: int, pick) -> tuple[dict[int, torch.Tensor], float]:
    """Random x of M rows and of M padded to 64 / 128 rows ({rows: x}), and cuBLAS's best us over those row counts
    against the rotating weights ``pick`` (the chooser's padded-cuBLAS candidates)."""
    xs = {mm: torch.randn(mm, k, dtype=torch.bfloat16, device="cuda")
          for mm in sorted({m, -(-m // 64) * 64, -(-m // 128) * 128})}
    return xs, min(gemm._time_us(lambda mm=mm: torch.mm(xs[mm], pick().t())) for mm in xs)


def add_layer_shape_args(ap: argparse.ArgumentParser, ms: str) -> None:
    """The flags of the per-projection GEMM benchmarks (engine_gemm_midm.py, engine_gemm_wgmma.py): model, M list,
    projections and the streaming rate of their reference column."""
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--ms", default=ms)
    ap.add_argument("--proj", default="", help="comma-separated projections (default: all four)")
    ap.add_argument("--stream-tbs", type=float, default=4.47, help="weight streaming rate for the reference column")


def layer_shapes(args) -> dict[str, tuple[int, int]]:
    """(N, K) of the layer's projections that ``--proj`` names (all four by default)."""
    shapes = resolve(args.model).layer_gemm_shapes()
    return {p: shapes[p] for p in args.proj.split(",")} if args.proj else shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--ms", default="32,64,96,128,160,192,224,256,320,384,448,512")
    ap.add_argument("--lt-algos", type=int, default=gemm.LT_ALGOS, help="cuBLASLt heuristic kernels to time")
    ap.add_argument("--no-triton", action="store_true", help="leave out the Triton configs (no compiles)")
    ap.add_argument("--lm-head", action="store_true", help="the LM head's shape too")
    ap.add_argument("--out", default="gemm_sweep")
    args = ap.parse_args(argv)
    cfg = resolve(args.model)
    shapes = cfg.step_gemm_shapes() if args.lm_head else cfg.layer_gemm_shapes()
    rows, lines = [], []
    for name, (n, kk) in shapes.items():
        ws, pick = rotating_weights(n, kk)
        for m in (int(v) for v in args.ms.split(",")):
            xs = {mm: torch.randn(mm, kk, dtype=torch.bfloat16, device="cuda")
                  for mm in {m, -(-m // 64) * 64, -(-m // 128) * 128}}
            t = {"cublas": gemm._time_us(lambda: torch.mm(xs[m], pick().t())),
                 "cublas_pad64": gemm._time_us(lambda: torch.mm(xs[-(-m // 64) * 64], pick().t())),
                 "cublas_pad128": gemm._time_us(lambda: torch.mm(xs[-(-m // 128) * 128], pick().t()))}
            t["cublaslt"] = gemm._time_us(lambda: gemm._mm_lt(xs[m], pick()))
            best_cfg, best = {}, {}
            ref = torch.mm(xs[m], ws[0].t()).float()
            for algo in cublaslt.heuristics(m, n, kk, torch.bfloat16, args.lt_algos):
                try:
                    err = gemm._rel_err(cublaslt.matmul(xs[m], ws[0], algo), ref)
                except RuntimeError as exc:
                    print(f"{name} M={m} {algo.label()}: {exc}", flush=True)
                    continue
                us = gemm._time_us(lambda: cublaslt.matmul(xs[m], pick(), algo)) if err < gemm.MAX_REL_ERR else None
                if us is None:
                    print(f"{name} M={m} {algo.label()}: relative error {err:.2e}, dropped", flush=True)
                elif us < best.get("lt_best", float("inf")):
                    best_cfg["lt_best"], best["lt_best"] = algo.label(), us
            for c in () if args.no_triton else gemm._configs(m, False, gemm.tma_available()):
                kind = "triton_tma" if c.tma else "triton_stream_k" if c.stream_k else "triton"
                us = gemm._time_us(lambda: gemm.triton_linear(xs[m], pick(), c))
                if us < best.get(kind, float("inf")):
                    best_cfg[kind], best[kind] = tuple(c), us
            t.update(best)
            flops, nbytes = 2 * m * n * kk, n * kk * 2
            row = {"proj": name, "m": m, "n": n, "k": kk, "best_config": {key: str(v) for key, v in best_cfg.items()},
                   **{f"{key}_us": round(v, 2) for key, v in t.items()}}
            rows.append(row)
            line = f"{name:8s} M={m:4d}: " + "  ".join(
                f"{key} {v:7.1f}us ({flops / v / 1e6:4.0f} TF/s, {nbytes / v / 1e6:4.2f} TB/s)" for key, v in t.items())
            print(line + f"  {best_cfg}", flush=True)
            lines.append(line)
        del ws
    fileio.write_json(args.out + ".json", {"model": args.model, "rows": rows})
    fileio.write_text(args.out + ".md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
