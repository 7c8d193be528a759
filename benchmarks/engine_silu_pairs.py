"""gate_up + silu * mul as one GEMM with interleaved rows, against the engine's two launches (GPU, about a minute).

At b <= 16 every launch of a decode step costs a few microseconds beyond its bytes (``engine_gemv_configs.py``);
silu * mul is one of eight launches a layer (0.06-0.075 ms a step on the H200). ``pairs_linear`` runs gate_up
over W with its gate and up rows interleaved (``pair_rows``), one accumulator and the plain K loop, and writes
silu(gate) * up from the epilogue (the two-accumulator SILU variant of the fused-norm layers lost 7 us at this
shape: docs/engine_notes.md, 0.7.dev2). This times, for the 8B gate_up (24576 x 4096) at M rows, each inside a
CUDA graph over weights rotated through copies bigger than L2 (``gemm._time_us``):

* ``two launches``: ``gemm.linear`` (the chooser's pick: cuBLAS or Triton) then ``kernels.silu_mul``;
* ``pairs <config>``: ``pairs_linear`` with each of the 6 fastest plain pointer configs the chooser timed.

Each pairs result is checked against silu_mul(x W^T) first.

First H200 run (session 8, `benchmarks/results/engine_silu_pairs_h200.*`, ``--rows 1,8,16 --configs 4``): the
pairs kernel is bit-identical to the two launches and faster by 0.3 / 1.0 / 1.9 us at M = 1 / 8 / 16 (51.6 ->
51.3, 53.2 -> 52.2, 53.1 -> 51.2 us): 0.01-0.07 ms a step over 36 layers, for a second copy of every gate_up
weight (7.2 GB at the 8B shape) or a changed weight layout. Not taken into the engine.

    python benchmarks/engine_silu_pairs.py --out $OUT/silu_pairs
    TRITON_INTERPRET=1 python benchmarks/engine_silu_pairs.py --device cpu   # dry run: correctness only
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from tabletune.engine import gemm, kernels
from tabletune.engine import ops as torch_ops
from tabletune.engine.gemm_kernels import _prefetch_l2
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import write_diagnostic

@triton.jit
def _gemm_pairs_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, WS_STRIDE,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                       USE_PDL: tl.constexpr, PREFETCH_K: tl.constexpr):
    """gate_up and silu * mul in one GEMM: W [N, K] holds the gate and up rows interleaved (g0, u0, g1, u1, ...,
    ``pair_rows``), so a plain tile of BLOCK_N rows (the K loop of ``_gemm_kernel``, one accumulator) carries
    BLOCK_N / 2 (gate, up) column pairs, and the epilogue writes y [M, N / 2] = silu(gate) * up with both rounded to
    y's dtype first, as ``kernels.silu_mul`` reads them. Split-K partials go to the fp32 workspace and the tile's
    last split adds them in split order (``_store_or_fix_up``'s tickets). A measured experiment (session 8),
    not an engine path."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if USE_PDL:
        if PREFETCH_K > 0:
            pk = tl.minimum(k_lo + tl.arange(0, PREFETCH_K // 64) * 64, K - 1)
            _prefetch_l2(w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * K + pk[None, :])
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k0 + kk) < k_hi
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (k0 + kk)[None, :],
                    mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :],
                    mask=(cols[:, None] < N) & k_ok[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    if SPLIT > 1:
        ok = (rows[:, None] < M) & (cols[None, :] < N)
        ws_off = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(ws_ptr + pid_s.to(tl.int64) * WS_STRIDE + ws_off, acc, mask=ok)
        tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
        tile = pid_m * tl.num_programs(1) + pid_n
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if ticket == SPLIT - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(ws_ptr + s * WS_STRIDE + ws_off, mask=ok, other=0.0, cache_modifier=".cg")
            _pairs_out(acc, y_ptr, rows, M, N, BLOCK_M, BLOCK_N)
            tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        _pairs_out(acc, y_ptr, rows, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def _pairs_out(acc, y_ptr, rows, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[:, j] = silu(gate_j) * up_j for the tile's BLOCK_N / 2 interleaved (gate, up) columns."""
    g, u = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N // 2, 2]))
    g = g.to(y_ptr.dtype.element_ty).to(tl.float32)
    u = u.to(y_ptr.dtype.element_ty).to(tl.float32)
    h = g / (1.0 + tl.exp(-g)) * u
    oc = tl.program_id(1) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * (N // 2) + oc[None, :], h.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (oc[None, :] < N // 2))


def pair_rows(w: torch.Tensor) -> torch.Tensor:
    """A [gate | up] weight (2N rows) as a copy with the rows interleaved: g0, u0, g1, u1, ... (``pairs_linear``)."""
    n2, k = w.shape
    if n2 % 2:
        raise ValueError(f"pair_rows: a [gate | up] weight has an even row count, not {n2}")
    return w.view(2, n2 // 2, k).transpose(0, 1).reshape(n2, k).contiguous()


def pairs_linear(x: torch.Tensor, w_pairs: torch.Tensor, cfg) -> torch.Tensor:
    """silu(x W_gate^T) * (x W_up^T) [M, N] in one launch (``_gemm_pairs_kernel``) for W_pairs = ``pair_rows``(W),
    with a pointer config (bm, bn, bk, split, warps, stages; bn even)."""
    cfg = gemm.Config(*cfg)
    if cfg.tma or cfg.stream_k or cfg.block_n % 2:
        raise ValueError(f"pairs_linear: a pointer config with an even block_n, not {tuple(cfg)}")
    bm, bn, bk, split, warps, stages = cfg[:6]
    m = x.shape[0]
    n2, k = w_pairs.shape
    y = torch.empty(m, n2 // 2, dtype=x.dtype, device=x.device)
    per_split, split, ws, grid = gemm._split_k(m, n2, k, bm, bn, bk, split, y)
    pdl = kernels.pdl_enabled(x)
    _gemm_pairs_kernel[grid](x, w_pairs, y, ws, kernels.counters(x.device), m, n2, k, per_split,
                             ws[0].numel() if split > 1 else 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split,
                             USE_PDL=pdl, PREFETCH_K=gemm._prefetch_k(x, per_split) if pdl else 0, num_warps=warps,
                             num_stages=stages, **kernels.pdl_kwargs(pdl))
    return y


def dry_run() -> int:
    """The pairs kernel against silu_mul(x W^T) in Triton's interpreter, split-K 1, 2 and 3, a ragged N."""
    torch.manual_seed(0)
    x, w = torch.randn(5, 96), torch.randn(2 * 40, 96)
    ref = torch_ops.silu_mul(x @ w.T)
    worst = max(float((pairs_linear(x, pair_rows(w), c) - ref).abs().max() / ref.abs().max())
                for c in ((16, 32, 32, 1, 4, 4), (16, 16, 32, 3, 4, 4), (16, 64, 64, 2, 4, 4)))
    print(f"pairs kernel vs silu_mul(x W^T): worst relative error {worst:.1e}")
    return 0 if worst < 1e-5 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--rows", default="1,8,16,32,64")
    ap.add_argument("--configs", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="silu_pairs")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        return dry_run()
    n2, k = resolve(args.model).layer_gemm_shapes()["gate_up"]
    ws = [torch.randn(n2, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(3)]
    wps = [pair_rows(w) for w in ws]
    lines, rows = [], []
    for m in (int(v) for v in args.rows.split(",")):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        gemm.choose(m, ws[0])
        i = [0]

        def nxt(lst):
            i[0] = (i[0] + 1) % len(lst)
            return lst[i[0]]
        two = gemm._time_us(lambda: kernels.silu_mul(gemm.linear(x, nxt(ws))))
        ref = kernels.silu_mul(x @ ws[0].t()).float()
        timed = gemm._scores((m, n2, k, False))
        plain = sorted((us, c) for c, us in timed.items()
                       if isinstance(c, gemm.Config) and not (c.tma or c.stream_k) and c.block_m <= 64)
        cells = {}
        for _, c in plain[: args.configs]:
            try:
                err = float((pairs_linear(x, wps[0], c).float() - ref).norm() / ref.norm())
            except Exception as exc:
                lines.append(f"M={m} pairs {tuple(c)}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            cells[tuple(c)] = {"us": round(gemm._time_us(lambda: pairs_linear(x, nxt(wps), c)), 2),
                               "rel_err": float(f"{err:.2e}")}
        best = min(cells.items(), key=lambda kv: kv[1]["us"] if kv[1]["rel_err"] < 2e-2 else 1e9) if cells else None
        line = (f"M={m:3d}: two launches {two:.2f} us (gate_up {gemm._choice.get((m, n2, k, False))}); "
                + (f"pairs best {best[0]} {best[1]['us']} us ({100 * (best[1]['us'] / two - 1):+.1f}%, "
                   f"rel err {best[1]['rel_err']})" if best else "no pairs config ran"))
        print(line, flush=True)
        lines.append(line)
        rows.append({"m": m, "two_launches_us": round(two, 2), "pairs": {str(c): v for c, v in cells.items()}})
    write_diagnostic(args.out, lines, model=args.model, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
