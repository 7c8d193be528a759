"""Why the fused-norm layers are slower (GPU diagnostic, under a minute): each fused-norm GEMM against the plain
GEMM of the same config (and the gated down GEMM against silu_mul then the plain one), alone, and one layer's GEMM
chain both ways, each captured 10 times in a CUDA graph (``gemm._time_us``), 8B shape, M = 1, weights rotated over
copies larger than L2. If each fused GEMM alone is as fast as its plain twin but the chain is slow, the cause is
how back-to-back GEMMs launch under PDL; if one alone is slow, it is that kernel's code.

    python benchmarks/engine_fused_norm_cost.py --out $OUT/fused_norm_cost
"""

from __future__ import annotations

import argparse
import os

import torch

from tabletune.engine import gemm, kernels
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import write_diagnostic


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--config", default="16,64,256,2,4,4", help="the pointer kernel's config for every GEMM")
    ap.add_argument("--device", default="cuda", help="cpu with TRITON_INTERPRET=1: a dry run (no timings)")
    ap.add_argument("--out", default="fused_norm_cost")
    args = ap.parse_args(argv)
    dev, m = args.device, args.m
    cfg, dt = resolve("qwen3-8b"), torch.bfloat16 if dev == "cuda" else torch.float32
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, h), "o": (h, cfg.num_heads * cfg.head_dim),
              "gate_up": (2 * i, h), "down": (h, i)}
    ws = {name: [torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(3)] for name, (n, k) in shapes.items()}
    turn = {name: 0 for name in ws}

    def w(name):
        turn[name] = (turn[name] + 1) % 3
        return ws[name][turn[name]]
    r = torch.randn(m, h, dtype=dt, device=dev)
    nw = torch.rand(h, dtype=dt, device=dev) + 0.5
    attn = torch.randn(m, cfg.num_heads * cfg.head_dim, dtype=dt, device=dev)
    c = gemm.Config(*(int(v) for v in args.config.split(",")))  # one config everywhere: few compiles, same tiles
    squares = gemm.residual_linear(attn, ws["o"][0], c, r.clone())
    norm = gemm.RowNorm(nw, squares, 1e-6)
    gu = torch.randn(m, 2 * i, dtype=dt, device=dev)
    rows, lines = [], []
    time_us = gemm._time_us if dev == "cuda" else (lambda fn: (fn(), float("nan"))[1])  # dry run: call once

    def record(name, us):
        rows.append({"name": name, "us": round(us, 2)})
        lines.append(f"{name:70s} {us:8.2f} us")
        print(lines[-1], flush=True)
    for name, x in (("qkv", r), ("o", attn), ("gate_up", r), ("down", gu)):
        gated = name == "down"
        record(f"{name}: {tuple(c)[:6]} plain{' (gated)' if gated else ''}",
               time_us(lambda: gemm.triton_linear(x, w(name), c, gated)))
        if gated:  # what the standard layer runs instead when the chooser keeps silu * mul apart (M = 1, 8)
            record(f"{name}: silu_mul, then {tuple(c)[:6]} plain",
                   time_us(lambda: gemm.triton_linear(kernels.silu_mul(x), w(name), c)))
        if name in ("qkv", "gate_up"):
            record(f"{name}: {tuple(c)[:6]} norm prologue", time_us(lambda: gemm.norm_linear(x, w(name), c, norm)))
        else:
            rr = r.clone()
            record(f"{name}: {tuple(c)[:6]} residual epilogue",
                   time_us(lambda: gemm.residual_linear(x, w(name), c, rr, gated)))

    def standard_layer():
        gemm.triton_linear(attn, w("o"), c)
        hh, rr = kernels.add_rms_norm(r, attn, nw, 1e-6)
        y = gemm.triton_linear(hh, w("gate_up"), c)
        d = gemm.triton_linear(y, w("down"), c, gated=True)
        hh, rr = kernels.add_rms_norm(rr, d, nw, 1e-6)
        return gemm.triton_linear(hh, w("qkv"), c)

    def fused_layer():
        rr = r.clone()
        sq = gemm.residual_linear(attn, w("o"), c, rr)
        y = gemm.norm_linear(rr, w("gate_up"), c, gemm.RowNorm(nw, sq, 1e-6))
        sq = gemm.residual_linear(y, w("down"), c, rr, True)
        return gemm.norm_linear(rr, w("qkv"), c, gemm.RowNorm(nw, sq, 1e-6))

    for pdl in ("1", "0"):  # slow only with PDL on: the cause is how back-to-back GEMMs launch
        os.environ["TABLETUNE_PDL"] = pdl
        record(f"chain PDL={pdl}: o, add+norm, gate_up, down (gated), add+norm, qkv", time_us(standard_layer))
        record(f"chain PDL={pdl}: o+resid, gate_up+norm, down (gated)+resid, qkv+norm", time_us(fused_layer))
    os.environ["TABLETUNE_PDL"] = "1"
    write_diagnostic(args.out, lines, m=m, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
