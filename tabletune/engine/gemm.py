"""y = x W^T for the decode shapes: cuBLAS or a split-K Triton GEMM, whichever is faster.

Decode GEMMs are skinny (M = b*(k+1) rows against a weight of N x K): at small M
they only stream W, and cuBLAS leaves bandwidth unused on the small projections
(few output tiles, one wave or less). The Triton kernel splits K as well as N,
so that enough programs stream W at once. Split-K without a zero-fill launch or
fp32 atomics: each program writes its partial tile to a workspace, takes a ticket
from a per-tile counter, and the program that draws the last ticket adds the
partials in split order (deterministic), writes the output in the input dtype and
resets the counter to zero for the next launch (stream-K style "fix-up").

``GATED``: x is ``[gate | up]`` of width 2K and the kernel multiplies silu(gate) * up
on the fly (the down projection eats the MLP's element-wise op; same rounding as
``kernels.silu_mul``: fp32 math, one rounding to the input dtype).

Padded cuBLAS: at some M cuBLAS's own kernel choice is far off its neighbours (H200,
8B down projection: 53.8 us at M=192, 41.7 us at M=256). Inputs made by this engine's
kernels have storage for M rounded up to 128 rows (``kernels.empty_rows``), so cuBLAS can
run on M rounded up to 64 or 128 rows at no copy; the extra rows are discarded.

TMA configs (``Config.tma``, 16 < M <= 512, plain shapes): the same split-K scheme with the
x and W tiles fetched by Hopper's tensor-memory accelerator through host tensor descriptors
(zero-filled past M and K, so the K loop carries no masks), for the mid-M shapes where the
pointer kernel ran at half of cuBLAS. cuBLASLt (torch's preferred-BLAS switch) is one more
candidate: its heuristics pick other kernels than cuBLAS's at some shapes.

Preload configs (``Config.preload``, M <= 16, plain shapes): at small M every small-N GEMM pays a fixed
3.5-4 us a launch on the H200, even with its weight in L2 (docs/engine_notes.md, v0.6). In this kernel each
program owns one whole weight tile and loads it before the programmatic-dependent-launch wait, so the
programs that launch early stream weights while the previous kernel (attention, a norm) still runs.

``linear_silu`` (the MLP's gate_up weight, M <= ``model.SILU_MAX_M``): the gate_up GEMM and silu(gate) * up
in one preload-style launch (each program owns a gate tile and the matching up tile), against the gate_up
GEMM's own choice followed by ``kernels.silu_mul``.

Stream-K configs (``Config.stream_k`` = P, M <= 64, plain shapes): split-K launches tiles x splits
programs, rarely a multiple of the SM count, so the last wave runs part-empty (the small projections
streamed W at 2.4-3.2 TB/s of a 4.2 TB/s copy rate on the H200). The stream-K kernel launches exactly P
persistent programs (one or two per SM) and deals out the K iterations of all output tiles evenly:
program p runs a contiguous range of them, tile by tile, and writes a tile it covered whole; tiles shared
by several programs get the same deterministic ticket fix-up as split-K (partials added in program order).

Set-up only: the first call of a (M, N, K, gated) checks every candidate (cuBLAS at M and
padded, cuBLASLt, the Triton configs for M <= 512) against torch on fresh inputs, times those
that agree, and remembers the winner (that happens in the
warm-up before CUDA graph capture); later calls and graph replays just launch it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tabletune.engine import kernels, ops as torch_ops
from tabletune.engine.model import SILU_MAX_M

MAX_TRITON_M = 512
MAX_CHOOSE_M = 4096  # above this, cuBLAS at M without timing
PREFETCH_K = 512  # with PDL: K columns of its weight rows a program pulls into L2 before waiting (0: off)
STREAM_K_PROGRAMS = (132, 264)  # stream-K persistent programs: one or two per H200 SM (a kernel argument: no compile)
SMEM_BYTES = 200 * 1024  # H100/H200: 227 KB per block; leave room for the epilogue


@triton.jit
def _prefetch_l2(ptrs):
    """PTX ``prefetch.global.L2`` for every address of ``ptrs`` (no data comes back)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, WS_STRIDE,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                 GATED: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_K: tl.constexpr):
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if USE_PDL:
        if PREFETCH_K > 0:  # weights do not depend on the previous kernel: pull the first ones into L2 while it ends
            pk = tl.minimum(k_lo + tl.arange(0, PREFETCH_K // 64) * 64, K - 1)  # one address per 128-byte line
            _prefetch_l2(w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * K + pk[None, :])
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    kk = tl.arange(0, BLOCK_K)
    x_stride = 2 * K if GATED else K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k0 + kk) < k_hi
        x_mask = (rows[:, None] < M) & k_ok[None, :]
        x_off = rows.to(tl.int64)[:, None] * x_stride + (k0 + kk)[None, :]
        x = tl.load(x_ptr + x_off, mask=x_mask, other=0.0)
        if GATED:
            g = x.to(tl.float32)
            u = tl.load(x_ptr + x_off + K, mask=x_mask, other=0.0).to(tl.float32)
            x = (g / (1.0 + tl.exp(-g)) * u).to(w_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :],
                    mask=(cols[:, None] < N) & k_ok[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    _store_or_fix_up(acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M, BLOCK_N, SPLIT)


@triton.jit
def _resid_out(total, r_ptr, ss_ptr, rows, cols, ok, out_off, BLOCK_M: tl.constexpr):
    """The residual epilogue: r = bf16(r + bf16(x W^T)) in place, and this column tile's sum of r^2 per row into
    ss[pid_n, row] for the next GEMM's norm (``_inv_rms``); the same roundings as ``kernels.add_rms_norm``."""
    y = total.to(r_ptr.dtype.element_ty).to(tl.float32)
    r = (tl.load(r_ptr + out_off, mask=ok, other=0.0).to(tl.float32) + y).to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + out_off, r, mask=ok)
    rf = tl.where(ok, r.to(tl.float32), 0.0)
    tl.store(ss_ptr + tl.program_id(1) * BLOCK_M + rows, tl.sum(rf * rf, 1))


@triton.jit
def _store_or_fix_up(acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, RESID: tl.constexpr = False, ss_ptr=None):
    """Write the tile (one split), or store this split's partial and let the last split add them in order.
    ``RESID``: the tile is added into y (the residual stream) instead, with its sums of squares (``_resid_out``)."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ok = (rows[:, None] < M) & (cols[None, :] < N)
    out_off = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if SPLIT == 1:
        if RESID:
            _resid_out(acc, y_ptr, ss_ptr, rows, cols, ok, out_off, BLOCK_M)
        else:
            tl.store(y_ptr + out_off, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tile = pid_m * tl.num_programs(1) + pid_n
        tl.store(ws_ptr + pid_s.to(tl.int64) * WS_STRIDE + out_off, acc, mask=ok)
        tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if ticket == SPLIT - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT):  # unrolled: the partial loads are issued together
                total += tl.load(ws_ptr + s * WS_STRIDE + out_off, mask=ok, other=0.0, cache_modifier=".cg")
            if RESID:
                _resid_out(total, y_ptr, ss_ptr, rows, cols, ok, out_off, BLOCK_M)
            else:
                tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def _inv_rms(ss_ptr, NT, K, eps, BLOCK_M: tl.constexpr, NT_P: tl.constexpr):
    """1 / rms of each row from the NT per-tile partial sums of squares ss[t, row] that the previous GEMM's
    residual epilogue wrote (``_resid_out``), summed in chunks of 32 tiles (a fixed order; small chunks keep the
    registers free for the weight tile loaded before the wait)."""
    CHUNK: tl.constexpr = 32 if NT_P > 32 else NT_P
    ss = tl.zeros([BLOCK_M], tl.float32)
    for t0 in tl.static_range(0, NT_P, CHUNK):
        t = t0 + tl.arange(0, CHUNK)
        ss += tl.sum(tl.load(ss_ptr + t[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :], mask=t[:, None] < NT,
                             other=0.0), 0)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _wait_load_rows(x_ptr, nw_ptr, ss_in_ptr, NT_IN, eps, rows, kk, M, K, BLOCK_M: tl.constexpr,
                    USE_PDL: tl.constexpr, NORM: tl.constexpr, NT_P: tl.constexpr):
    """The preload kernels' part after their weight loads: the PDL wait, then x[rows, kk]; with NORM, the RMSNorm
    of it (x is then the residual stream, 1 / rms from the NT_IN partials at ``ss_in_ptr``): bf16(x * inv * w),
    as ``kernels.add_rms_norm`` computes it."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ok = (rows[:, None] < M) & (kk[None, :] < K)
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + kk[None, :], mask=ok, other=0.0)
    if NORM:
        inv = _inv_rms(ss_in_ptr, NT_IN, K, eps, BLOCK_M, NT_P)
        w = tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) * inv[:, None] * w[None, :]).to(x.dtype)
    return x


