"""Does a persistent kernel remove the ~4.5 us each decode GEMM pays? (GPU experiment, one call, about a minute.)

At b <= 16 every GEMM of a decode step costs ~4.5 us + bytes / 4.47 TB/s on the H200
(``engine_gemv_configs.py``): 0.65 ms of a 4.8 ms step at b = 1. Weights do not depend on the previous GEMM's
output, so a kernel that stays resident across dependent GEMMs could stream the next weights while the last
programs of the current GEMM finish. This times a chain of S dependent GEMMs of the 8B o shape (x [1, 4096] through
S weights of 4096 x 4096, each GEMM's output the next one's input) three ways, each captured 10 times in a CUDA
graph (``gemm._time_us``):

* ``launches``: S launches of the engine's GEMM (``gemm.linear``: the chooser's pick, PDL on);
* ``persistent``: one launch of P programs (one an SM) that run every GEMM of the chain, one output tile of 32
  columns a program, separated by a grid barrier (a counter per GEMM: each program adds one after storing its tile,
  then spins until all P did; the last program out resets the counters);
* ``persistent+prefetch``: the same, and before each barrier a program hints its tile of the next weight into L2
  (``prefetch.global.L2``), so the next GEMM reads it from L2 while the others finish.

The inner loop is the engine's pointer GEMM loop (16-row dot, pipelined by Triton). The outputs are checked
against torch. A barrier that spins past MAX_SPIN is counted in an error word and reported (never a hang).

    python benchmarks/engine_persistent_chain.py --out $OUT/persistent_chain
    TRITON_INTERPRET=1 python benchmarks/engine_persistent_chain.py --device cpu   # dry run: one program
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from tabletune.engine import gemm
from tabletune.engine.gemm_kernels import _prefetch_l2
from tabletune.engine.profiling import write_diagnostic

MAX_SPIN = tl.constexpr(1 << 20)  # a barrier spinning longer (~1 s) counts as a timeout


@triton.jit
def _chain_kernel(w_ptr, y_ptr, bar_ptr, err_ptr, N, K, STAGES: tl.constexpr, P: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_LINES: tl.constexpr, PREFETCH: tl.constexpr,
                  SPIN: tl.constexpr):
    """y[s + 1] = y[s] W[s]^T for s < STAGES (W: [STAGES, N, K], N == K; y: [STAGES + 1, K], one row), tile t of
    32 columns on program t mod P, a grid barrier between GEMMs."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(N, BLOCK_N)
    rows = tl.arange(0, 16)
    kk = tl.arange(0, BLOCK_K)
    for s in range(STAGES):
        w_s = w_ptr + s * N * K  # < 2^31 elements for the chains timed here
        for t in range(pid, tiles, P):
            cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros([16, BLOCK_N], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k_ok = (k0 + kk) < K
                x = tl.load(y_ptr + s * K + rows[:, None] * 0 + (k0 + kk)[None, :],
                            mask=(rows[:, None] < 1) & k_ok[None, :], other=0.0, cache_modifier=".cg")
                w = tl.load(w_s + cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :],
                            mask=(cols[:, None] < N) & k_ok[None, :], other=0.0)
                acc += tl.dot(x, tl.trans(w))
            tl.store(y_ptr + (s + 1) * K + rows[:, None] * 0 + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=(rows[:, None] < 1) & (cols[None, :] < N))
        if PREFETCH:
            if s + 1 < STAGES:  # this program's tiles of the next weight into L2 while the others finish this GEMM
                for t in range(pid, tiles, P):
                    cols = tl.minimum(t * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
                    pk = tl.minimum(tl.arange(0, K_LINES) * 64, K - 1)
                    _prefetch_l2(w_s + N * K + cols[:, None] * K + pk[None, :])
        tl.debug_barrier()  # every thread's store is issued before the release
        tl.atomic_add(bar_ptr + s, 1, sem="release")
        if SPIN:
            arrived = tl.atomic_add(bar_ptr + s, 0, sem="acquire")
            spins = 0
            while (arrived < P) & (spins < MAX_SPIN):
                arrived = tl.atomic_add(bar_ptr + s, 0, sem="acquire")
                spins += 1
            if spins >= MAX_SPIN:
                tl.atomic_add(err_ptr, 1)
        tl.debug_barrier()
    ticket = tl.atomic_add(bar_ptr + STAGES, 1, sem="acq_rel")
    if ticket == P - 1:  # every program has passed every barrier: reset for the next launch
        for s in range(STAGES + 1):
            tl.atomic_xchg(bar_ptr + s, 0)


def chain(w: torch.Tensor, y: torch.Tensor, bar: torch.Tensor, err: torch.Tensor, programs: int, prefetch: bool,
          block_n: int = 32, block_k: int = 256, stages: int = 4) -> torch.Tensor:
    s, n, k = w.shape
    _chain_kernel[(programs,)](w, y, bar, err, n, k, STAGES=s, P=programs, BLOCK_N=block_n, BLOCK_K=block_k,
                               K_LINES=triton.next_power_of_2(triton.cdiv(k, 64)), PREFETCH=prefetch,
                               SPIN=programs > 1, num_warps=4, num_stages=stages)
    return y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="persistent_chain")
    args = ap.parse_args(argv)
    dev = args.device
    cuda = dev == "cuda"
    h, s = (args.hidden, args.stages) if cuda else (128, 3)
    dt = torch.bfloat16 if cuda else torch.float32
    w = torch.randn(s, h, h, dtype=dt, device=dev) / h ** 0.5
    bar = torch.zeros(s + 1, dtype=torch.int32, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    y = torch.zeros(s + 1, h, dtype=dt, device=dev)
    y[0] = torch.randn(h, dtype=dt, device=dev)
    ref = [y[0].float()]
    for i in range(s):
        ref.append((ref[-1].to(dt).float() @ w[i].float().t()))
    programs = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 1
    lines, rows = [], []

    def launches():
        x = y[:1]
        for i in range(s):
            x = gemm.linear(x, w[i])
        return x
    variants = {"launches": launches,
                "persistent": lambda: chain(w, y, bar, err, programs, False),
                "persistent+prefetch": lambda: chain(w, y, bar, err, programs, True)}
    if not cuda:  # the interpreter has no inline PTX (the L2 prefetch)
        del variants["persistent+prefetch"]
    for name, fn in variants.items():
        out = fn().float()
        got = out[-1] if out.shape[0] == s + 1 else out[0]
        rel = float((got - ref[-1]).norm() / ref[-1].norm())
        us = gemm._time_us(fn) if cuda else float("nan")
        mb = s * h * h * y.element_size() / 1e6
        lines.append(f"{name:22s} {s} GEMMs of {h}x{h} (M = 1, {mb:.0f} MB): {us:8.2f} us "
                     f"({mb / us if us == us else float('nan'):.2f} TB/s); relative error {rel:.1e}; barrier timeouts "
                     f"{int(err.item())}")
        print(lines[-1], flush=True)
        rows.append({"variant": name, "us": round(us, 2), "rel_err": rel, "barrier_timeouts": int(err.item())})
    write_diagnostic(args.out, lines, stages=s, hidden=h, programs=programs, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
