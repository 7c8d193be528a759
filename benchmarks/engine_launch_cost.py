"""Where the fixed ~4 us of a skinny decode GEMM goes (GPU diagnostic, one call, about a minute).

At M = 1 the 8B o projection (32 MB) takes 11.6 us in the engine's chosen split-K config and
9.5 us with its weight already in L2 (``engine_gemm_l2.py``), against 7.9 us for its 33.5 MB at the
copy rate. Each line below is one kernel sequence captured 10 times back to back in a CUDA graph
(``gemm._time_us``, weights rotated over copies larger than L2), in us per call:

* the chosen config with PDL on (the engine) and off (``TABLETUNE_PDL=0``);
* the same config on half and on twice the columns (N = 2048, 8192): if time = fixed + bytes / rate,
  two points give the fixed part;
* a kernel that does nothing but the PDL wait (the launch + dependency cost alone);
* a "preload" GEMM (``_preload_kernel`` below; engine 0.7.dev0 had it as a chooser candidate for M <= 16):
  each program loads its whole weight tile (BLOCK_N x BLOCK_K) into registers *before* the PDL wait, so
  that a launched-early program streams its weights while the previous kernel drains; only the programs
  resident early gain. Measured slower than the chosen split-K config at every tile (1.6-2.4 TB/s), so the
  engine no longer has it; it stays here as the experiment behind that.

    python benchmarks/engine_launch_cost.py --out $OUT/launch_cost
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

from tabletune.engine import gemm, kernels
from tabletune.engine.profiling import write_diagnostic


@triton.jit
def _wait_only_kernel(x_ptr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(x_ptr + tl.program_id(0), 1.0)


@triton.jit
def _preload_kernel(x_ptr, w_ptr, ws_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    """One [BLOCK_N, BLOCK_K] weight tile a program (grid (cdiv(N, BLOCK_N), cdiv(K, BLOCK_K))), loaded before the
    PDL wait; each program writes its fp32 partial product [M, BLOCK_N] to ws[split] (the sum over splits is
    done by the caller: this times the weight streaming, the part the kernel was meant to speed up)."""
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = pid_s * BLOCK_K + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + kk[None, :], mask=(cols[:, None] < N) & (kk[None, :] < K),
                other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
    acc = tl.dot(x, tl.trans(w))
    out = pid_s.to(tl.int64) * M * N + rows[:, None] * N + cols[None, :]
    tl.store(ws_ptr + out, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


def preload_partials(x: torch.Tensor, w: torch.Tensor, bn: int, bk: int, warps: int, pdl: bool) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    ws = torch.empty(triton.cdiv(k, bk), m, n, dtype=torch.float32, device=x.device)
    _preload_kernel[(triton.cdiv(n, bn), triton.cdiv(k, bk))](x, w, ws, m, n, k, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk,
                                                               USE_PDL=pdl, num_warps=warps, **kernels.pdl_kwargs(pdl))
    return ws


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="launch_cost")
    args = ap.parse_args(argv)
    dt, dev = torch.bfloat16, "cuda"
    k = 4096
    x = torch.randn(1, k, dtype=dt, device=dev)
    weights = {n: [torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(max(2, (200 << 20) // (n * k * 2)))]
               for n in (2048, 4096, 8192)}
    i = [0]

    def nxt(n):
        i[0] = (i[0] + 1) % len(weights[n])
        return weights[n][i[0]]
    choice = gemm.choose(1, weights[4096][0])
    rows, lines = [], []

    def record(name, us, nbytes=0):
        row = {"name": name, "us": round(us, 2)}
        if nbytes:
            row["tb_s"] = round(nbytes / us / 1e6, 3)
        rows.append(row)
        lines.append(f"{name:60s} {us:7.2f} us" + (f"  ({row['tb_s']:.2f} TB/s)" if nbytes else ""))
        print(lines[-1], flush=True)

    for pdl in ("1", "0"):
        os.environ["TABLETUNE_PDL"] = pdl
        for n in (2048, 4096, 8192):
            record(f"chosen {tuple(choice)[:6]} N={n} PDL={pdl}", gemm._time_us(lambda: gemm._run(x, nxt(n), choice)),
                   n * k * 2)
        flag = torch.zeros(132, device=dev)
        record(f"wait-only kernel (132 programs) PDL={pdl}",
               gemm._time_us(lambda: _wait_only_kernel[(132,)](flag, USE_PDL=pdl == "1",
                                                              **kernels.pdl_kwargs(pdl == "1"))))
        ref = x.float() @ weights[4096][0].float().t()
        for bn, bk, warps in ((32, 512, 4), (16, 1024, 4), (32, 256, 4), (64, 256, 4), (64, 512, 8), (16, 512, 4),
                              (32, 1024, 8)):
            try:
                y = preload_partials(x, weights[4096][0], bn, bk, warps, pdl == "1").sum(0)
                err = float((y - ref).norm() / ref.norm())
                us = gemm._time_us(lambda: preload_partials(x, nxt(4096), bn, bk, warps, pdl == "1"))
                record(f"preload bn={bn} bk={bk} warps={warps} (rel err {err:.1e}) PDL={pdl}", us, 4096 * k * 2)
            except Exception as exc:  # a config that does not compile here: report and go on
                print(f"preload bn={bn} bk={bk} warps={warps}: {type(exc).__name__}: {str(exc)[:200]}")
    os.environ["TABLETUNE_PDL"] = "1"
    write_diagnostic(args.out, lines, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