@triton.jit(do_not_specialize=["M"])  # one compile for every M <= 16 (M only masks)
def _gemm_preload_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, WS_STRIDE, nw_ptr, ss_in_ptr, ss_out_ptr,
                         NT_IN, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT: tl.constexpr, USE_PDL: tl.constexpr, NORM: tl.constexpr = False,
                         RESID: tl.constexpr = False, NT_P: tl.constexpr = 1):
    """Skinny split-K GEMM (M <= BLOCK_M) in which each program owns one [BLOCK_N, BLOCK_K] weight tile
    (grid (1, cdiv(N, BLOCK_N), SPLIT), SPLIT = cdiv(K, BLOCK_K)) and loads it into registers *before* the PDL
    wait: weights do not depend on the previous kernel, so a program launched early streams its tile while the
    previous kernel drains, and after the wait only x (a few rows) is left to load.

    ``NORM``: x is the residual stream and the GEMM's input is its RMSNorm (weight ``nw_ptr``, 1 / rms from the
    NT_IN partial sums at ``ss_in_ptr``). ``RESID``: y is the residual stream, updated in place to
    y + x W^T, with the per-tile sums of squares written to ``ss_out_ptr`` (the fused-norm layer: no norm launch)."""
    pid_n, pid_s = tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = pid_s * BLOCK_K + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + kk[None, :], mask=(cols[:, None] < N) & (kk[None, :] < K),
                other=0.0)
    x = _wait_load_rows(x_ptr, nw_ptr, ss_in_ptr, NT_IN, eps, rows, kk, M, K, BLOCK_M, USE_PDL, NORM, NT_P)
    acc = tl.dot(x, tl.trans(w))
    _store_or_fix_up(acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M, BLOCK_N, SPLIT, RESID,
                     ss_out_ptr)


