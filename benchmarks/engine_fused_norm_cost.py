"""The fused-norm layers' GEMMs against the standard layer's launches (GPU diagnostic, about a minute): each fused
GEMM (norm row scale, norm + silu * mul, residual epilogue) at ``gemm.choose_fused``'s config against the plain GEMM
at ``gemm.choose``'s (and silu_mul, add_rms_norm alone), and one layer's chain both ways with PDL on and off, each
captured 10 times in a CUDA graph (``gemm._time_us``), 8B shape, weights rotated over copies larger than L2.

Engine 0.7.dev1's fused GEMMs transformed x inside the K loop (the norm, and silu * mul in the down GEMM's gated
prologue); this script's first run found the gated prologue 4x slower than silu_mul then the plain GEMM at M = 1
(120 us against 29 us: the down GEMM alone explained ~3.2 ms of the fused step's +4.3 ms) and the norm prologue
+20% on gate_up. Engine 0.7.dev2 moves both into the epilogue (``gemm_kernels._epilogue``).

    python benchmarks/engine_fused_norm_cost.py --out $OUT/fused_norm_cost
"""

from __future__ import annotations

import argparse
import os

import torch

from tabletune.engine import gemm, kernels
from tabletune.engine.presets import replace, resolve
from tabletune.engine.profiling import write_diagnostic


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--device", default="cuda", help="cpu with TRITON_INTERPRET=1: a dry run (no timings)")
    ap.add_argument("--out", default="fused_norm_cost")
    args = ap.parse_args(argv)
    dev, m = args.device, args.m
    cfg, dt = resolve("qwen3-8b"), torch.bfloat16 if dev == "cuda" else torch.float32
    if dev != "cuda":  # the dry run: a small shape, the chooser's timer replaced by one call
        cfg = replace(cfg, hidden_size=256, intermediate_size=512, num_heads=2, num_kv_heads=1)
        gemm._time_us = lambda fn, inner=10, reps=5: (fn(), 1.0)[1]
        torch.cuda.is_current_stream_capturing = lambda: False
        torch.cuda.synchronize = lambda *a: None
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = cfg.layer_gemm_shapes()
    ws = {name: [torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(3)] for name, (n, k) in shapes.items()}
    turn = {name: 0 for name in ws}

    def w(name):
        turn[name] = (turn[name] + 1) % 3
        return ws[name][turn[name]]
    r = torch.randn(m, h, dtype=dt, device=dev)
    nw = torch.rand(h, dtype=dt, device=dev) + 0.5
    attn = torch.randn(m, shapes["o"][1], dtype=dt, device=dev)
    norm = gemm.RowNorm(gemm.residual_linear(attn, ws["o"][0], gemm.choose_fused(m, ws["o"][0], "resid"), r.clone()),
                        1e-6)
    gu = torch.randn(m, 2 * i, dtype=dt, device=dev)
    act = torch.randn(m, i, dtype=dt, device=dev)
    rows, lines = [], []
    time_us = gemm._time_us if dev == "cuda" else (lambda fn: (fn(), float("nan"))[1])  # dry run: call once
    kind = {"qkv": "norm", "gate_up": "norm-silu", "o": "resid", "down": "resid"}
    fused = {name: gemm.choose_fused(m, ws[name][0], kind[name]) for name in ws}

    def record(name, us):
        rows.append({"name": name, "us": round(us, 2)})
        lines.append(f"{name:78s} {us:8.2f} us")
        print(lines[-1], flush=True)
    for name, x in (("qkv", r), ("o", attn), ("gate_up", r), ("down", act)):
        record(f"{name}: plain at {gemm.choose(m, ws[name][0])}", time_us(lambda: gemm.linear(x, w(name))))
        c = fused[name]
        if kind[name] == "resid":
            rr = r.clone()
            record(f"{name}: residual epilogue at {tuple(c)[:6]}",
                   time_us(lambda: gemm.residual_linear(x, w(name), c, rr)))
        else:
            silu = kind[name] == "norm-silu"
            record(f"{name}: norm{' + silu' if silu else ''} epilogue at {tuple(c)[:6]}",
                   time_us(lambda: gemm.norm_linear(x, w(name), c, norm, silu=silu)))
    record("silu_mul", time_us(lambda: kernels.silu_mul(gu)))
    record("add_rms_norm", time_us(lambda: kernels.add_rms_norm(r, attn, nw, 1e-6)))

    def standard_layer():
        a = gemm.linear(attn, w("o"))
        hh, rr = kernels.add_rms_norm(r, a, nw, 1e-6)
        y = gemm.linear(kernels.silu_mul(gemm.linear(hh, w("gate_up"))), w("down"))
        hh, rr = kernels.add_rms_norm(rr, y, nw, 1e-6)
        return gemm.linear(hh, w("qkv"))

    def fused_layer():
        rr = r.clone()
        sq = gemm.residual_linear(attn, w("o"), fused["o"], rr)
        y = gemm.norm_linear(rr, w("gate_up"), fused["gate_up"], gemm.RowNorm(sq, 1e-6), silu=True)
        sq = gemm.residual_linear(y, w("down"), fused["down"], rr)
        return gemm.norm_linear(rr, w("qkv"), fused["qkv"], gemm.RowNorm(sq, 1e-6))

    for pdl in ("1", "0"):
        os.environ["TABLETUNE_PDL"] = pdl
        record(f"chain PDL={pdl}: o, add+norm, gate_up, silu_mul, down, add+norm, qkv", time_us(standard_layer))
        record(f"chain PDL={pdl}: o+resid, gate_up+norm+silu, down+resid, qkv+norm", time_us(fused_layer))
    os.environ["TABLETUNE_PDL"] = "1"
    write_diagnostic(args.out, lines, m=m, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
