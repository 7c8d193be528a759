"""A hand-scheduled Hopper GEMM for the mid-M decode shapes (Gluon: TMA + asynchronous wgmma), y = x W^T.

At M = 17-256 rows the decode GEMMs still mostly stream W (the 8B layer at M = 128: 86 us of weights at 4.4 TB/s
against 46 us of matmul at 790 TFLOP/s), yet cuBLAS runs them at 1.3-2.0x their streaming time and ncu shows one
CTA an SM, SMs without a CTA a quarter of the kernel and DRAM half busy (docs/engine_notes.md, session 15). The
Triton TMA kernel, with its tile as x W^T or W x^T, was slower than cuBLAS at every such shape. This kernel is
written a level lower, in Gluon, so that the schedule is ours rather than the compiler's:

- **Tile as W x^T.** The weight rows are the MMA's M side (BLOCK_W = 64 or 128: one or two m64 wgmma rows a warp
  group) and all M tokens its N side (BLOCK_T = M rounded up to a power of two, 16-256: one wgmma N), so each program
  reads its W rows once and x, which every program shares, from L2.
- **A ring of STAGES shared-memory slots**, each filled by two TMA copies (a [BLOCK_W, BLOCK_K] W tile and a
  [BLOCK_T, BLOCK_K] x tile) that complete on the slot's mbarrier. The wgmma of slot i runs asynchronously; once
  the one before it has finished, its slot is refilled with the tile STAGES iterations ahead, so STAGES - 1 W
  tiles are always in flight behind the tensor cores.
- **W before the PDL wait.** Weights never depend on the previous kernel, so the first STAGES W tiles are asked
  for before ``griddepcontrol.wait``; only the x tiles wait for the kernel that writes x.
- **Split-K with the ticket fix-up** of ``gemm_kernels._store_or_fix_up``: SPLIT programs a W tile, partials in an
  fp32 workspace [SPLIT, M, N], the program that draws the last ticket adds them in split order (deterministic)
  and resets the counter.

- **Stream-K** (``WgmmaConfig.programs`` = P, opt-in: STREAM_K): P persistent programs, one an SM, share the
  tiles x k-blocks iterations evenly and stream their share through one ring, so that no SM idles in a last
  part-empty wave and the next tile's first W tiles are in flight while a tile is stored; tiles split between
  programs are added up in program order by the last ticket (as ``gemm_kernels._gemm_stream_k_kernel``).

Gluon tensors have power-of-two shapes, hence BLOCK_T: at M = 160 the tensor cores do 256 rows of work (the W
tiles, which set the time while the GEMM streams W, are the same).

Measured on the H200 (docs/engine_notes.md, sessions 16-17): alone within 13% of cuBLAS up to 64 rows and slower
from 96 (split-K's partials cost more than the programs they add); in the step -1.7% to -3.6% at the M = 20-32
cells and -0.8% to -2.3% at M = 10-14, so ``gemm`` times it as a candidate at 9-64 rows. Its W tiles before the PDL
wait save ~1-1.4 us a launch against the same kernel alone; a launch still costs 2.6-3.2 us beyond streaming W.

The host side (``wgmma_linear``, ``configs``) checks shapes, builds the TMA descriptors and launches. Gluon is
experimental in Triton (two names changed between 3.6 and 3.9, shimmed below): ``available()`` says whether this
Triton has it, and ``gemm`` never times the kernel where it has not.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton

from tabletune.engine import kernels  # the ticket buffers, one per stream lane

try:  # Gluon (run with Triton 3.6, compiled with 3.9 too)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # Triton 3.9 renamed the TMA load (the old name raises); 3.6, the device's, has only the old one
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed in 3.9 too
    _GLUON = True
except ImportError:  # pragma: no cover - an older Triton
    _GLUON = False

MAX_T = 256  # one wgmma N (tokens) at most
STREAM_K_SMS = 132  # H200 / H100 SXM: streaming multiprocessors, one stream-K program each
# The stream-K kernel as a chooser candidate (env TABLETUNE_GEMM_WGMMA_STREAM_K=1; off by default): its first
# version was correct but ran 1.2-4.3x slower than the split-K kernel on the H200, more so with more tokens and
# taller W tiles. Its partial tiles were stored and read W-row-major while a warp's threads run along W rows, so
# every 4-byte access was a sector of its own (found in the code after the device time ran out; the likely cause).
# The rewrite (coalesced partials, no branch in the K loop, a ring sized beside the epilogue's scratch, 256-row W
# tiles) removed most of that loss but is still 4-40% slower than the split-K kernel at the nine o / down / gate_up
# shapes of 16-128 rows (H200, docs/engine_notes.md, session 18), so it stays off.
STREAM_K = os.environ.get("TABLETUNE_GEMM_WGMMA_STREAM_K", "0") == "1"
SMEM_BYTES = 200 * 1024
SMEM_LIMIT = 227 * 1024  # Hopper: shared memory a block may opt in to


class WgmmaConfig(NamedTuple):
    """Tile rows of W (64 or 128), K columns a stage, K splits a W tile, ring slots, warps (4: one warp group);
    ``programs`` > 0: the stream-K kernel with that many persistent programs (``split`` is then 1, unused)."""
    block_w: int
    block_k: int
    split: int
    stages: int
    warps: int
    programs: int = 0


def available() -> bool:
    return _GLUON


def block_t(m: int) -> int:
    """Token columns of the tile: M rounded up to a power of two, at least 16 (one wgmma N; Gluon tensors have
    power-of-two shapes; TMA zero-fills the rows past M without reading them)."""
    return max(16, triton.next_power_of_2(m))


def fits(cfg: WgmmaConfig, m: int, weight_tiles: int = 1) -> bool:
    """Whether the ring fits shared memory and the accumulator a warp group's registers (<= 128 fp32 a thread; for
    the stream-K kernel, whose epilogue runs inside its loop: <= 64, and the ring beside the epilogue's scratch).
    ``weight_tiles`` = 2: the SILU variant, two W tiles a slot and two accumulators."""
    bt = block_t(m)
    ring = cfg.stages * (weight_tiles * cfg.block_w + bt) * cfg.block_k * 2
    acc_regs = weight_tiles * cfg.block_w * bt // (cfg.warps * 32)
    if cfg.programs:
        return (bt <= 128 and ring + cfg.block_w * bt * 2 + 1024 <= SMEM_LIMIT and acc_regs <= 64
                and cfg.block_w >= 16 * cfg.warps and cfg.split == 1 and weight_tiles == 1)
    # one warp group's 64 x 256 tile spilled (ptxas, sm_90a: 236 bytes in the split-K epilogue); 128 x 128 did not
    wide = bt == MAX_T and cfg.warps == 4
    return bt <= MAX_T and ring <= SMEM_BYTES and acc_regs <= 128 and cfg.block_w >= 16 * cfg.warps and not wide


def k_iters_per_split(k: int, cfg: WgmmaConfig) -> tuple[int, int]:
    """(BLOCK_K iterations a split, splits that leave none empty) for ``cfg.split`` asked."""
    iters = triton.cdiv(k, cfg.block_k)
    per = triton.cdiv(iters, cfg.split)
    return per, triton.cdiv(iters, per)


def configs(m: int) -> list[WgmmaConfig]:
    """The split-K kernel's candidates at M rows: W tiles of 64 / 128 rows, 64 / 128 K columns, 1-8 splits, the
    deepest ring that fits (at most 8 slots), one warp group or two (tiles of more than 128 x 128)."""
    out = []
    for bw in (64, 128):
        for bk in (64, 128):
            warps = 8 if bw * block_t(m) // 128 > 128 else 4
            stage_bytes = (bw + block_t(m)) * bk * 2
            stages = min(8, SMEM_BYTES // stage_bytes)
            for split in (1, 2, 3, 4, 6, 8):
                cfg = WgmmaConfig(bw, bk, split, stages, warps)
                if stages >= 2 and fits(cfg, m):
                    out.append(cfg)
    return out


FUSED_SPLITS = (1, 2, 3, 4)
FUSED_MAX_T = 64  # the fused-norm layers' token tile at most (gemm: model.FUSED_NORM_MAX_M rows)


def fused_configs(m: int, silu: bool = False) -> list[WgmmaConfig]:
    """The fused-norm layers' candidates (``wgmma_fused_linear``, M <= FUSED_MAX_T: one token tile): W tiles of 64 / 128
    rows, 64 / 128 K columns, FUSED_SPLITS splits, one warp group, the deepest ring that fits (at least 3 slots;
    SILU: two W tiles a slot), and at most 32 accumulators a thread a W tile, 64 in all: ptxas (sm_90a) spilled
    104-1052 bytes for 128 x 64 tiles at 64 tokens and none for the tiles kept. Kept small: each is a compile per
    variant at start-up."""
    tiles = 2 if silu else 1
    bt = block_t(m)
    out = []
    for bw in (64, 128):
        if bw * bt > 4096 or tiles * bw * bt > 8192:
            continue
        for bk in (64, 128):
            stages = min(8, SMEM_BYTES // ((tiles * bw + bt) * bk * 2))
            for split in FUSED_SPLITS:
                cfg = WgmmaConfig(bw, bk, split, stages, 4)
                if stages >= 3 and fits(cfg, m, tiles):
                    out.append(cfg)
    return out


def stream_k_configs(m: int, num_sms: int = STREAM_K_SMS) -> list[WgmmaConfig]:
    """The stream-K kernel's candidates: one persistent program an SM (``num_sms``), W tiles of 64, 128 or 256 rows
    (one warp group for 64, two above), 64 / 128 K columns, at most 64 fp32 accumulators a thread and the deepest
    ring (3-8 slots) that fits beside the epilogue's layout-conversion scratch, which stays live inside the loop
    (sm_90a ptxas: 128 x 64 tiles of one warp group spilled 16-56 bytes at 64 tokens, 536-928 at 128; 256 x 64
    tiles with 5 slots needed 232 KB of shared memory).

    Every program reads the x tile of each K block from L2 beside its W tile, so the bytes an SM loads are about
    W's times (1 + BLOCK_T / BLOCK_W): 2x at 64 rows and 64 tokens. Taller W tiles cut that but leave fewer tiles
    than SMs on the N = 4096-6144 shapes, which stream-K spreads over every SM anyway."""
    bt = block_t(m)
    out = []
    for bw in (64, 128, 256):
        warps = 4 if bw == 64 else 8
        if bw * bt // (warps * 32) > 64 or bt > 128:
            continue
        for bk in (64, 128):
            stages = min(8, (SMEM_LIMIT - bw * bt * 2 - 1024) // ((bw + bt) * bk * 2))
            if stages >= 3:
                out.append(WgmmaConfig(bw, bk, 1, stages, warps, num_sms))
    return out


def stream_k_ranges(tiles: int, k_blocks: int, programs: int) -> list[tuple[int, int]]:
    """[lo, hi) of the I = tiles * k_blocks iterations (tile-major) that each stream-K program runs, as the kernel
    computes them: program p takes [p*I // P, (p+1)*I // P)."""
    iters = tiles * k_blocks
    return [(p * iters // programs, (p + 1) * iters // programs) for p in range(programs)]


def stream_k_contributors(tile: int, k_blocks: int, iters: int, programs: int) -> tuple[int, int, int]:
    """(first, last, tickets) of a tile in the stream-K kernel: the programs first..last run some of its
    iterations, and ``tickets`` of them (those with a non-empty range) store a partial and take a ticket when the
    tile is not one program's alone. Iteration i belongs to program ((i + 1) * P - 1) // I."""
    first = ((tile * k_blocks + 1) * programs - 1) // iters
    last = ((tile + 1) * k_blocks * programs - 1) // iters
    return first, last, min(last - first + 1, k_blocks)


if _GLUON:
    @gluon.jit
    def _gdc_wait():
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)

    @gluon.jit
    def _gdc_launch_dependents():
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _load_stage(desc, coord_0, coord_1, bar, dest, pred):
        mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
        _tma_load(desc, [coord_0, coord_1], bar, dest, pred=pred)

    @gluon.jit
    def _init_bars(w_bars, x_bars, STAGES: gl.constexpr):
        """One mbarrier a ring slot for its W copy and one for its x copy."""
        for s in gl.static_range(STAGES):
            mbarrier.init(w_bars.index(s), count=1)
            mbarrier.init(x_bars.index(s), count=1)
        fence_async_shared()

    @gluon.jit
    def _invalidate_bars(w_bars, x_bars, STAGES: gl.constexpr):
        for t in gl.static_range(STAGES):
            mbarrier.invalidate(w_bars.index(t))
            mbarrier.invalidate(x_bars.index(t))

    @gluon.jit
    def _ring_mma(acc, r, w_ring, x_ring, w_bars, x_bars, STAGES: gl.constexpr):
        """Iteration r of the ring: wait for its slot's W and x tiles, start their wgmma asynchronously, and wait
        for the wgmma of iteration r - 1, whose slot may then be refilled."""
        slot = r % STAGES
        phase = (r // STAGES) & 1
        mbarrier.wait(w_bars.index(slot), phase)
        mbarrier.wait(x_bars.index(slot), phase)
        acc = warpgroup_mma(w_ring.index(slot), x_ring.index(slot).permute((1, 0)), acc, is_async=True)
        return warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))

    @gluon.jit
    def _ring_mma2(acc, acc_u, r, w_ring, x_ring, w_bars, x_bars, STAGES: gl.constexpr):
        """``_ring_mma`` for the SILU variant: the slot holds the gate tile and the up tile (ring entries 2 slot and
        2 slot + 1) against one x tile, two asynchronous wgmmas, and waits for the two of iteration r - 1."""
        slot = r % STAGES
        phase = (r // STAGES) & 1
        mbarrier.wait(w_bars.index(slot), phase)
        mbarrier.wait(x_bars.index(slot), phase)
        xt = x_ring.index(slot).permute((1, 0))
        acc = warpgroup_mma(w_ring.index(2 * slot), xt, acc, is_async=True)
        acc_u = warpgroup_mma(w_ring.index(2 * slot + 1), xt, acc_u, is_async=True)
        return warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_u))

    @gluon.jit
    def _load_w(w_desc, w_row, k_col, up_row, bar, w_ring, slot, pred, NW: gl.constexpr):
        """The W copies of ring slot ``slot`` on one barrier: the tile at (w_row, k_col) into ring entry NW slot
        and, for NW = 2 (SILU), the up half's tile at (up_row, k_col) into the entry after it."""
        mbarrier.expect(bar, NW * w_desc.block_type.nbytes, pred=pred)
        _tma_load(w_desc, [w_row, k_col], bar, w_ring.index(NW * slot), pred=pred)
        if NW == 2:
            _tma_load(w_desc, [up_row, k_col], bar, w_ring.index(NW * slot + 1), pred=pred)

    @gluon.jit
    def _refill(w_desc, x_desc, w_row, k_col, up_row, j, pred, w_ring, x_ring, w_bars, x_bars,
                STAGES: gl.constexpr, NW: gl.constexpr):
        """Slot j % STAGES takes the W tile(s) at (w_row, k_col) (``_load_w``) and the x tile at (0, k_col) (when
        ``pred``)."""
        sp = j % STAGES
        _load_w(w_desc, w_row, k_col, up_row, w_bars.index(sp), w_ring, sp, pred, NW)
        _load_stage(x_desc, 0, k_col, x_bars.index(sp), x_ring.index(sp), pred)

    @gluon.jit
    def _out_index(off_w, M, N, BLOCK_W: gl.constexpr, BLOCK_T: gl.constexpr, out_layout: gl.constexpr):
        """For a tile in ``out_layout``: its W rows within the tile, its tokens, the in-bounds mask and the offsets
        in y [M, N]."""
        lw = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
        rt = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, out_layout))
        rw = off_w + lw
        ok = (rw[:, None] < N) & (rt[None, :] < M)
        return lw, rt, ok, rt[None, :] * N + rw[:, None]

    @gluon.jit
    def _out_tile(acc, off_w, M, N, BLOCK_W: gl.constexpr, BLOCK_T: gl.constexpr, num_warps: gl.constexpr):
        """acc in the store's layout (consecutive threads take consecutive W rows: consecutive columns of y's row
        t), its W rows within the tile, its tokens, the in-bounds mask and the offsets in y."""
        SPT: gl.constexpr = BLOCK_W // 32
        out_layout: gl.constexpr = gl.BlockedLayout([SPT, 1], [32, 1], [1, num_warps], [0, 1])
        lw, rt, ok, out_off = _out_index(off_w, M, N, BLOCK_W, BLOCK_T, out_layout)
        return gl.convert_layout(acc, out_layout), lw, rt, ok, out_off

    @gluon.jit
    def _inv_rms(ss_ptr, NT, K, eps, BLOCK_T: gl.constexpr, NT_P: gl.constexpr, out_layout: gl.constexpr):
        """1 / rms of each token from the NT per-tile partial sums of squares ss[t, token] of the GEMM that wrote the
        residual stream (``_fused_out``'s RESID, or ``gemm_kernels._resid_out``: tiles of BLOCK_T rows, 16 there), summed
        in chunks of 32 tiles, as ``gemm_kernels._inv_rms``; in the layout of the tile's token axis."""
        CHUNK: gl.constexpr = 32 if NT_P > 32 else NT_P
        rt = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, out_layout))
        ss = gl.zeros([BLOCK_T], gl.float32, layout=gl.SliceLayout(0, out_layout))
        for t0 in gl.static_range(0, NT_P, CHUNK):
            t = t0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, out_layout))
            ss += gl.sum(gl.load(ss_ptr + t[:, None] * BLOCK_T + rt[None, :], mask=t[:, None] < NT, other=0.0),
                         axis=0)
        return 1.0 / gl.sqrt(ss / K + eps)

    @gluon.jit
    def _fused_out(total, total_u, y_ptr, ss_out_ptr, pid_w, rt, ok, out_off, inv, r_old, BLOCK_T: gl.constexpr,
                   NORM: gl.constexpr, SILU: gl.constexpr, RESID: gl.constexpr):
        """A finished fp32 tile (all splits added) to y, with the fused-norm layers' epilogues in the roundings of
        ``gemm_kernels._epilogue``: each token scaled by its 1 / rms (NORM), silu(gate) * up with both products
        rounded to y's dtype first (SILU), the residual add r = bf16(r + bf16(tile)) in place with this tile's
        sum of r^2 per token into ss[pid_w, token] (RESID), or a plain store."""
        if NORM:
            total = total * inv[None, :]
            if SILU:
                total_u = total_u * inv[None, :]
        if SILU:
            g = total.to(y_ptr.dtype.element_ty).to(gl.float32)
            total = g / (1.0 + gl.exp(-g)) * total_u.to(y_ptr.dtype.element_ty).to(gl.float32)
        if RESID:
            r = (r_old.to(gl.float32) + total.to(y_ptr.dtype.element_ty).to(gl.float32)).to(y_ptr.dtype.element_ty)
            gl.store(y_ptr + out_off, r, mask=ok)
            rf = gl.where(ok, r.to(gl.float32), 0.0)
            gl.store(ss_out_ptr + pid_w * BLOCK_T + rt, gl.sum(rf * rf, axis=0))
        else:
            gl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=ok)

    @gluon.jit
    def _wgmma_kernel(w_desc, x_desc, y_ptr, ws_ptr, cnt_ptr, M, N, ITERS, ITERS_PER_SPLIT, SPLIT,
                      ss_in_ptr, ss_out_ptr, NT_IN, K, eps,
                      HAS_SPLIT: gl.constexpr, STAGES: gl.constexpr, USE_PDL: gl.constexpr,
                      NORM: gl.constexpr, SILU: gl.constexpr, RESID: gl.constexpr, NT_P: gl.constexpr,
                      num_warps: gl.constexpr):
        """The split-K kernel. The fused-norm layers' variants (M <= FUSED_MAX_T, one token tile) add to it what
        ``gemm_kernels._gemm_kernel``'s do: ``NORM`` (x is the residual stream, W carries the norm's weight, each
        token of the finished tile scaled by its 1 / rms from the NT_IN partial sums of squares at ss_in_ptr; K is
        x's width), ``SILU`` (W is [gate | up], 2N rows: two W tiles a ring slot and two accumulators; y =
        silu(gate) * up, N columns) and ``RESID`` (y is the residual stream, updated in place, with this GEMM's
        per-tile sums of squares at ss_out_ptr). Plain calls pass NORM = SILU = RESID = False."""
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
        BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
        NW: gl.constexpr = 2 if SILU else 1
        pid_w = gl.program_id(0)
        pid_s = gl.program_id(1)
        off_w = pid_w * BLOCK_W
        it_lo = pid_s * ITERS_PER_SPLIT
        n_iters = gl.minimum(ITERS_PER_SPLIT, ITERS - it_lo)

        w_ring = gl.allocate_shared_memory(w_desc.dtype, [NW * STAGES, BLOCK_W, BLOCK_K], w_desc.layout)
        x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_T, BLOCK_K], x_desc.layout)
        w_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        x_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        _init_bars(w_bars, x_bars, STAGES)

        # weights never depend on the previous kernel: the first STAGES W tiles go out before the PDL wait
        for s in gl.static_range(STAGES):
            _load_w(w_desc, off_w, (it_lo + s) * BLOCK_K, N + off_w, w_bars.index(s), w_ring, s, s < n_iters, NW)
        if USE_PDL:
            _gdc_wait()
            _gdc_launch_dependents()
        for s in gl.static_range(STAGES):
            _load_stage(x_desc, 0, (it_lo + s) * BLOCK_K, x_bars.index(s), x_ring.index(s), s < n_iters)
        # the epilogue's own reads (1 / rms, the residual tile), issued before the K loop: their latency hides there
        out_layout: gl.constexpr = gl.BlockedLayout([BLOCK_W // 32, 1], [32, 1], [1, num_warps], [0, 1])
        # (the residual tile only at 16 tokens: held through the loop at 64 it made ptxas spill, sm_90a)
        inv = _inv_rms(ss_in_ptr, NT_IN, K, eps, BLOCK_T, NT_P, out_layout) if NORM else None
        EARLY_RESID: gl.constexpr = RESID and BLOCK_T <= 16
        if EARLY_RESID:
            _, _, r_ok, r_off = _out_index(off_w, M, N, BLOCK_W, BLOCK_T, out_layout)
            r_old = gl.load(y_ptr + r_off, mask=r_ok, other=0.0)
        else:
            r_old = None

        # [BLOCK_W, BLOCK_T]: one m64 x BLOCK_T wgmma a warp group and 64 W rows
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                              instr_shape=[16, BLOCK_T, 16])
        acc = gl.zeros([BLOCK_W, BLOCK_T], gl.float32, layout=mma_layout)
        acc_u = gl.zeros([BLOCK_W, BLOCK_T], gl.float32, layout=mma_layout) if SILU else None
        for i in range(n_iters):
            if SILU:
                acc, acc_u = _ring_mma2(acc, acc_u, i, w_ring, x_ring, w_bars, x_bars, STAGES)
            else:
                acc = _ring_mma(acc, i, w_ring, x_ring, w_bars, x_bars, STAGES)
            # the wgmma of iteration i - 1 is done: its slot takes the tiles of iteration i - 1 + STAGES
            j = i - 1 + STAGES
            _refill(w_desc, x_desc, off_w, (it_lo + j) * BLOCK_K, N + off_w, j, (i >= 1) & (j < n_iters), w_ring,
                    x_ring, w_bars, x_bars, STAGES, NW)
        if SILU:
            acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_u))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        _invalidate_bars(w_bars, x_bars, STAGES)

        tile, lw, rt, ok, out_off = _out_tile(acc, off_w, M, N, BLOCK_W, BLOCK_T, num_warps)
        tile_u = gl.convert_layout(acc_u, out_layout) if SILU else None
        if RESID and not EARLY_RESID:
            r_old = gl.load(y_ptr + out_off, mask=ok, other=0.0)
        if HAS_SPLIT:
            ws_stride = M * N * NW
            ws_off = rt[None, :] * (N * NW) + (off_w + lw)[:, None]  # SILU: the up partials N columns further on
            gl.store(ws_ptr + pid_s * ws_stride + ws_off, tile, mask=ok)
            if SILU:
                gl.store(ws_ptr + pid_s * ws_stride + ws_off + N, tile_u, mask=ok)
            _cta_barrier()  # every thread's partial is stored before the ticket (release below)
            ticket = gl.atomic_add(cnt_ptr + pid_w, 1, sem="acq_rel")
            if ticket == SPLIT - 1:
                total = gl.zeros_like(tile)
                total_u = gl.zeros_like(tile) if SILU else None
                for q in range(SPLIT):  # split order: the sum does not depend on who finishes last
                    total += gl.load(ws_ptr + q * ws_stride + ws_off, mask=ok, other=0.0, cache_modifier=".cg")
                    if SILU:
                        total_u += gl.load(ws_ptr + q * ws_stride + ws_off + N, mask=ok, other=0.0,
                                           cache_modifier=".cg")
                _fused_out(total, total_u, y_ptr, ss_out_ptr, pid_w, rt, ok, out_off, inv, r_old, BLOCK_T, NORM,
                           SILU, RESID)
                gl.atomic_xchg(cnt_ptr + pid_w, 0)
        else:
            _fused_out(tile, tile_u, y_ptr, ss_out_ptr, pid_w, rt, ok, out_off, inv, r_old, BLOCK_T, NORM, SILU,
                       RESID)

    @gluon.jit
    def _stream_k_store(acc, y_ptr, ws_ptr, cnt_ptr, pid, tile, tile_lo, it_lo, it_hi, iters, M, N, KB, PROGRAMS,
                        BLOCK_W: gl.constexpr, BLOCK_T: gl.constexpr, num_warps: gl.constexpr):
        """One finished segment of ``tile``: stored whole when this program ran all its K iterations, else kept
        as a partial (slot 0: the program's first segment, 1: its last) and, by the program that draws the
        tile's last ticket, added up in program order with the others and stored."""
        part, lw, rt, ok, out_off = _out_tile(acc, tile * BLOCK_W, M, N, BLOCK_W, BLOCK_T, num_warps)
        whole = (it_lo <= tile * KB) & (it_hi >= (tile + 1) * KB)
        if whole:
            gl.store(y_ptr + out_off, part.to(y_ptr.dtype.element_ty), mask=ok)
        else:
            # within a workspace slot, token-major ([BLOCK_T, BLOCK_W]) like the tile's threads, which run along
            # W rows: stores and loads coalesce (W-row-major, each warp's accesses were BLOCK_T * 4 bytes apart)
            slot_off = rt[None, :] * BLOCK_W + lw[:, None]
            slot = (tile != tile_lo).to(gl.int32)
            gl.store(ws_ptr + (pid * 2 + slot) * (BLOCK_W * BLOCK_T) + slot_off, part)
            _cta_barrier()  # every thread's partial is stored before the ticket (release below)
            ticket = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            first = ((tile * KB + 1) * PROGRAMS - 1) // iters
            last = ((tile + 1) * KB * PROGRAMS - 1) // iters
            if ticket == gl.minimum(last - first + 1, KB) - 1:
                total = gl.zeros_like(part)
                for q in range(first, last + 1):  # program order: the sum does not depend on who finishes last
                    q_lo = q * iters // PROGRAMS
                    if (q + 1) * iters // PROGRAMS > q_lo:
                        q_slot = (q_lo < tile * KB).to(gl.int32)  # the tile is q's last segment
                        total += gl.load(ws_ptr + (q * 2 + q_slot) * (BLOCK_W * BLOCK_T) + slot_off,
                                         cache_modifier=".cg")
                gl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=ok)
                gl.atomic_xchg(cnt_ptr + tile, 0)

    @gluon.jit
    def _wgmma_stream_k_kernel(w_desc, x_desc, y_ptr, ws_ptr, cnt_ptr, M, N, KB, PROGRAMS,
                               STAGES: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr):
        """Stream-K: PROGRAMS persistent programs share the I = tiles * KB iterations (tile-major: iteration i is
        W tile i // KB, k-block i % KB); program p runs [p*I // P, (p+1)*I // P) through one ring, so the TMA
        copies of the next tile's first k-blocks are in flight while a tile's last wgmma and its store run."""
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
        BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
        pid = gl.program_id(0)
        iters = gl.cdiv(N, BLOCK_W) * KB
        it_lo = pid * iters // PROGRAMS
        it_hi = (pid + 1) * iters // PROGRAMS
        n_iters = it_hi - it_lo
        tile_lo = it_lo // KB

        w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_W, BLOCK_K], w_desc.layout)
        x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_T, BLOCK_K], x_desc.layout)
        w_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        x_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        _init_bars(w_bars, x_bars, STAGES)

        for s in gl.static_range(STAGES):  # W before the PDL wait, as in _wgmma_kernel
            i = it_lo + s
            _load_stage(w_desc, (i // KB) * BLOCK_W, (i % KB) * BLOCK_K, w_bars.index(s), w_ring.index(s),
                        s < n_iters)
        if USE_PDL:
            _gdc_wait()
            _gdc_launch_dependents()
        for s in gl.static_range(STAGES):
            _load_stage(x_desc, 0, ((it_lo + s) % KB) * BLOCK_K, x_bars.index(s), x_ring.index(s), s < n_iters)

        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                              instr_shape=[16, BLOCK_T, 16])
        # segments: the tiles this range touches, each from its first k-block here to its last; the ring index r
        # runs on across them, and the K loop holds no branch
        tile_hi = gl.where(n_iters > 0, gl.cdiv(it_hi, KB), tile_lo)
        r = 0
        for tile in range(tile_lo, tile_hi):
            kb_lo = gl.maximum(it_lo - tile * KB, 0)
            kb_hi = gl.minimum(it_hi - tile * KB, KB)
            acc = gl.zeros([BLOCK_W, BLOCK_T], gl.float32, layout=mma_layout)
            for kb in range(kb_lo, kb_hi):
                acc = _ring_mma(acc, r, w_ring, x_ring, w_bars, x_bars, STAGES)
                j = r - 1 + STAGES
                ij = it_lo + j
                _refill(w_desc, x_desc, (ij // KB) * BLOCK_W, (ij % KB) * BLOCK_K, 0, j, (r >= 1) & (j < n_iters),
                        w_ring, x_ring, w_bars, x_bars, STAGES, 1)
                r += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            _stream_k_store(acc, y_ptr, ws_ptr, cnt_ptr, pid, tile, tile_lo, it_lo, it_hi, iters, M, N, KB,
                            PROGRAMS, BLOCK_W, BLOCK_T, num_warps)
        _invalidate_bars(w_bars, x_bars, STAGES)


def wgmma_linear(x: torch.Tensor, w: torch.Tensor, cfg: WgmmaConfig, use_pdl: bool = False) -> torch.Tensor:
    """x [M, K] bf16 -> x W^T [M, N] bf16 with ``_wgmma_kernel`` (Hopper, M <= 256, K a multiple of 8)."""
    cfg = WgmmaConfig(*cfg)
    return _launch(x, w, cfg, torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device), use_pdl)