@triton.jit
def _silu_mul_f32(g, u, dtype: tl.constexpr):
    """silu(g) * u with both rounded to ``dtype`` first, as ``kernels.silu_mul`` sees a bf16 gate_up output."""
    g = g.to(dtype).to(tl.float32)
    u = u.to(dtype).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(dtype)


@triton.jit(do_not_specialize=["M"])  # one compile for every M <= 16 (M only masks)
def _gemm_silu_preload_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, I, K, WS_STRIDE, nw_ptr, ss_in_ptr, NT_IN, eps,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              SPLIT: tl.constexpr, USE_PDL: tl.constexpr, NORM: tl.constexpr = False,
                              NT_P: tl.constexpr = 1):
    """The MLP's gate_up GEMM and silu(gate) * up in one launch, for M <= BLOCK_M: w = [Wg; Wu] is [2I, K]; a
    program owns the gate tile (rows j .. j+BLOCK_N of Wg) and the matching up tile (the same rows of Wu) of one
    K slice, loads both before the PDL wait (as ``_gemm_preload_kernel``), and the last split of a column tile
    adds the partials in split order and writes silu(g) * u [M, BLOCK_N] (one launch a layer fewer). ``NORM``: the
    input is the RMSNorm of the residual stream x, as in ``_gemm_preload_kernel``."""
    pid_n, pid_s = tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = pid_s * BLOCK_K + tl.arange(0, BLOCK_K)
    w_mask = (cols[:, None] < I) & (kk[None, :] < K)
    wg = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + kk[None, :], mask=w_mask, other=0.0)
    wu = tl.load(w_ptr + (cols + I).to(tl.int64)[:, None] * K + kk[None, :], mask=w_mask, other=0.0)
    x = _wait_load_rows(x_ptr, nw_ptr, ss_in_ptr, NT_IN, eps, rows, kk, M, K, BLOCK_M, USE_PDL, NORM, NT_P)
    g = tl.dot(x, tl.trans(wg))
    u = tl.dot(x, tl.trans(wu))
    ok = (rows[:, None] < M) & (cols[None, :] < I)
    out_off = rows.to(tl.int64)[:, None] * I + cols[None, :]
    if SPLIT == 1:
        tl.store(y_ptr + out_off, _silu_mul_f32(g, u, y_ptr.dtype.element_ty), mask=ok)
    else:
        part = pid_s.to(tl.int64) * 2 * WS_STRIDE + out_off
        tl.store(ws_ptr + part, g, mask=ok)
        tl.store(ws_ptr + part + WS_STRIDE, u, mask=ok)
        tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
        ticket = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT - 1:
            g_tot = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            u_tot = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for sp in tl.static_range(SPLIT):  # unrolled: the partial loads are issued together
                g_tot += tl.load(ws_ptr + sp * 2 * WS_STRIDE + out_off, mask=ok, other=0.0, cache_modifier=".cg")
                u_tot += tl.load(ws_ptr + (sp * 2 + 1) * WS_STRIDE + out_off, mask=ok, other=0.0,
                                 cache_modifier=".cg")
            tl.store(y_ptr + out_off, _silu_mul_f32(g_tot, u_tot, y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


@triton.jit
def _gemm_tma_kernel(x_desc, w_desc, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, WS_STRIDE,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                     USE_PDL: tl.constexpr):
    """The split-K GEMM with x and W tiles fetched by the tensor-memory accelerator (Hopper TMA, through host
    tensor descriptors): rows past M and columns past K come back as zeros, so the K loop has no masks and
    the software pipeline keeps ``num_stages`` bulk copies in flight."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        x = x_desc.load([pid_m * BLOCK_M, k0])
        w = w_desc.load([pid_n * BLOCK_N, k0])
        acc = tl.dot(x, w.T, acc)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _store_or_fix_up(acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M, BLOCK_N, SPLIT)


@triton.jit
def _gemm_stream_k_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, PROGRAMS,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    """Stream-K GEMM: ``PROGRAMS`` (P) persistent programs share the I = tiles * KB iterations (KB = cdiv(K, BLOCK_K)
    k-blocks per output tile, tile t = pid_n * tiles_m + pid_m, iteration i = t * KB + k-block).

    Program p runs iterations [p*I//P, (p+1)*I//P). Iteration i belongs to the last p with p*I//P <= i, i.e.
    p*I < (i+1)*P: p = ((i+1)*P - 1) // I. So tile t's contributors are the programs from
    first = ((t*KB + 1)*P - 1) // I to last = (((t+1)*KB)*P - 1) // I. With I >= P every range is non-empty and all
    of them contribute (at most KB); with I < P a range holds at most one iteration, some are empty, and exactly KB
    contribute: either way ``min(last - first + 1, KB)`` tickets complete the tile.

    Workspace ``ws_ptr`` [P, 2, BLOCK_M, BLOCK_N] fp32: a program's partial tiles are at most its first segment
    (slot 0) and its last (slot 1); the segments between cover whole tiles and are written directly.
    """
    pid = tl.program_id(0).to(tl.int64)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tiles_m = tl.cdiv(M, BLOCK_M)
    k_blocks = tl.cdiv(K, BLOCK_K)
    iters = (tiles_m * tl.cdiv(N, BLOCK_N)).to(tl.int64) * k_blocks
    it_lo = pid * iters // PROGRAMS
    it_hi = (pid + 1) * iters // PROGRAMS
    tile_lo = it_lo // k_blocks
    tile_hi = tl.where(it_hi > it_lo, tl.cdiv(it_hi, k_blocks), tile_lo)  # an empty range touches no tile
    kk = tl.arange(0, BLOCK_K)
    tile_off = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # within a workspace slot
    for tile in range(tile_lo, tile_hi):
        rows = (tile % tiles_m).to(tl.int32) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile // tiles_m).to(tl.int32) * BLOCK_N + tl.arange(0, BLOCK_N)
        kb_lo = tl.maximum(it_lo - tile * k_blocks, 0).to(tl.int32)  # this segment's k-blocks of the tile
        kb_hi = tl.minimum(it_hi - tile * k_blocks, k_blocks).to(tl.int32)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kb in range(kb_lo, kb_hi):
            k_ok = (kb * BLOCK_K + kk) < K
            x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + (kb * BLOCK_K + kk)[None, :],
                        mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + (kb * BLOCK_K + kk)[None, :],
                        mask=(cols[:, None] < N) & k_ok[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w))
        ok = (rows[:, None] < M) & (cols[None, :] < N)
        out_off = rows.to(tl.int64)[:, None] * N + cols[None, :]
        if (kb_lo == 0) & (kb_hi == k_blocks):
            tl.store(y_ptr + out_off, acc.to(y_ptr.dtype.element_ty), mask=ok)
        else:
            slot = (tile != tile_lo).to(tl.int64)
            tl.store(ws_ptr + (pid * 2 + slot) * (BLOCK_M * BLOCK_N) + tile_off, acc)
            tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            first = ((tile * k_blocks + 1) * PROGRAMS - 1) // iters
            last = ((tile + 1) * k_blocks * PROGRAMS - 1) // iters
            if ticket == tl.minimum(last - first + 1, k_blocks) - 1:
                total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for q in range(first, last + 1):  # program order: the sum does not depend on who finishes last
                    q_lo = q * iters // PROGRAMS
                    if (q + 1) * iters // PROGRAMS > q_lo:
                        q_slot = (q_lo < tile * k_blocks).to(tl.int64)  # the tile is q's last segment
                        total += tl.load(ws_ptr + (q * 2 + q_slot) * (BLOCK_M * BLOCK_N) + tile_off,
                                         cache_modifier=".cg")
                tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=ok)
                tl.atomic_xchg(cnt_ptr + tile, 0)


class Config(NamedTuple):
    """A Triton GEMM config; ``tma``: the TMA kernel (plain, not gated) instead of pointer loads; ``stream_k``:
    if not 0, the stream-K kernel (plain) with that many persistent programs (``split`` unused); ``preload``: the
    preload kernel (plain, M <= block_m; one weight tile of block_k columns a program, so the split is
    cdiv(K, block_k); ``split`` and ``stages`` unused)."""
    block_m: int
    block_n: int
    block_k: int
    split: int
    warps: int
    stages: int
    tma: bool = False
    stream_k: int = 0
    preload: bool = False


PRELOAD_TILES = ((32, 512, 4), (16, 1024, 4), (32, 256, 4), (64, 256, 4), (64, 512, 8))  # (block_n, block_k, warps)
SILU_TILES = ((32, 256, 4), (16, 256, 4), (32, 512, 8), (64, 256, 8))  # two weight tiles (gate, up) a program


def _configs(m: int, gated: bool, tma: bool = True) -> list[Config]:
    """Triton candidates for M rows that fit in shared memory: the pointer kernel's, for 16 < M <= 512
    (plain shapes, where wgmma tiles of 64 / 128 rows apply) the TMA kernel's, and for M <= 64 (plain) the
    stream-K kernel's with one row block.

    Kept small: every distinct config is a Triton compile at start-up.
    """
    def skinny(bm: int) -> list[tuple[int, int, int, int, int, int]]:
        if gated:
            return [(bm, 64, 128, s, 4, 4) for s in (1, 2, 4, 8)]
        # BLOCK_N 32 and splits 3, 6: more ways to make the program count a multiple of the SM count
        return [(bm, bn, bk, s, 4, st) for bn in (32, 64) for bk, st in ((128, 6), (256, 4)) for s in (1, 2, 3, 4, 6, 8)]

    mid = [(128, bn, 64, s, 8, 3) for bn in (128, 256) for s in (1, 2, 4)] + \
        [(64, bn, 64, s, 4, 4) for bn in (128, 256) for s in (1, 2)]
    cands = []
    if m <= 128:
        # one row block of next_pow2(M) rows (M <= 64), or several smaller ones: the programs of one weight tile
        # are adjacent in launch order, so the row blocks after the first mostly read the tile from L2
        row_blocks = {bm for bm in (16, 32, 64) if bm < m} | ({max(16, triton.next_power_of_2(m))} if m <= 64 else set())
        cands = [c for bm in sorted(row_blocks) for c in skinny(bm)]
    if m > 64:
        cands += mid
    cands = [Config(*c) for c in cands]
    if tma and not gated and 16 < m <= MAX_TRITON_M:
        # splits up to 8: the N = 4096 projections have only 16-32 wide tiles, too few programs without split-K
        cands += [Config(64, bn, 64, s, 4, st, True) for bn, st in ((128, 6), (256, 4)) for s in (1, 2, 4, 8)]
        if m > 64:
            cands += [Config(128, 128, 64, s, 8, 5, True) for s in (1, 2, 3, 4, 8)]
            cands += [Config(128, 256, 64, s, 8, 4, True) for s in (1, 2, 4, 8)]
    if not gated and m <= 64:
        bm = max(16, triton.next_power_of_2(m))
        cands += [Config(bm, bn, bk, 1, 4, st, False, p)
                  for bn in (32, 64) for bk, st in ((128, 6), (256, 4)) for p in STREAM_K_PROGRAMS]
    if not gated and m <= 16:
        cands += [Config(16, bn, bk, 1, warps, 1, preload=True) for bn, bk, warps in PRELOAD_TILES]
    return [c for c in cands if c.stages * (c.block_m + c.block_n) * c.block_k * 2 <= SMEM_BYTES]


def tma_available() -> bool:
    """Host tensor descriptors in this Triton (TMA tiles need Hopper or later; elsewhere the launch fails
    and the chooser drops the config)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def triton_linear(x: torch.Tensor, w: torch.Tensor, cfg, gated: bool = False) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K]) -> x W^T [M, N] in x's dtype, with the config (bm, bn, bk, split, warps, stages,
    tma, stream_k)."""
    cfg = Config(*cfg)
    bm, bn, bk, split, warps, stages = cfg[:6]
    m = x.shape[0]
    n, k = w.shape
    if gated and (cfg.tma or cfg.stream_k or cfg.preload):
        raise ValueError("the TMA, stream-K and preload GEMMs have no gated variant")
    if cfg.preload and m > bm:
        raise ValueError(f"the preload GEMM covers at most {bm} rows, not {m}")
    pdl = kernels.pdl_enabled(x)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if cfg.stream_k:
        assert triton.cdiv(m, bm) * triton.cdiv(n, bn) <= kernels.MAX_TICKETS
        ws = torch.empty(cfg.stream_k, 2, bm, bn, dtype=torch.float32, device=x.device)
        _gemm_stream_k_kernel[(cfg.stream_k,)](x, w, y, ws, kernels.counters(x.device), m, n, k, cfg.stream_k,
                                               BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, USE_PDL=pdl, num_warps=warps,
                                               num_stages=stages, **kernels.pdl_kwargs(pdl))
        return y
    if cfg.preload:
        return _preload(x, w, cfg, y)
    per_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, per_split)
    ws = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    assert grid[0] * grid[1] <= kernels.MAX_TICKETS
    if cfg.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        _gemm_tma_kernel[grid](TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                               y, ws, kernels.counters(x.device), m, n, k, per_split, m * n, BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_K=bk, SPLIT=split, USE_PDL=pdl, num_warps=warps, num_stages=stages,
                               **kernels.pdl_kwargs(pdl))
        return y
    _gemm_kernel[grid](x, w, y, ws, kernels.counters(x.device), m, n, k, per_split, m * n, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                       SPLIT=split, GATED=gated, USE_PDL=pdl, PREFETCH_K=_prefetch_k(x, per_split) if pdl else 0,
                       num_warps=warps, num_stages=stages,
                       **kernels.pdl_kwargs(pdl))
    return y


class RowSquares(NamedTuple):
    """Per-row sums of squares of the residual stream, as ``tiles`` column-tile partials ss[tile, row] of 16 rows
    (written by a residual-epilogue GEMM, ``preload_residual``)."""
    ss: torch.Tensor
    tiles: int


class RowNorm(NamedTuple):
    """An RMSNorm to apply to a GEMM's input rows (the residual stream) from their ``RowSquares``."""
    weight: torch.Tensor
    squares: RowSquares
    eps: float


