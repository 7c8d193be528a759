"""y = x W^T for the decode shapes: cuBLAS, or a split-K Triton GEMM for skinny M, whichever timed faster.

Decode GEMMs are skinny (M = b * (k + 1) rows against a weight of N x K): at small M they only stream W, and
cuBLAS leaves bandwidth unused on the small projections (few output tiles, one wave or less). The Triton kernel
splits K as well as N, so that enough programs stream W at once. No zero-fill launch and no fp32 atomics: each
program writes its partial tile to a workspace, takes a ticket, and the program that draws the last ticket adds
the partials in split order (deterministic), writes the output in the input dtype and resets the counter.

``GATED``: x is [gate | up] of width 2K and the kernel takes silu(gate) * up on the fly, so the down projection
eats the MLP's element-wise op (fp32 math, one rounding, as ``norms.silu_mul``).

With PDL the kernel hints the first ``PREFETCH_K`` columns of its weight rows into L2 before it waits for the
previous kernel (weights never depend on it), and lets the next kernel launch early; cuBLAS's kernels do neither.

``GemmChooser`` (one per engine, set-up only): the first call of an (M, N, K, gated) checks every candidate against
torch on fresh inputs, times those that agree and keeps the fastest; later calls and graph replays launch it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tabletune.engine.kernels import norms
from tabletune.engine.kernels.common import MAX_TICKETS, ROW_PAD, launch_kwargs, round_up, time_us

MAX_SPLIT_K_ROWS = 128  # the Triton kernel is a candidate up to this many rows
MAX_CHOOSE_ROWS = 4096  # above this, cuBLAS at M without timing
CONTEXT_MIN_ROWS = 17  # from here on candidates are timed followed by a small PDL kernel, as in the step
CUBLAS_PENALTY_US = 1.0  # what a cuBLAS kernel costs the step's PDL chain (idle time beside it), added to its time
PREFETCH_K = 512
SMEM_BYTES = 200 * 1024  # H100 / H200: 227 KB a block; room left for the epilogue
MAX_REL_ERR = 2e-2  # bf16 operands with fp32 accumulation land near 4e-3; a wrong kernel lands near 1
CUBLAS, CUBLASLT = "cublas", "cublaslt"


class SplitK(NamedTuple):
    """A Triton split-K config: rows, columns and K columns a tile, K splits, warps, pipeline stages."""
    block_m: int
    block_n: int
    block_k: int
    split: int
    warps: int
    stages: int


@triton.jit
def _prefetch_l2(ptrs):
    """PTX ``prefetch.global.L2`` for every address of ``ptrs`` (no data comes back)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr,
                 USE_PDL: tl.constexpr, PREFETCH: tl.constexpr):
    """Grid (row tiles, column tiles, splits). ws [SPLIT, M, N] fp32 holds the partials of a split-K launch."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if USE_PDL:
        if PREFETCH > 0:  # one address per 128-byte line of the first PREFETCH columns of this program's W rows
            pk = tl.minimum(k_lo + tl.arange(0, PREFETCH // 64) * 64, K - 1)
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
        w_off = cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :]
        acc += tl.dot(x, tl.trans(tl.load(w_ptr + w_off, mask=(cols[:, None] < N) & k_ok[None, :], other=0.0)))
    ok = (rows[:, None] < M) & (cols[None, :] < N)
    out_off = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if SPLIT == 1:
        tl.store(y_ptr + out_off, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tile = pid_m * tl.num_programs(1) + pid_n
        tl.store(ws_ptr + pid_s.to(tl.int64) * M * N + out_off, acc, mask=ok)
        tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
        if tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT):  # unrolled: the partial loads are issued together
                total += tl.load(ws_ptr + s * M * N + out_off, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(cnt_ptr + tile, 0)


def configs(m: int, gated: bool) -> list[SplitK]:
    """The split-K candidates for M rows: one row block of next_pow2(M) rows (16 .. 64; several blocks of 64 above
    64 rows), tiles that fit SMEM_BYTES. Kept small: every config is a Triton compile at start-up."""
    bm = min(64, max(16, triton.next_power_of_2(m)))
    if gated:
        cands = [SplitK(bm, 64, 128, s, 4, 4) for s in (1, 2, 4, 8)]
    else:
        cands = [SplitK(bm, bn, bk, s, 4, st) for bn in (32, 64) for bk, st in ((128, 6), (256, 4))
                 for s in (1, 2, 4, 8)]
    return [c for c in cands if c.stages * (c.block_m + c.block_n) * c.block_k * 2 <= SMEM_BYTES]


def split_k_linear(x: torch.Tensor, w: torch.Tensor, cfg: SplitK, counters: torch.Tensor, pdl: bool,
                   gated: bool = False) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K]) -> x W^T [M, N] in x's dtype (gated: silu(gate) * up first)."""
    m = x.shape[0]
    n, k = w.shape
    per_split = triton.cdiv(triton.cdiv(k, cfg.split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, per_split)  # none empty
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ws = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    assert grid[0] * grid[1] <= MAX_TICKETS
    prefetch = 1 << (min(PREFETCH_K, per_split).bit_length() - 1) if pdl and per_split >= 64 else 0
    _gemm_kernel[grid](x, w, y, ws, counters, m, n, k, per_split, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                       BLOCK_K=cfg.block_k, SPLIT=split, GATED=gated, USE_PDL=pdl, PREFETCH=prefetch,
                       num_warps=cfg.warps, num_stages=cfg.stages, **launch_kwargs(pdl))
    return y


def padded_rows(x: torch.Tensor, rows: int) -> torch.Tensor | None:
    """x [M, K] seen as its storage's first ``rows`` >= M rows (same strides), or None when the storage is shorter."""
    m, k = x.shape
    if rows == m:
        return x
    if not x.is_contiguous() or (x.storage_offset() + rows * k) * x.element_size() > x.untyped_storage().nbytes():
        return None
    return x.as_strided((rows, k), (k, 1))


def cublas_linear(x: torch.Tensor, w: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """cuBLAS x W^T, on ``rows`` padded rows of x where its storage has them (the first M rows returned): at some M
    cuBLAS's own kernel choice is far off its neighbours', and the padded shape's is not."""
    xp = padded_rows(x, rows) if rows else None
    if xp is None:
        return torch.mm(x, w.t())
    return torch.mm(xp, w.t())[: x.shape[0]]


def cublaslt_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x W^T through cuBLASLt (torch's preferred-BLAS switch around this one call: the kernel it picks is what a
    CUDA graph captures); its heuristics pick other kernels than cuBLAS's at some shapes."""
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(CUBLASLT)
    try:
        return torch.mm(x, w.t())
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


UNFUSED = "silu_mul"  # a gated shape's choice: silu_mul, then the plain shape's own choice


class GemmChooser:
    """The GEMM choice of every (M, N, K, gated) this engine ran: cuBLAS (at M, on padded rows, or through cuBLASLt),
    a ``SplitK`` config, or for gated shapes ``UNFUSED``. Choices are made outside graph capture (the warm-up step
    before each capture) and kept for the engine's life."""

    def __init__(self, counters: torch.Tensor, pdl: bool, split_k: bool = True) -> None:
        self.counters, self.pdl, self.split_k = counters, pdl, split_k
        self.choices: dict[tuple[int, int, int, bool], object] = {}

    def linear(self, x: torch.Tensor, w: torch.Tensor, gated: bool = False) -> torch.Tensor:
        """x [M, K] -> x W^T [M, N] (gated: x = [gate | up] of width 2K, silu(gate) * up first)."""
        m, (n, k) = x.shape[0], w.shape
        if m > MAX_CHOOSE_ROWS:
            return torch.mm(norms.silu_mul(x, self.pdl, w.dtype) if gated else x, w.t())
        key = (m, n, k, gated)
        if key not in self.choices:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"no GEMM choice for {key} inside graph capture: run one step eagerly first")
            self.choices[key] = self._choose(key, w)
        return self._run(x, w, self.choices[key], gated)

    def _run(self, x: torch.Tensor, w: torch.Tensor, choice, gated: bool) -> torch.Tensor:
        if isinstance(choice, SplitK):
            return split_k_linear(x, w, choice, self.counters, self.pdl, gated)
        if choice == UNFUSED:
            return self.linear(norms.silu_mul(x, self.pdl, w.dtype), w)
        if choice == CUBLASLT:
            return cublaslt_linear(x, w)
        return cublas_linear(x, w, None if choice == CUBLAS else choice)

    def candidates(self, m: int, gated: bool) -> list:
        """What the chooser times for M rows: cuBLAS at M, on M rounded up to 64 and to ROW_PAD rows, cuBLASLt (plain
        shapes) or ``UNFUSED`` (gated), then the split-K configs up to MAX_SPLIT_K_ROWS rows."""
        cands = [UNFUSED] if gated else [CUBLAS, *sorted({round_up(m, 64), round_up(m, ROW_PAD)} - {m}), CUBLASLT]
        return cands + (configs(m, gated) if self.split_k and m <= MAX_SPLIT_K_ROWS else [])

    def _breaks_pdl(self, key: tuple, choice) -> bool:
        """Whether a choice runs a cuBLAS kernel, which takes no part in the step's PDL chain."""
        if choice == UNFUSED:
            choice = self.choices[(*key[:3], False)]
        return not isinstance(choice, SplitK)

    def _choose(self, key: tuple, w: torch.Tensor):
        """The fastest candidate whose result is within MAX_REL_ERR of torch's (a config that miscompiles is never
        chosen), timed over weights rotated through copies bigger than L2, as in the model: alone below
        CONTEXT_MIN_ROWS rows, else each call followed by silu_mul, the small PDL kernel that follows a GEMM in the
        step; with PDL on, a candidate that runs cuBLAS is charged CUBLAS_PENALTY_US for the gap it leaves."""
        m, n, k, gated = key
        if gated:
            self.linear(torch.zeros(m, k, dtype=w.dtype, device=w.device), w)  # the plain shape's choice first
        x = torch.empty(round_up(m, ROW_PAD), 2 * k if gated else k, dtype=w.dtype, device=w.device).normal_()[:m]
        ws = [w] + [torch.empty_like(w).normal_() for _ in range(max(0, min(3, (96 << 20) // w.nbytes)))]
        ref = torch.mm(norms.silu_mul(x, self.pdl, w.dtype) if gated else x, ws[-1].t()).float()
        turn = [0]

        def rotated() -> torch.Tensor:
            turn[0] = (turn[0] + 1) % len(ws)
            return ws[turn[0]]
        timings = {}
        for choice in self.candidates(m, gated):
            def run(weight: torch.Tensor, choice=choice) -> torch.Tensor:
                return self._run(x, weight, choice, gated)
            try:
                err = float((run(ws[-1]).float() - ref).norm() / ref.norm().clamp_min(1e-30))
            except Exception:  # does not compile or launch here (shared memory): not a candidate
                torch.cuda.synchronize()
                continue
            if not err < MAX_REL_ERR:
                continue
            penalty = CUBLAS_PENALTY_US if self.pdl and self._breaks_pdl(key, choice) else 0.0
            if m >= CONTEXT_MIN_ROWS:
                timings[choice] = time_us(lambda: norms.silu_mul(run(rotated()), self.pdl)) + penalty
            else:
                timings[choice] = time_us(lambda: run(rotated())) + penalty
        if not timings:
            raise RuntimeError(f"no GEMM candidate for {key} ran correctly on this GPU")
        return min(timings, key=timings.get)