def wgmma_fused_linear(x: torch.Tensor, w: torch.Tensor, cfg: WgmmaConfig, y: torch.Tensor, use_pdl: bool = False,
                       norm: tuple[torch.Tensor, int, float] | None = None, silu: bool = False,
                       squares_out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused-norm layers' GEMMs on the split-K kernel (M <= FUSED_MAX_T, one token tile), into y:
    ``norm`` = (ss, tiles, eps): x is the residual stream and each output row is scaled by its 1 / rms from the
    ``tiles`` partial sums of squares ss[tile, row] (W carries the norm's weight: ``gemm.fold_norm``); ``silu``: W is
    [gate | up] (2N rows) and y [M, N] = silu(gate) * up; ``squares_out``: y is the residual stream, updated in place
    to y + x W^T, and ``squares_out`` [cdiv(N, block_w) * block_t(M)] takes each column tile's sums of squares per row.
    ``gemm.norm_linear`` / ``gemm.residual_linear`` check the shapes and make the buffers."""
    cfg = WgmmaConfig(*cfg)
    if cfg.programs or block_t(x.shape[0]) > FUSED_MAX_T:
        raise ValueError(f"wgmma_fused_linear: a split-K config for at most {FUSED_MAX_T} rows, not {tuple(cfg)} for "
                         f"M={x.shape[0]}")
    return _launch(x, w, cfg, y, use_pdl, norm, silu, squares_out)


def _launch(x: torch.Tensor, w: torch.Tensor, cfg: WgmmaConfig, y: torch.Tensor, use_pdl: bool,
            norm: tuple[torch.Tensor, int, float] | None = None, silu: bool = False,
            squares_out: torch.Tensor | None = None) -> torch.Tensor:
    if not _GLUON:
        raise RuntimeError(f"this Triton ({triton.__version__}) has no Gluon")
    m, k = x.shape
    n = w.shape[0] // 2 if silu else w.shape[0]
    if not fits(cfg, m, 2 if silu else 1):
        raise ValueError(f"wgmma config {tuple(cfg)} does not fit M={m}{' (silu)' if silu else ''}")
    if w.shape[1] != k or x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or (silu and w.shape[0] % 2):
        raise ValueError(f"wgmma_linear: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}")
    if y.shape != (m, n) or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError(f"wgmma_linear: y {tuple(y.shape)} {y.dtype}, not a contiguous [{m}, {n}] {x.dtype}")
    bt = block_t(m)
    per, split = k_iters_per_split(k, cfg)
    tiles = triton.cdiv(n, cfg.block_w)
    assert tiles <= kernels.MAX_TICKETS
    if squares_out is not None and squares_out.numel() < tiles * bt:
        raise ValueError(f"wgmma_linear: squares_out of {squares_out.numel()} values, not {tiles} tiles x {bt} rows")
    w_layout = gl.NVMMASharedLayout.get_default_for([cfg.block_w, cfg.block_k], gl.bfloat16)
    x_layout = gl.NVMMASharedLayout.get_default_for([bt, cfg.block_k], gl.bfloat16)
    w_desc = TensorDescriptor(w, list(w.shape), list(w.stride()), [cfg.block_w, cfg.block_k], w_layout)
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [bt, cfg.block_k], x_layout)
    tickets = kernels.counters(x.device)  # taken after the PDL wait: the kernel before has reset its own
    if cfg.programs:
        ws = torch.empty(cfg.programs, 2, cfg.block_w, bt, dtype=torch.float32, device=x.device)
        _wgmma_stream_k_kernel[(cfg.programs,)](w_desc, x_desc, y, ws, tickets, m, n, triton.cdiv(k, cfg.block_k),
                                                cfg.programs, STAGES=cfg.stages, USE_PDL=use_pdl,
                                                num_warps=cfg.warps, **kernels.pdl_kwargs(use_pdl))
        return y
    ws = torch.empty(split, m, (2 if silu else 1) * n, dtype=torch.float32, device=x.device) if split > 1 else y
    ss_in, nt_in, eps = norm if norm is not None else (ws, 1, 0.0)
    _wgmma_kernel[(tiles, split)](w_desc, x_desc, y, ws, tickets, m, n, triton.cdiv(k, cfg.block_k), per, split,
                                  ss_in, ws if squares_out is None else squares_out, nt_in, k, eps,
                                  HAS_SPLIT=split > 1, STAGES=cfg.stages, USE_PDL=use_pdl, NORM=norm is not None,
                                  SILU=silu, RESID=squares_out is not None,
                                  NT_P=triton.next_power_of_2(nt_in), num_warps=cfg.warps,
                                  **kernels.pdl_kwargs(use_pdl))
    return y