def _tiles_p2(norm: RowNorm | None) -> int:
    return 1 if norm is None else triton.next_power_of_2(norm.squares.tiles)


def _preload(x: torch.Tensor, w: torch.Tensor, cfg: Config, y: torch.Tensor, norm: RowNorm | None = None,
             squares_out: torch.Tensor | None = None) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    split = triton.cdiv(k, cfg.block_k)
    ws = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    assert triton.cdiv(n, cfg.block_n) <= kernels.MAX_TICKETS
    nw, ss_in, tiles, eps = (x, ws, 1, 0.0) if norm is None else (norm.weight, norm.squares.ss, norm.squares.tiles,
                                                                   norm.eps)
    pdl = kernels.pdl_enabled(x)
    _gemm_preload_kernel[(1, triton.cdiv(n, cfg.block_n), split)](
        x, w, y, ws, kernels.counters(x.device), m, n, k, m * n, nw, ss_in, ws if squares_out is None else squares_out,
        tiles, eps, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=split, USE_PDL=pdl,
        NORM=norm is not None, RESID=squares_out is not None, NT_P=_tiles_p2(norm), num_warps=cfg.warps,
        **kernels.pdl_kwargs(pdl))
    return y


def preload_linear(x: torch.Tensor, w: torch.Tensor, cfg, norm: RowNorm | None = None) -> torch.Tensor:
    """x W^T [M, N] with the preload kernel (M <= cfg.block_m); with ``norm``, x is the residual stream and the
    GEMM's input its RMSNorm."""
    cfg = Config(*cfg)
    if not cfg.preload or x.shape[0] > cfg.block_m:
        raise ValueError(f"a preload config of at least {x.shape[0]} rows is needed, not {cfg}")
    return _preload(x, w, cfg, kernels.empty_rows(x.shape[0], w.shape[0], x.dtype, x.device), norm)


