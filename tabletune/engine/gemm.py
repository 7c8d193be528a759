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

cuBLASLt's heuristic list (``cublaslt.heuristics``, plain shapes up to MAX_CHOOSE_M rows): torch runs only the
first kernel of that list; the chooser times the first ``LT_ALGOS`` (tiles, split-K, stages) like its other
candidates. ``use_lt = False`` makes every later call (and capture) take the fastest other candidate instead, for
same-card A/B comparisons without re-timing.

TMA configs (``Config.tma``, 16 < M <= 512, plain shapes): the same split-K scheme with the
x and W tiles fetched by Hopper's tensor-memory accelerator through host tensor descriptors
(zero-filled past M and K, so the K loop carries no masks), for the mid-M shapes where the
pointer kernel ran at half of cuBLAS. cuBLASLt (torch's preferred-BLAS switch) is one more
candidate: its heuristics pick other kernels than cuBLAS's at some shapes.

Fused-norm layers (``norm_linear`` / ``residual_linear``, M <= 16, the pointer kernel; only the epilogue
differs from the plain GEMM): the o and down GEMMs add their product into the residual stream and leave each
column tile's sums of squares per row (``RESID``); the qkv and gate_up GEMMs read the residual stream through a
copy of W with the norm's weight folded in (``fold_norm``) and scale each finished row by its 1 / rms (``NORM``),
and gate_up also writes silu(gate) * up from two accumulators (``SILU``), so a decode layer has no norm or
silu * mul launch. Off by default (``EngineConfig.fuse_norm_max_rows``): on the H200 the fused step measured
-2.6% to +4.0% against the standard one (gate_up's Triton kernel is ~7 us behind cuBLAS at N = 24576, more than
the three launches it saves; engine 0.7.dev1, which normalised x and took silu * mul inside the K loop, was 2x
slower: docs/engine_notes.md, 0.7.dev2).

Stream-K configs (``Config.stream_k`` = P, M <= 64, plain shapes): split-K launches tiles x splits
programs, rarely a multiple of the SM count, so the last wave runs part-empty (the small projections
streamed W at 2.4-3.2 TB/s of a 4.2 TB/s copy rate on the H200). The stream-K kernel launches exactly P
persistent programs (one or two per SM) and deals out the K iterations of all output tiles evenly:
program p runs a contiguous range of them, tile by tile, and writes a tile it covered whole; tiles shared
by several programs get the same deterministic ticket fix-up as split-K (partials added in program order).

Set-up only: the first call of a (M, N, K, gated) checks every candidate (cuBLAS at M and
padded, cuBLASLt, the Triton configs for M <= 512) against torch on fresh inputs, times those
that agree, and remembers the winner (that happens in the
warm-up before CUDA graph capture); later calls and graph replays just launch it. From CONTEXT_MIN_ROWS rows on
each candidate is timed followed by a small PDL kernel (``TIMING``): in the step every GEMM sits between such
kernels, and one that does not let them start early (cuBLAS's) leaves ~1 us of idle time on each side that
timing it alone, back to back, does not show (H200 replay traces; in the step -1.8% to -2.5% at b = 4-8 with
k = 4-7; below 17 rows the in-context choice lost up to 5%, so those keep the timings alone: docs/engine_notes.md,
0.7.dev5).

The Triton kernels themselves are in ``gemm_kernels``; this module launches and chooses them.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton

from tabletune.engine import cublaslt, gemm_wgmma, kernels
from tabletune.engine.gemm_kernels import _gemm_kernel, _gemm_stream_k_kernel, _gemm_tma_kernel
from tabletune.engine.model import FUSED_NORM_MAX_M, FUSED_POINTER_M

MAX_TRITON_M = 512
MAX_CHOOSE_M = 4096  # above this, cuBLAS at M without timing
PREFETCH_K = 512  # with PDL: K columns of its weight rows a program pulls into L2 before waiting (0: off)
STREAM_K_PROGRAMS = (132, 264)  # stream-K persistent programs: one or two per H200 SM (a kernel argument: no compile)
SMEM_BYTES = 200 * 1024  # H100/H200: 227 KB per block; leave room for the epilogue
# cuBLASLt heuristic kernels timed per shape; 0 (none) by default: on the H200 they won 80 of 220 shapes timed
# alone (1-7%) and lost or tied inside the step (-0.1% to +5.1%, docs/engine_notes.md, 0.7.dev5)
LT_ALGOS = int(os.environ.get("TABLETUNE_LT_ALGOS", "0"))
use_lt = True  # False: calls take the fastest candidate that is not a cuBLASLt heuristic kernel (A/B)
# True: calls take the fastest Triton config timed for a shape (gated shapes: a Triton config or silu_mul followed by
# the plain shape's pick), where one was timed, and cuBLAS's only where none was. Every Triton kernel here waits on
# and releases its neighbours by PDL, cuBLAS's kernels do neither, so a step of cuBLAS GEMMs loses that overlap
# (H200 replay traces, b = 16: 0.21 ms idle and no overlap with cuBLAS at every GEMM of k = 4, 0.03 ms idle and
# 3.6 ms of overlapped kernel time with Triton's at k = 3; at b = 1 gate_up turns cuBLAS from k = 4 and the replay
# grows by 0.17 ms for 0.04 ms more kernel time; benchmarks/results/engine_step_breakdown_h200_v7dev7.log).
# For A/B (engine_roofline.py --gemm-triton-compare) and the in-step choice (EngineConfig.gemm_step_choice).
triton_only = False
# How a candidate is timed: "alone" (10 calls back to back, engine <= 0.7.dev4), "context" (each call followed by
# silu_mul, the small PDL kernel that follows gate_up in the step: a GEMM that lets no PDL kernel after it start
# early, as cuBLAS's do not, pays for that here as it does in the step), "auto" (the default: in context from
# CONTEXT_MIN_ROWS rows on, alone below) or "both" (for A/B, twice the timing: calls follow the in-context timings
# from CONTEXT_MIN_ROWS rows on; ``use_context`` off: all alone).
TIMINGS = ("alone", "context", "auto", "both")
TIMING = os.environ.get("TABLETUNE_GEMM_TIMING", "auto")
if TIMING not in TIMINGS:
    raise ValueError(f"TABLETUNE_GEMM_TIMING={TIMING!r}: one of {', '.join(TIMINGS)}")
use_context = TIMING != "alone"
# Split-K partials added atomically into an fp32 accumulator that the next add_rms_norm reads and zeroes
# (``linear(..., accumulate=True)``: the o and down GEMMs of the decode layers), instead of the ticketed fix-up by the
# split that finishes last, for Triton pointer configs of one or two splits (bit-identical: see
# ``gemm_kernels._store_or_fix_up``). The fix-up puts a ticket round trip and a read of the partials on the tail of
# every split-K GEMM. On by default at M <= ATOMIC_MAX_ROWS (env TABLETUNE_GEMM_ATOMIC=0 or ``atomic_split`` off).
# H200, one card, same-run A/B of the step graphs (benchmarks/results/engine_gemm_atomic_h200.log): -0.9% to -1.3%
# at the six cells of M = 1-8 rows, +0.3% to +0.8% at M = 16, 40 and 64, 0.0% at M = 24.
atomic_split = os.environ.get("TABLETUNE_GEMM_ATOMIC", "1") == "1"
# The Gluon wgmma kernel (``gemm_wgmma``: TMA ring, asynchronous wgmma with the tile as W x^T, the W tiles asked for
# before the PDL wait) as a candidate for plain bf16 shapes of WGMMA_MIN_ROWS..WGMMA_MAX_ROWS rows on Hopper (env
# TABLETUNE_GEMM_WGMMA=0: never; docs/engine_notes.md, session 16). H200: alone it is within 13% of cuBLAS up to
# 64 rows and slower from 96 (benchmarks/results/engine_gemm_wgmma_h200.md). In the step, two same-process A/Bs of
# all 48 cells of b <= 32 (``engine_roofline.py --gemm-wgmma-compare``): -1% to -5% at M = 8-32, within +-0.5% from
# 40 rows, +0.3% to +1.8% at 2-6 rows; builds of 0.7.dev8 and with the kernel on one card: -1.9% to -3.6% at the
# M = 20-28 cells (4, 4-6) and (8, 2), where 0.7.dev8's step times bent upwards. The A/Bs' baseline shared the
# in-step GEMM choice made with the kernel available. The fair A/B (session 17: each variant with its own in-step
# choice, the kernel offered from 8 rows, benchmarks/results/engine_gemm_wgmma_ab_h200_fair.log): -0.8% to -2.3%
# at the M = 10-14 cells (2, 4-6), (4, 2), -0.4% to +0.5% at M = 8 and 16 (noise: the M = 1-2 cells +-0.1%), so
# from WGMMA_MIN_ROWS = 9 it is a candidate; below CONTEXT_MIN_ROWS it is timed alone, as every candidate there.
# ``use_wgmma`` off: calls take the fastest other candidate (A/B).
WGMMA = os.environ.get("TABLETUNE_GEMM_WGMMA", "1") == "1"
WGMMA_MAX_ROWS = 64
# The stream-K wgmma configs (opt-in, gemm_wgmma.STREAM_K) are candidates up to this many rows: at M = 80-128 (b = 16,
# k = 4-7) the chooser picks cuBLAS, whose kernels stay outside the step's PDL chain, and the split-K kernel lost there
WGMMA_STREAM_K_MAX_ROWS = 128
_min_rows = os.environ.get("TABLETUNE_GEMM_WGMMA_MIN_ROWS", "9")  # for A/Bs of fewer rows
if not _min_rows.isdigit() or not 1 <= int(_min_rows) <= WGMMA_MAX_ROWS:
    raise ValueError(f"TABLETUNE_GEMM_WGMMA_MIN_ROWS={_min_rows!r}: a whole number from 1 to {WGMMA_MAX_ROWS}")
WGMMA_MIN_ROWS = int(_min_rows)
use_wgmma = True
use_stream_k = True  # off: calls take the fastest candidate other than the stream-K wgmma configs (A/B)
# The fused-norm layers' GEMMs (norm_linear / residual_linear, EngineConfig.fuse_norm_max_rows) also on the wgmma
# kernel, whose NORM / SILU / RESID epilogues are those of the pointer kernel (env TABLETUNE_GEMM_WGMMA_FUSED=0: the
# pointer kernel's only). The fused-norm layers lost on the H200 because the pointer kernel's gate_up (+ silu) ran
# ~7 us behind cuBLAS at N = 24576, more than the three launches a layer they save (docs/engine_notes.md, 0.7.dev2);
# the wgmma kernel's plain gate_up is at or under cuBLAS's at 16 rows (session 17).
WGMMA_FUSED = os.environ.get("TABLETUNE_GEMM_WGMMA_FUSED", "1") == "1"
ATOMIC_MAX_SPLIT = 2  # more splits would add in arrival order: not deterministic
ATOMIC_MAX_ROWS = 8  # the GEMMs of more rows keep the fix-up (slower with the atomics in the step above)
CONTEXT_MIN_ROWS = 17  # below this M calls follow the timings alone (where every candidate but cuBLAS is a PDL
# kernel, in-context timing measured +1.4% to +4.5% in the step at M = 12-16 and -1.4% to -2.8% at M = 32-64)


class Config(NamedTuple):
    """A Triton GEMM config; ``tma``: the TMA kernel (plain, not gated) instead of pointer loads; ``stream_k``:
    if not 0, the stream-K kernel (plain) with that many persistent programs (``split`` unused). With ``tma``:
    ``swap`` computes the tile as W x^T; no chooser config sets it (H200: no faster than the plain tile and
    slower than cuBLAS at M = 64-256; benchmarks/engine_gemm_midm.py, docs/engine_notes.md, session 15)."""
    block_m: int
    block_n: int
    block_k: int
    split: int
    warps: int
    stages: int
    tma: bool = False
    stream_k: int = 0
    swap: bool = False


def fits_smem(c: Config, weight_tiles: int = 1) -> bool:
    """Whether a pointer config's pipeline fits SMEM_BYTES: ``stages`` x (an x tile + ``weight_tiles`` W tiles) of
    BLOCK_K bf16 columns (two W tiles: the fused-norm layers' SILU variant)."""
    return c.stages * (c.block_m + weight_tiles * c.block_n) * c.block_k * 2 <= SMEM_BYTES


def _skinny(bm: int, gated: bool) -> list[tuple[int, int, int, int, int, int]]:
    """The pointer kernel's configs of one row block of ``bm`` rows."""
    if gated:
        return [(bm, 64, 128, s, 4, 4) for s in (1, 2, 4, 8)]
    # BLOCK_N 32 and splits 3, 6: more ways to make the program count a multiple of the SM count
    return [(bm, bn, bk, s, 4, st) for bn in (32, 64) for bk, st in ((128, 6), (256, 4)) for s in (1, 2, 3, 4, 6, 8)]


def _configs(m: int, gated: bool, tma: bool = True) -> list[Config]:
    """Triton candidates for M rows that fit in shared memory: the pointer kernel's, for 16 < M <= 512
    (plain shapes, where wgmma tiles of 64 / 128 rows apply) the TMA kernel's, and for M <= 64 (plain) the
    stream-K kernel's with one row block.

    Kept small: every distinct config is a Triton compile at start-up.
    """
    mid = [(128, bn, 64, s, 8, 3) for bn in (128, 256) for s in (1, 2, 4)] + \
        [(64, bn, 64, s, 4, 4) for bn in (128, 256) for s in (1, 2)]
    cands = []
    if m <= 128:
        # one row block of next_pow2(M) rows (M <= 64), or several smaller ones: the programs of one weight tile
        # are adjacent in launch order, so the row blocks after the first mostly read the tile from L2
        row_blocks = {bm for bm in (16, 32, 64) if bm < m} | ({max(16, triton.next_power_of_2(m))} if m <= 64 else set())
        cands = [c for bm in sorted(row_blocks) for c in _skinny(bm, gated)]
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
    return [c for c in cands if fits_smem(c)]


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
    if gated and (cfg.tma or cfg.stream_k):
        raise ValueError("the TMA and stream-K GEMMs have no gated variant")
    pdl = kernels.pdl_enabled(x)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if cfg.stream_k:
        assert triton.cdiv(m, bm) * triton.cdiv(n, bn) <= kernels.MAX_TICKETS
        ws = torch.empty(cfg.stream_k, 2, bm, bn, dtype=torch.float32, device=x.device)
        _gemm_stream_k_kernel[(cfg.stream_k,)](x, w, y, ws, kernels.counters(x.device), m, n, k, cfg.stream_k,
                                               BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, USE_PDL=pdl, num_warps=warps,
                                               num_stages=stages, **kernels.pdl_kwargs(pdl))
        return y
    if not cfg.tma:
        return _pointer_gemm(x, w, cfg, y, gated)
    per_split, split, ws, grid = _split_k(m, n, k, bm, bn, bk, split, y)
    from triton.tools.tensor_descriptor import TensorDescriptor

    _gemm_tma_kernel[grid](TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                           y, ws, kernels.counters(x.device), m, n, k, per_split, m * n, BLOCK_M=bm, BLOCK_N=bn,
                           BLOCK_K=bk, SPLIT=split, USE_PDL=pdl, num_warps=warps, num_stages=stages,
                           SWAP=cfg.swap, **kernels.pdl_kwargs(pdl))
    return y


def _k_splits(k: int, split: int, bk: int) -> tuple[int, int]:
    """(K columns a split, a multiple of bk; the split count that leaves none empty) for ``split`` asked."""
    per_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
    return per_split, triton.cdiv(k, per_split)


def _split_k(m: int, n: int, k: int, bm: int, bn: int, bk: int, split: int, y: torch.Tensor, accumulators: int = 1):
    """K columns a split (a multiple of bk), the split count that leaves none empty, the fp32 workspace of the
    partials (``accumulators`` x n columns; y itself when there is one split or no accumulator) and the grid."""
    per_split, split = _k_splits(k, split, bk)
    ws = torch.empty(split, m, accumulators * n, dtype=torch.float32, device=y.device) \
        if split > 1 and accumulators else y
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    assert grid[0] * grid[1] <= kernels.MAX_TICKETS
    return per_split, split, ws, grid


def _pointer_gemm(x: torch.Tensor, w: torch.Tensor, cfg: Config, y: torch.Tensor, gated: bool = False,
                  norm: "RowNorm | None" = None, squares_out: torch.Tensor | None = None, silu: bool = False,
                  atomic: bool = False) -> torch.Tensor:
    """``_gemm_kernel`` into y (with ``squares_out``: y is the residual stream, updated in place; ``norm``: rows
    scaled by their 1 / rms; ``silu``: W is [gate | up] and y silu(gate) * up, half as wide; ``atomic``: y is an
    fp32 accumulator of zeros that every split adds into, at most ATOMIC_MAX_SPLIT splits, no workspace)."""
    bm, bn, bk, split, warps, stages = cfg[:6]
    m = x.shape[0]
    n, k = w.shape
    if silu:
        n //= 2
    if atomic:
        if norm is not None or squares_out is not None or silu or y.dtype != torch.float32:
            raise ValueError("the atomic split-K GEMM is plain or gated, into an fp32 accumulator")
        per_split, split, _, grid = _split_k(m, n, k, bm, bn, bk, split, y, 0)
        if split > ATOMIC_MAX_SPLIT:
            raise ValueError(f"{split} splits would add in arrival order (at most {ATOMIC_MAX_SPLIT})")
        ws = y
    else:
        per_split, split, ws, grid = _split_k(m, n, k, bm, bn, bk, split, y, 2 if silu else 1)
    ss_in, tiles, eps = (ws, 1, 0.0) if norm is None else (norm.squares.ss, norm.squares.tiles, norm.eps)
    pdl = kernels.pdl_enabled(x)
    _gemm_kernel[grid](x, w, y, ws, kernels.counters(x.device), m, n, k, per_split, ws[0].numel() if split > 1 else 0,
                       ss_in, ws if squares_out is None else squares_out, tiles, eps, BLOCK_M=bm, BLOCK_N=bn,
                       BLOCK_K=bk, SPLIT=split, GATED=gated, USE_PDL=pdl,
                       PREFETCH_K=_prefetch_k(x, per_split) if pdl else 0, NORM=norm is not None, SILU=silu,
                       RESID=squares_out is not None, NT_P=_tiles_p2(norm), num_warps=warps, num_stages=stages,
                       **kernels.pdl_kwargs(pdl), **({"ATOMIC": True} if atomic else {}))
    return y


class RowSquares(NamedTuple):
    """Per-row sums of squares of the residual stream, as ``tiles`` column-tile partials ss[tile, row] of
    ``squares_rows(M)`` rows (written by a residual-epilogue GEMM, ``residual_linear``)."""
    ss: torch.Tensor
    tiles: int


class RowNorm(NamedTuple):
    """An RMSNorm of a GEMM's input rows (the residual stream) from their ``RowSquares``: each output row is scaled
    by 1 / rms; the norm's weight lives in the GEMM's W (``fold_norm``)."""
    squares: RowSquares
    eps: float


def _tiles_p2(norm: RowNorm | None) -> int:
    return 1 if norm is None else triton.next_power_of_2(norm.squares.tiles)


FUSED_ROWS = FUSED_POINTER_M  # the pointer kernel's fused-norm GEMMs: one row block of this many rows


def fused_max_rows(w: torch.Tensor) -> int:
    """Rows up to which the fused-norm layers can run with weights like ``w``: FUSED_NORM_MAX_M where the wgmma
    kernel's epilogues can (WGMMA_FUSED, Hopper, bf16), else the pointer kernel's FUSED_ROWS."""
    return FUSED_NORM_MAX_M if WGMMA_FUSED and wgmma_runs(w) else FUSED_ROWS


def squares_rows(m: int) -> int:
    """Rows a ``RowSquares`` tile holds for M rows: the GEMM's token tile (16 for the pointer kernel's one row block,
    ``gemm_wgmma.block_t`` for the wgmma kernel's, the same at M <= 16)."""
    return gemm_wgmma.block_t(m)


def fold_norm(w: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """W diag(norm_weight), rounded once to W's dtype: RMSNorm(x) W^T = (x W'^T) / rms(x) for ``norm_linear``."""
    return (w.float() * norm_weight.float()[None, :]).to(w.dtype)


def _fused_config(cfg) -> "Config | gemm_wgmma.WgmmaConfig":
    """A fused-norm GEMM's config: a ``gemm_wgmma.WgmmaConfig`` as it is, any other tuple as a pointer ``Config``."""
    return cfg if isinstance(cfg, gemm_wgmma.WgmmaConfig) else Config(*cfg)


def _check_fused(name: str, x: torch.Tensor, w: torch.Tensor, cfg, gated: bool = False) -> None:
    m, width = x.shape
    if isinstance(cfg, gemm_wgmma.WgmmaConfig):
        if cfg.programs or gated or m > FUSED_NORM_MAX_M:
            raise ValueError(f"{name}: a split-K wgmma config (not gated) for at most {FUSED_NORM_MAX_M} rows, not "
                             f"{cfg} for M={m} (gated={gated})")
    elif cfg.tma or cfg.stream_k or cfg.block_m != FUSED_ROWS or m > FUSED_ROWS:
        raise ValueError(f"{name}: a pointer config of {FUSED_ROWS} rows for at most {FUSED_ROWS} rows, not {cfg} "
                         f"for M={m}")
    if width != w.shape[1] * (2 if gated else 1) or not x.is_contiguous():
        raise ValueError(f"{name}: x {tuple(x.shape)} against W {tuple(w.shape)} (gated={gated}, contiguous)")


def norm_linear(x: torch.Tensor, w: torch.Tensor, cfg, norm: RowNorm, silu: bool = False) -> torch.Tensor:
    """RMSNorm(x) W^T [M, N] for the residual stream x [M, K] (M <= 16 on a pointer ``Config`` of 16 rows, up to
    FUSED_NORM_MAX_M on a split-K ``gemm_wgmma.WgmmaConfig``), with W = ``fold_norm``(W, norm weight)
    and the rows' 1 / rms from ``norm.squares``, applied to the finished tile. ``silu``: W is [gate | up] (2N rows)
    and the result silu(RMSNorm(x) W_gate^T) * (RMSNorm(x) W_up^T) [M, N], as ``kernels.silu_mul`` rounds it."""
    cfg = _fused_config(cfg)
    _check_fused("norm_linear", x, w, cfg)
    if silu and w.shape[0] % 2:
        raise ValueError(f"norm_linear: a [gate | up] W has an even row count, not {w.shape[0]}")
    n = w.shape[0] // 2 if silu else w.shape[0]
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    if isinstance(cfg, gemm_wgmma.WgmmaConfig):
        return gemm_wgmma.wgmma_fused_linear(x, w, cfg, y, kernels.pdl_enabled(x),
                                             norm=(norm.squares.ss, norm.squares.tiles, norm.eps), silu=silu)
    return _pointer_gemm(x, w, cfg, y, norm=norm, silu=silu)


def residual_linear(x: torch.Tensor, w: torch.Tensor, cfg, residual: torch.Tensor, gated: bool = False
                    ) -> RowSquares:
    """residual += x W^T in place (gated: (silu(gate) * up) W^T for x = [gate | up]), rounded as
    ``kernels.add_rms_norm`` rounds the residual add, and the rows' sums of squares for the next GEMM's norm."""
    cfg = _fused_config(cfg)
    _check_fused("residual_linear", x, w, cfg, gated)
    m, n = x.shape[0], w.shape[0]
    if residual.shape != (m, n) or not residual.is_contiguous():
        raise ValueError(f"residual_linear: residual {tuple(residual.shape)}, not a contiguous [{m}, {n}]")
    wgmma = isinstance(cfg, gemm_wgmma.WgmmaConfig)
    tiles = triton.cdiv(n, cfg.block_w if wgmma else cfg.block_n)
    ss = torch.empty(tiles * squares_rows(m), dtype=torch.float32, device=x.device)
    if wgmma:
        gemm_wgmma.wgmma_fused_linear(x, w, cfg, residual, kernels.pdl_enabled(x), squares_out=ss)
    else:
        _pointer_gemm(x, w, cfg, residual, gated, squares_out=ss)
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
            _gemm_kernel[(1, 1, 1)](a, w, y, y, kernels.counters(x.device), 1, 64, 64, 64, 64, y, y, 1, 0.0,
                                    BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, SPLIT=1, GATED=False, USE_PDL=True,
                                    PREFETCH_K=64, launch_pdl=True)
            _prefetch_ok[x.device] = bool((y == 64).all())
        except Exception as exc:  # this Triton / GPU cannot: run without the prefetch
            print(f"tabletune: GEMM prefetch off ({type(exc).__name__}: {exc})")
            _prefetch_ok[x.device] = False
    return 1 << (n.bit_length() - 1) if _prefetch_ok[x.device] else 0


# (M, N, K, gated) -> None: cuBLAS at M; an int: cuBLAS on that many (padded) rows; CUBLASLT: cuBLASLt at M;
# a cublaslt.Algo: that kernel of cuBLASLt's heuristic list; a Config: Triton. (M, N, K, one of FUSED_KINDS) ->
# the fused-norm layers' pointer config.
_choice: dict[tuple[int, int, int, bool | str], Config | int | str | cublaslt.Algo | None] = {}
_timings: dict[tuple[int, int, int, bool | str], dict] = {}  # key -> {choice: us} of every candidate timed alone
_context_timings: dict[tuple[int, int, int, bool | str], dict] = {}  # ... timed with silu_mul after each call
_current: dict[tuple, object] = {}  # (key, switches) -> ``current``'s answer; cleared when timings are stored


def _timing_kinds(m: int) -> tuple[bool, bool]:
    """Whether the chooser times M-row candidates alone, and whether in context (``TIMING``)."""
    if TIMING == "auto":
        return m < CONTEXT_MIN_ROWS, m >= CONTEXT_MIN_ROWS
    return TIMING in ("alone", "both"), TIMING in ("context", "both")


def _scores(key: tuple) -> dict:
    """{choice: us} that calls choose from: the in-context timings with ``use_context`` (else those alone), or
    the other kind where only that one was measured."""
    ctx, alone = _context_timings.get(key), _timings.get(key)
    return (ctx or alone or {}) if use_context and key[0] >= CONTEXT_MIN_ROWS else (alone or ctx or {})


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
    if isinstance(choice, gemm_wgmma.WgmmaConfig):
        return gemm_wgmma.wgmma_linear(x, w, choice, kernels.pdl_enabled(x))
    if isinstance(choice, cublaslt.Algo):
        return cublaslt.matmul(x, w, choice) if cublaslt.usable(x, w) else torch.mm(x, w.t())
    if isinstance(choice, tuple):
        return triton_linear(x, w, choice, gated)
    if gated:
        return _unfused(x, w, gated)
    return _mm_lt(x, w) if choice == CUBLASLT else _mm(x, w, choice)


def _unfused(x: torch.Tensor, w: torch.Tensor, gated: bool) -> torch.Tensor:
    """silu_mul (if gated), then the choice made for the plain shape (cuBLAS, padded cuBLAS, cuBLASLt or Triton)."""
    if gated:
        x = kernels.silu_mul(x, w.dtype)
        return _run(x, w, current((x.shape[0], w.shape[0], w.shape[1], False)))
    return torch.mm(x, w.t())


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def current(key: tuple) -> Config | int | str | cublaslt.Algo | None:
    """The fastest candidate timed for ``key`` under the A/B switches (``use_context``: which timings; ``use_lt``
    off: no cuBLASLt heuristic kernel; ``use_wgmma`` / ``use_stream_k`` off: no wgmma config / no stream-K one;
    ``triton_only``: a Triton config where one was timed), else the choice
    recorded for it (None if none was made). Remembered per key and switches: eager steps call this for every
    GEMM."""
    memo = (key, use_lt, use_context, CONTEXT_MIN_ROWS, triton_only, use_wgmma, use_stream_k)
    if memo not in _current:
        if key not in _choice:
            return None
        timed = {c: us for c, us in _scores(key).items() if (use_lt or not isinstance(c, cublaslt.Algo))
                 and (use_wgmma or not isinstance(c, gemm_wgmma.WgmmaConfig))
                 and (use_stream_k or not (isinstance(c, gemm_wgmma.WgmmaConfig) and c.programs))}
        if triton_only:
            timed = {c: us for c, us in timed.items() if _in_pdl_chain(c, key)} or timed
        _current[memo] = min(timed, key=timed.get) if timed else _choice[key]
    return _current[memo]


def _is_triton(choice) -> bool:
    """Whether a choice is one of this module's Triton configs (a ``Config`` or a ``gemm_wgmma.WgmmaConfig``, both PDL
    kernels; cuBLASLt's ``Algo`` is a tuple too)."""
    return isinstance(choice, tuple) and not isinstance(choice, cublaslt.Algo)


def _in_pdl_chain(choice, key: tuple) -> bool:
    """Whether ``choice`` for ``key`` runs as PDL kernels: a Triton config, or for a gated shape the unfused path
    (silu_mul, then the plain shape's own pick)."""
    return _is_triton(choice) or (choice is None and key[3] is True)


def pdl_breaks(rows: set[int]) -> list[tuple]:
    """The chosen GEMM shapes of these row counts whose pick under the current switches is not a Triton kernel
    although a Triton config was timed for them: what ``triton_only`` would change (empty: nothing)."""
    out = []
    for key in sorted((k for k in _choice if k[0] in rows and k[3] in (True, False)), key=str):
        if not _in_pdl_chain(current(key), key) and any(_is_triton(c) for c in _scores(key)):
            out.append(key)
    return out


def candidates(m: int, gated: bool = False, w: torch.Tensor | None = None) -> dict:
    """choice -> callable(x, w) for every way this engine can run (M, N, K, gated): the unfused path, cuBLAS
    on padded rows, cuBLASLt, the Triton configs for M <= MAX_TRITON_M and, given W on CUDA, the first
    LT_ALGOS kernels of cuBLASLt's heuristic list for W's shape."""
    cands = {None: lambda x, w_: _unfused(x, w_, gated)}
    if not gated:
        for rows in sorted({kernels.round_up(m, 64), kernels.round_up(m, kernels.ROW_PAD)} - {m}):
            cands[rows] = lambda x, w_, rows=rows: _mm(x, w_, rows)
        if hasattr(torch.backends.cuda, "preferred_blas_library"):
            cands[CUBLASLT] = _mm_lt
        if w is not None and w.is_cuda:
            for algo in _lt_heuristics(m, w):
                cands[algo] = lambda x, w_, algo=algo: cublaslt.matmul(x, w_, algo)
    for cfg in _configs(m, gated, tma_available()) if m <= MAX_TRITON_M else ():
        cands[cfg] = lambda x, w_, cfg=cfg: triton_linear(x, w_, cfg, gated)
    if WGMMA and not gated and _wgmma_ok(m, w):
        sms = _num_sms(w)
        cfgs = gemm_wgmma.configs(m) if m <= WGMMA_MAX_ROWS else []
        if gemm_wgmma.STREAM_K and m <= WGMMA_STREAM_K_MAX_ROWS:
            cfgs += gemm_wgmma.stream_k_configs(m, sms)
        for cfg in cfgs:
            cands[cfg] = lambda x, w_, cfg=cfg: gemm_wgmma.wgmma_linear(x, w_, cfg, kernels.pdl_enabled(x))
    return cands


def _num_sms(w: torch.Tensor) -> int:
    return torch.cuda.get_device_properties(w.device).multi_processor_count


def _wgmma_ok(m: int, w: torch.Tensor | None) -> bool:
    """Whether the chooser times the wgmma kernel for x [M, K] W^T: Gluon in this Triton, a bf16 W on a Hopper GPU,
    WGMMA_MIN_ROWS <= M <= WGMMA_MAX_ROWS (WGMMA_STREAM_K_MAX_ROWS with the stream-K kernel on)."""
    top = max(WGMMA_MAX_ROWS, WGMMA_STREAM_K_MAX_ROWS if gemm_wgmma.STREAM_K else 0)
    return WGMMA_MIN_ROWS <= m <= top and wgmma_runs(w)


def wgmma_runs(w: torch.Tensor | None) -> bool:
    """Whether the wgmma kernel can run x W^T: Gluon in this Triton, a bf16 W on a Hopper GPU."""
    if not (w is not None and w.is_cuda and w.dtype == torch.bfloat16 and gemm_wgmma.available()):
        return False
    try:
        return torch.cuda.get_device_capability(w.device)[0] == 9
    except (AttributeError, AssertionError, RuntimeError):  # no CUDA device behind w (a stand-in, no driver)
        return False


def _lt_heuristics(m: int, w: torch.Tensor) -> list[cublaslt.Algo]:
    """cuBLASLt's first LT_ALGOS kernels for x [M, K] W^T, or [] when it cannot say (reported once a shape)."""
    try:
        return cublaslt.heuristics(m, w.shape[0], w.shape[1], w.dtype, LT_ALGOS)
    except Exception as exc:  # no such library / symbol / shape support: the other candidates remain
        print(f"tabletune: no cuBLASLt heuristic kernels for M={m} N={w.shape[0]} K={w.shape[1]} "
              f"({type(exc).__name__}: {exc})")
        return []


def choose(m: int, w: torch.Tensor, gated: bool = False) -> Config | int | str | None:
    """Time every candidate once and keep the fastest of those whose result matches torch's
    (relative error under MAX_REL_ERR, checked on fresh inputs: a config that miscompiles is never chosen)."""
    n, k = w.shape
    key = (m, n, k, gated)
    if key not in _choice:
        if gated:
            choose(m, w, False)
        _choice[key] = _fastest(key, w, 2 * k if gated else k, candidates(m, gated, w), _reference(gated))
    return current(key)


def _reference(gated: bool):
    """torch's x W^T (gated: silu_mul(x) W^T): what every candidate's result is checked against."""
    return lambda x, w: torch.mm(kernels.silu_mul(x, w.dtype) if gated else x, w.t())


def _fastest(key, w: torch.Tensor, width: int, cands: dict, reference):
    """The fastest of ``cands`` (choice -> fn(x, w)) on x [M, width] whose result is within MAX_REL_ERR of
    ``reference(x, w)``, timed over weights rotated through copies bigger than L2, as in the model, alone and/or
    followed by silu_mul (``TIMING``)."""
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
    timings, in_context = {}, {}
    alone, context = _timing_kinds(m)
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
        if alone:
            timings[choice] = _time_us(lambda: fn(x, pick()))
        if context:
            in_context[choice] = _time_us(lambda: kernels.silu_mul(fn(x, pick())))
    if not (timings or in_context):
        raise RuntimeError(f"no GEMM candidate for M={m} N={n} K={k} ({key[3]}) ran correctly on this GPU")
    for store, timed in ((_timings, timings), (_context_timings, in_context)):
        if timed:
            store[key] = timed
    _current.clear()
    scores = _scores(key)
    return min(scores, key=scores.get)


FUSED_KINDS = ("norm", "norm-silu", "resid")  # the fused-norm layers' GEMMs: qkv, gate_up (+ silu), o and down
FUSED_CANDIDATES = 4  # the fastest plain pointer configs of 16 rows that each fused variant is timed with


def choose_fused(m: int, w: torch.Tensor, kind: str) -> "Config | gemm_wgmma.WgmmaConfig":
    """The fastest config for the fused-norm layers' GEMM ``kind`` of x [M, K] W^T, M <= ``fused_max_rows(w)``: the
    variant itself is timed (``norm_linear`` with 1 / rms = 1, ``norm_linear(silu=True)``, ``residual_linear`` on a
    zero residual) over ``fused_configs`` of what ``choose`` timed at this shape (pointer configs of 16 rows, for
    M <= 16) and, with WGMMA_FUSED on a Hopper GPU, ``gemm_wgmma.fused_configs`` (the wgmma kernel's epilogues)."""
    if kind not in FUSED_KINDS:
        raise ValueError(f"choose_fused: kind {kind!r}, not one of {FUSED_KINDS}")
    n, k = w.shape
    key = (m, n, k, kind)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"no fused-norm GEMM config chosen for M={m} N={n} K={k}: run one step before capture")
        choose(m, w)
        timed = _scores((m, n, k, False)) or dict.fromkeys((Config(*t) for t in _skinny(FUSED_ROWS, False)), 0.0)
        eps = 1e-6
        unit = RowNorm(RowSquares(torch.full((squares_rows(m),), k * (1.0 - eps), device=w.device), 1), eps)  # 1/rms = 1
        if kind == "resid":
            def run(c):
                return lambda x, w_: _zero_then(lambda r: residual_linear(x, w_, c, r), x.shape[0], n, x)
        else:
            def run(c):
                return lambda x, w_: norm_linear(x, w_, c, unit, silu=kind == "norm-silu")
        reference = (lambda x, w_: kernels.silu_mul(torch.mm(x, w_.t()))) if kind == "norm-silu" else _reference(False)
        cands = {c: run(c) for c in fused_configs(timed, kind)} if m <= FUSED_ROWS else {}
        if WGMMA_FUSED and wgmma_runs(w):
            cands.update({c: run(c) for c in gemm_wgmma.fused_configs(m, kind == "norm-silu")})
        _choice[key] = _fastest(key, w, k, cands, reference)
    return _choice[key]


def fused_configs(timed: dict, kind: str) -> list[Config]:
    """The configs ``choose_fused`` times for ``kind``: the FUSED_CANDIDATES fastest pointer configs of 16 rows in
    ``timed`` (choice -> us, as ``choose`` timed the plain shape), fastest first; for ``norm-silu`` (two weight
    tiles a stage) each also at half the tile width, keeping those that fit in shared memory."""
    plain = sorted((us, c) for c, us in timed.items()
                   if isinstance(c, Config) and c.block_m == FUSED_ROWS and not (c.tma or c.stream_k))
    cfgs = [c for _, c in plain[:FUSED_CANDIDATES]]
    if kind == "norm-silu":
        cfgs = [c for c in cfgs + [c._replace(block_n=c.block_n // 2) for c in cfgs if c.block_n >= 32]
                if fits_smem(c, weight_tiles=2)]
    return list(dict.fromkeys(cfgs))


_residuals: dict[tuple, torch.Tensor] = {}


def _zero_then(fn, m: int, n: int, like: torch.Tensor) -> torch.Tensor:
    """fn(r) on a residual r of zeros [m, n] (one buffer per shape, zeroed each call: r + x W^T = x W^T to check)."""
    r = _residuals.setdefault((m, n, like.dtype, like.device), torch.empty(m, n, dtype=like.dtype, device=like.device))
    r.zero_()
    fn(r)
    return r


def linear(x2d: torch.Tensor, w: torch.Tensor, gated: bool = False, accumulate: bool = False) -> torch.Tensor:
    """x2d W^T (gated: silu(gate) * up of x2d = [gate | up], then W^T), in x2d's dtype. ``accumulate`` (the caller
    hands the result to ``kernels.add_rms_norm`` and nothing else): with ``atomic_split``, at most ATOMIC_MAX_ROWS
    rows and a Triton pointer choice of at most ATOMIC_MAX_SPLIT splits, the fp32 ``kernels.accumulator`` the splits
    added into instead."""
    m = x2d.shape[0]
    if not (enabled and x2d.is_cuda and m <= MAX_CHOOSE_M):
        return torch.mm(kernels.silu_mul(x2d, w.dtype) if gated else x2d, w.t())
    if torch.cuda.is_current_stream_capturing():
        choice = current((m, w.shape[0], w.shape[1], gated))
    else:
        choice = choose(m, w, gated)
    if accumulate and atomic_split and m <= ATOMIC_MAX_ROWS and _atomic_ok(choice, w):
        return _pointer_gemm(x2d, w, Config(*choice), kernels.accumulator(m, w.shape[0], x2d.device), gated,
                             atomic=True)
    return _run(x2d, w, choice, gated)


def _atomic_ok(choice, w: torch.Tensor) -> bool:
    """Whether a choice can add its splits into an accumulator: a pointer config whose effective split count
    (``_split_k``) is at most ATOMIC_MAX_SPLIT."""
    if not _is_triton(choice) or isinstance(choice, gemm_wgmma.WgmmaConfig):
        return False
    c = Config(*choice)
    return not (c.tma or c.stream_k) and _k_splits(w.shape[1], c.split, c.block_k)[1] <= ATOMIC_MAX_SPLIT