def preload_residual(x: torch.Tensor, w: torch.Tensor, cfg, residual: torch.Tensor) -> RowSquares:
    """residual += x W^T in place (the residual add of a layer, rounded as ``kernels.add_rms_norm`` rounds it) with
    the preload kernel, and the rows' sums of squares for the next GEMM's norm."""
    cfg = Config(*cfg)
    m, n = x.shape[0], w.shape[0]
    if not cfg.preload or m > cfg.block_m or residual.shape != (m, n) or not residual.is_contiguous():
        raise ValueError(f"preload_residual: {cfg} for M={m}, residual {tuple(residual.shape)} (contiguous [M, N])")
    tiles = triton.cdiv(n, cfg.block_n)
    ss = torch.empty(tiles * cfg.block_m, dtype=torch.float32, device=x.device)
    _preload(x, w, cfg, residual, squares_out=ss)
    return RowSquares(ss, tiles)


_prefetch_ok: dict[torch.device, bool] = {}


def _prefetch_k(x: torch.Tensor, per_split: int) -> int:
    """Columns to prefetch (a power of two >= 64, at most PREFETCH_K), or 0 when off or when a probe launch failed."""
    n = min(PREFETCH_K, per_split)
    if n < 64:
        return 0
    if x.device not in _prefetch_ok:
        try:
            a, w = torch.ones(1, 64, dtype=x.dtype, device=x.device), torch.ones(64, 64, dtype=x.dtype, device=x.device)
            y = torch.empty(1, 64, dtype=x.dtype, device=x.device)
            _gemm_kernel[(1, 1, 1)](a, w, y, y, kernels.counters(x.device), 1, 64, 64, 64, 64, BLOCK_M=16, BLOCK_N=64,
                                    BLOCK_K=64, SPLIT=1, GATED=False, USE_PDL=True, PREFETCH_K=64, launch_pdl=True)
            _prefetch_ok[x.device] = bool((y == 64).all())
        except Exception as exc:  # this Triton / GPU cannot: run without the prefetch
            print(f"tabletune: GEMM prefetch off ({type(exc).__name__}: {exc})")
            _prefetch_ok[x.device] = False
    return 1 << (n.bit_length() - 1) if _prefetch_ok[x.device] else 0


# (M, N, K, gated) -> None: cuBLAS at M; an int: cuBLAS on that many (padded) rows; CUBLASLT: cuBLASLt at M;
# a Config: Triton. (M, N, K, SILU) -> None: the plain choice then silu_mul; a Config: the fused kernel.
_choice: dict[tuple[int, int, int, bool | str], Config | int | str | None] = {}
enabled = True
CUBLASLT = "cublaslt"
MAX_REL_ERR = 2e-2  # bf16 operands with fp32 accumulation land near 4e-3; a wrong kernel lands near 1


def _time_us(fn, inner: int = 10, reps: int = 5) -> float:
    """GPU time of one call: ``inner`` calls captured in a CUDA graph (no launch gaps), best of ``reps``."""
    try:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
    except Exception:  # a config that does not fit this GPU (shared memory) or shape
        torch.cuda.synchronize()
        return float("inf")
    best = float("inf")
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / inner)
    return best


def padded_rows(x: torch.Tensor, rows: int) -> torch.Tensor | None:
    """x [M, K] seen as its storage's first ``rows`` >= M rows (same strides), or None when the storage is shorter."""
    m, k = x.shape
    if rows == m:
        return x
    if not x.is_contiguous() or (x.storage_offset() + rows * k) * x.element_size() > x.untyped_storage().nbytes():
        return None
    return x.as_strided((rows, k), (k, 1))


def _mm(x: torch.Tensor, w: torch.Tensor, rows: int | None) -> torch.Tensor:
    """cuBLAS x W^T, on ``rows`` padded rows of x when its storage has them (first M rows returned)."""
    xp = padded_rows(x, rows) if rows else None
    if xp is None:
        return torch.mm(x, w.t())
    return torch.mm(xp, w.t())[: x.shape[0]]


def _mm_lt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x W^T through cuBLASLt (torch's preferred-BLAS switch, set around this one call: the kernel it picks is
    what a CUDA graph captures)."""
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(CUBLASLT)
    try:
        return torch.mm(x, w.t())
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def _run(x: torch.Tensor, w: torch.Tensor, choice, gated: bool = False) -> torch.Tensor:
    if isinstance(choice, tuple):
        return triton_linear(x, w, choice, gated)
    if gated:
        return _unfused(x, w, gated)
    return _mm_lt(x, w) if choice == CUBLASLT else _mm(x, w, choice)


def _unfused(x: torch.Tensor, w: torch.Tensor, gated: bool) -> torch.Tensor:
    """silu_mul (if gated), then the choice made for the plain shape (cuBLAS, padded cuBLAS, cuBLASLt or Triton)."""
    if gated:
        x = kernels.silu_mul(x, w.dtype)
        return _run(x, w, _choice.get((x.shape[0], w.shape[0], w.shape[1], False)))
    return torch.mm(x, w.t())


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def candidates(m: int, gated: bool = False) -> dict:
    """choice -> callable(x, w) for every way this engine can run (M, N, K, gated): the unfused path, cuBLAS
    on padded rows, cuBLASLt, and the Triton configs for M <= MAX_TRITON_M."""
    cands = {None: lambda x, w_: _unfused(x, w_, gated)}
    if not gated:
        for rows in sorted({kernels.round_up(m, 64), kernels.round_up(m, kernels.ROW_PAD)} - {m}):
            cands[rows] = lambda x, w_, rows=rows: _mm(x, w_, rows)
        if hasattr(torch.backends.cuda, "preferred_blas_library"):
            cands[CUBLASLT] = _mm_lt
    for cfg in _configs(m, gated, tma_available()) if m <= MAX_TRITON_M else ():
        cands[cfg] = lambda x, w_, cfg=cfg: triton_linear(x, w_, cfg, gated)
    return cands


def choose(m: int, w: torch.Tensor, gated: bool = False) -> Config | int | str | None:
    """Time every candidate once and keep the fastest of those whose result matches torch's
    (relative error under MAX_REL_ERR, checked on fresh inputs: a config that miscompiles is never chosen)."""
    n, k = w.shape
    key = (m, n, k, gated)
    if key not in _choice:
        if gated:
            choose(m, w, False)
        _choice[key] = _fastest(key, w, 2 * k if gated else k, candidates(m, gated),
                                lambda x, w_: torch.mm(kernels.silu_mul(x, w.dtype) if gated else x, w_.t()))
    return _choice[key]


def _fastest(key, w: torch.Tensor, width: int, cands: dict, reference):
    """The fastest of ``cands`` (choice -> fn(x, w)) on x [M, width] whose result is within MAX_REL_ERR of
    ``reference(x, w)``, timed over weights rotated through copies bigger than L2, as in the model."""
    m, n, k = key[:3]
    kernels.counters(w.device)
    x = kernels.empty_rows(m, width, w.dtype, w.device)
    padded_rows(x, kernels.round_up(m, kernels.ROW_PAD)).normal_()  # the padding rows too: never time on garbage
    ws = [w] + [torch.empty_like(w).normal_() for _ in range(max(0, min(3, (96 << 20) // w.nbytes)))]
    ref = reference(x, ws[-1]).float()
    i = [0]

    def pick():
        i[0] = (i[0] + 1) % len(ws)
        return ws[i[0]]
    timings = {}
    for choice, fn in cands.items():
        try:
            err = _rel_err(fn(x, ws[-1]), ref)
        except Exception:  # does not compile or launch here (shared memory, no TMA): not a candidate
            torch.cuda.synchronize()
            continue
        if not err < MAX_REL_ERR:
            print(f"tabletune: GEMM candidate {choice} for M={m} N={n} K={k} ({key[3]}) dropped: "
                  f"relative error {err:.2e}")
            continue
        timings[choice] = _time_us(lambda: fn(x, pick()))
    if not timings:
        raise RuntimeError(f"no GEMM candidate for M={m} N={n} K={k} ({key[3]}) ran correctly on this GPU")
    return min(timings, key=timings.get)


SILU = "silu"  # the chooser key's last field for linear_silu


def silu_candidates(m: int) -> dict:
    """choice -> callable(x, w) for silu(x Wg^T) * (x Wu^T): the plain GEMM's choice then ``kernels.silu_mul``
    (None), and for M <= SILU_MAX_M the fused preload configs."""
    cands = {None: _silu_unfused}
    for bn, bk, warps in SILU_TILES if m <= SILU_MAX_M else ():
        cfg = Config(16, bn, bk, 1, warps, 1, preload=True)
        cands[cfg] = lambda x, w_, cfg=cfg: silu_triton(x, w_, cfg)
    return cands


def _silu_unfused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return kernels.silu_mul(_run(x, w, _choice.get((x.shape[0], w.shape[0], w.shape[1], False))), w.dtype)


def choose_silu(m: int, w: torch.Tensor):
    n, k = w.shape
    key = (m, n, k, SILU)
    if key not in _choice:
        choose(m, w, False)
        _choice[key] = _fastest(key, w, k, silu_candidates(m),
                                lambda x, w_: kernels.silu_mul(torch.mm(x, w_.t()), w.dtype))
    return _choice[key]


PRELOAD = "preload"  # chooser keys of the fused-norm layers' GEMMs: the best tile of a set
PRELOAD_NORM = "preload-norm"
SILU_PRELOAD = "silu-preload"
# Tiles that compile without register spills (sm_90, Triton 3.9) once the norm prologue is added: the x tile is
# normalised in fp32 while the weight tile loaded before the wait still holds its registers.
NORM_TILES = ((32, 256, 4), (64, 256, 4), (64, 512, 8))
SILU_NORM_TILES = ((32, 256, 4), (16, 256, 4), (64, 256, 8))


def choose_preload(m: int, w: torch.Tensor, tag: str = PRELOAD) -> Config:
    """The fastest tile for the fused-norm layers' GEMM x [M, K] W^T (M <= 16): ``PRELOAD``: of PRELOAD_TILES
    (the residual-epilogue GEMMs), ``PRELOAD_NORM``: of NORM_TILES (the norm-prologue qkv GEMM), ``SILU_PRELOAD``:
    the fused gate_up + silu kernel, of SILU_NORM_TILES. Timed as the plain kernels (the prologue and epilogue
    add a few loads of rows)."""
    n, k = w.shape
    key = (m, n, k, tag)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"no {tag} tile chosen for M={m} N={n} K={k}: run one step before capture")
        tiles = {PRELOAD: PRELOAD_TILES, PRELOAD_NORM: NORM_TILES, SILU_PRELOAD: SILU_NORM_TILES}[tag]
        run = silu_triton if tag == SILU_PRELOAD else preload_linear
        cands = {c: (lambda x, w_, c=c: run(x, w_, c))
                 for c in (Config(16, bn, bk, 1, warps, 1, preload=True) for bn, bk, warps in tiles)}
        if tag == SILU_PRELOAD:
            ref = lambda x, w_: kernels.silu_mul(torch.mm(x, w_.t()), w.dtype)  # noqa: E731
        else:
            ref = lambda x, w_: torch.mm(x, w_.t())  # noqa: E731
        _choice[key] = _fastest(key, w, k, cands, ref)
    return _choice[key]


def silu_triton(x: torch.Tensor, w: torch.Tensor, cfg, norm: RowNorm | None = None) -> torch.Tensor:
    """silu(x Wg^T) * (x Wu^T) [M, I] for w = [Wg; Wu] [2I, K] with ``_gemm_silu_preload_kernel``; with ``norm``,
    x is the residual stream and the input its RMSNorm (``RowNorm``)."""
    cfg = Config(*cfg)
    m, k = x.shape
    i = w.shape[0] // 2
    if not cfg.preload or m > cfg.block_m:
        raise ValueError(f"the fused gate_up + silu GEMM takes a preload config of at least {m} rows, not {cfg}")
    split = triton.cdiv(k, cfg.block_k)
    y = kernels.empty_rows(m, i, x.dtype, x.device)
    ws = torch.empty(split, 2, m, i, dtype=torch.float32, device=x.device) if split > 1 else y
    assert triton.cdiv(i, cfg.block_n) <= kernels.MAX_TICKETS
    pdl = kernels.pdl_enabled(x)
    norm_args = (x, ws, 1, 0.0) if norm is None else (norm.weight, norm.squares.ss, norm.squares.tiles, norm.eps)
    _gemm_silu_preload_kernel[(1, triton.cdiv(i, cfg.block_n), split)](
        x, w, y, ws, kernels.counters(x.device), m, i, k, m * i, *norm_args, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=split, USE_PDL=pdl, NORM=norm is not None,
        NT_P=_tiles_p2(norm), num_warps=cfg.warps, **kernels.pdl_kwargs(pdl))
    return y


def linear_silu(x2d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(x2d Wg^T) * (x2d Wu^T) for w = [Wg; Wu] (the MLP's gate_up weight), in x2d's dtype: the fused kernel
    where the chooser picked it, else the gate_up GEMM's choice followed by ``kernels.silu_mul``."""
    m = x2d.shape[0]
    if not x2d.is_cuda:
        return torch_ops.silu_mul(torch.mm(x2d, w.t()), w.dtype)
    if not (enabled and m <= MAX_CHOOSE_M):
        return kernels.silu_mul(torch.mm(x2d, w.t()), w.dtype)
    if torch.cuda.is_current_stream_capturing():
        choice = _choice.get((m, w.shape[0], w.shape[1], SILU))
    else:
        choice = choose_silu(m, w)
    return _silu_unfused(x2d, w) if choice is None else silu_triton(x2d, w, choice)


def linear(x2d: torch.Tensor, w: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """x2d W^T (gated: silu(gate) * up of x2d = [gate | up], then W^T), in x2d's dtype."""
    m = x2d.shape[0]
    if not (enabled and x2d.is_cuda and m <= MAX_CHOOSE_M):
        return torch.mm(kernels.silu_mul(x2d, w.dtype) if gated else x2d, w.t())
    if torch.cuda.is_current_stream_capturing():
        choice = _choice.get((m, w.shape[0], w.shape[1], gated))
    else:
        choice = choose(m, w, gated)
    return _run(x2d, w, choice, gated)
