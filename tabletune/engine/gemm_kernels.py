"""The Triton GEMM kernels of ``gemm`` (the host side, the configs and the chooser live there).

``_gemm_kernel``: split-K over pointer loads, with the optional GATED prologue (silu(gate) * up of an x of width
2K) and the fused-norm layers' epilogues: NORM (each row scaled by its 1 / rms, from per-tile sums of squares; the
norm weight is folded into W), SILU (silu(gate) * up of a [gate | up] W, two accumulators) and RESID (the residual
add in place, and its sums of squares). ``_gemm_tma_kernel``: split-K over Hopper
TMA descriptors. ``_gemm_stream_k_kernel``: P persistent programs sharing all K iterations. Every split-K partial
goes to an fp32 workspace and the program that draws a tile's last ticket adds them in split order
(``_store_or_fix_up``): deterministic, no zero-fill launch, no fp32 atomics.
"""

import triton
import triton.language as tl


@triton.jit
def _prefetch_l2(ptrs):
    """PTX ``prefetch.global.L2`` for every address of ``ptrs`` (no data comes back)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, WS_STRIDE, ss_in_ptr, ss_out_ptr, NT_IN,
                 eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                 GATED: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_K: tl.constexpr, NORM: tl.constexpr = False,
                 SILU: tl.constexpr = False, RESID: tl.constexpr = False, NT_P: tl.constexpr = 1,
                 ATOMIC: tl.constexpr = False):
    """The split-K GEMM. The fused-norm layers' variants (one row block) change only the epilogue, never the K loop:
    ``NORM``: x is the residual stream, W already carries the RMSNorm's weight (``gemm.fold_norm``) and the tile is
    scaled by each row's 1 / rms, from the NT_IN per-tile partial sums of squares at ``ss_in_ptr``. ``SILU``: W is
    [gate | up] (2N rows) and y = silu(x W_gate^T) * (x W_up^T) [M, N], two accumulators a program. ``RESID``: y is
    the residual stream, updated in place to y + x W^T, with this GEMM's per-tile sums of squares written to
    ``ss_out_ptr`` (``_resid_out``). ``ATOMIC`` (plain or GATED, at most two splits): y is an fp32 accumulator of
    zeros and each split adds its partial into it (``_store_or_fix_up``)."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    w_rows = tl.minimum(cols, N - 1).to(tl.int64)
    if USE_PDL:
        if PREFETCH_K > 0:  # weights do not depend on the previous kernel: pull the first ones into L2 while it ends
            pk = tl.minimum(k_lo + tl.arange(0, PREFETCH_K // 64) * 64, K - 1)  # one address per 128-byte line
            _prefetch_l2(w_ptr + w_rows[:, None] * K + pk[None, :])
            if SILU:
                _prefetch_l2(w_ptr + (w_rows + N)[:, None] * K + pk[None, :])
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # the epilogue's own reads (1 / rms, the residual tile) issued before the K loop: their latency hides behind it
    inv = _inv_rms(ss_in_ptr, NT_IN, K, eps, BLOCK_M, NT_P) if NORM else None
    r_old = tl.load(y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :],
                    mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0) if RESID else None
    kk = tl.arange(0, BLOCK_K)
    x_stride = 2 * K if GATED else K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32) if SILU else acc
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k0 + kk) < k_hi
        x_mask = (rows[:, None] < M) & k_ok[None, :]
        x_off = rows.to(tl.int64)[:, None] * x_stride + (k0 + kk)[None, :]
        x = tl.load(x_ptr + x_off, mask=x_mask, other=0.0)
        if GATED:
            g = x.to(tl.float32)
            u = tl.load(x_ptr + x_off + K, mask=x_mask, other=0.0).to(tl.float32)
            x = (g / (1.0 + tl.exp(-g)) * u).to(w_ptr.dtype.element_ty)
        w_mask = (cols[:, None] < N) & k_ok[None, :]
        w_off = cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :]
        acc += tl.dot(x, tl.trans(tl.load(w_ptr + w_off, mask=w_mask, other=0.0)))
        if SILU:
            acc_u += tl.dot(x, tl.trans(tl.load(w_ptr + w_off + N * K, mask=w_mask, other=0.0)))
    _store_or_fix_up(acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M, BLOCK_N, SPLIT, RESID,
                     ss_out_ptr, acc_u, NORM, SILU, inv, r_old, ATOMIC)


@triton.jit
def _resid_out(total, r_old, r_ptr, ss_ptr, rows, ok, out_off, BLOCK_M: tl.constexpr):
    """The residual epilogue: r = bf16(r + bf16(x W^T)) in place (r_old: the tile read before the K loop), and this
    column tile's sum of r^2 per row into ss[pid_n, row] for the next GEMM's norm (``_inv_rms``); the same roundings
    as ``kernels.add_rms_norm``."""
    y = total.to(r_ptr.dtype.element_ty).to(tl.float32)
    r = (r_old.to(tl.float32) + y).to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + out_off, r, mask=ok)
    rf = tl.where(ok, r.to(tl.float32), 0.0)
    tl.store(ss_ptr + tl.program_id(1) * BLOCK_M + rows, tl.sum(rf * rf, 1))


@triton.jit
def _epilogue(total, total_u, y_ptr, ss_out_ptr, rows, ok, out_off, inv, r_old, BLOCK_M: tl.constexpr,
              RESID: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr):
    """A finished fp32 tile (all splits added) to y: the row scale ``inv`` (NORM), silu(gate) * up (SILU: each
    product rounded to y's dtype first, as ``kernels.silu_mul`` reads them), then the residual add (RESID) or a
    store."""
    if NORM:
        total = total * inv[:, None]
        if SILU:
            total_u = total_u * inv[:, None]
    if SILU:
        g = total.to(y_ptr.dtype.element_ty).to(tl.float32)
        total = g / (1.0 + tl.exp(-g)) * total_u.to(y_ptr.dtype.element_ty).to(tl.float32)
    if RESID:
        _resid_out(total, r_old, y_ptr, ss_out_ptr, rows, ok, out_off, BLOCK_M)
    else:
        tl.store(y_ptr + out_off, total.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _store_or_fix_up(acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, RESID: tl.constexpr = False, ss_ptr=None,
                     acc_u=None, NORM: tl.constexpr = False, SILU: tl.constexpr = False, inv=None, r_old=None,
                     ATOMIC: tl.constexpr = False):
    """Write the tile (one split), or store this split's partial and let the last split add them in order, then
    ``_epilogue`` (the fused-norm variants; ``SILU``: a second accumulator, its partials N columns further on in a
    workspace of 2N columns). ``ATOMIC``: add the partial into y, an fp32 accumulator that holds zeros, and be done
    (no workspace, ticket or fix-up). With one or two splits the sum is the fix-up's to the bit: 0 + a = a, and
    a + b = b + a in either arrival order."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ok = (rows[:, None] < M) & (cols[None, :] < N)
    out_off = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if ATOMIC:
        tl.atomic_add(y_ptr + out_off, acc, mask=ok, sem="relaxed")
    elif SPLIT == 1:
        _epilogue(acc, acc_u, y_ptr, ss_ptr, rows, ok, out_off, inv, r_old, BLOCK_M, RESID, NORM, SILU)
    else:
        tile = pid_m * tl.num_programs(1) + pid_n
        ws_off = rows.to(tl.int64)[:, None] * (2 * N if SILU else N) + cols[None, :]
        tl.store(ws_ptr + pid_s.to(tl.int64) * WS_STRIDE + ws_off, acc, mask=ok)
        if SILU:
            tl.store(ws_ptr + pid_s.to(tl.int64) * WS_STRIDE + ws_off + N, acc_u, mask=ok)
        tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if ticket == SPLIT - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            total_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32) if SILU else total
            for s in tl.static_range(SPLIT):  # unrolled: the partial loads are issued together
                total += tl.load(ws_ptr + s * WS_STRIDE + ws_off, mask=ok, other=0.0, cache_modifier=".cg")
                if SILU:
                    total_u += tl.load(ws_ptr + s * WS_STRIDE + ws_off + N, mask=ok, other=0.0, cache_modifier=".cg")
            _epilogue(total, total_u, y_ptr, ss_ptr, rows, ok, out_off, inv, r_old, BLOCK_M, RESID, NORM, SILU)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def _inv_rms(ss_ptr, NT, K, eps, BLOCK_M: tl.constexpr, NT_P: tl.constexpr):
    """1 / rms of each row from the NT per-tile partial sums of squares ss[t, row] that the previous GEMM's
    residual epilogue wrote (``_resid_out``), summed in chunks of 32 tiles (a fixed order)."""
    CHUNK: tl.constexpr = 32 if NT_P > 32 else NT_P
    ss = tl.zeros([BLOCK_M], tl.float32)
    for t0 in tl.static_range(0, NT_P, CHUNK):
        t = t0 + tl.arange(0, CHUNK)
        ss += tl.sum(tl.load(ss_ptr + t[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :], mask=t[:, None] < NT,
                             other=0.0), 0)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _gemm_tma_kernel(x_desc, w_desc, y_ptr, ws_ptr, cnt_ptr, M, N, K, K_PER_SPLIT, WS_STRIDE,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                     USE_PDL: tl.constexpr, SWAP: tl.constexpr = False):
    """The split-K GEMM with x and W tiles fetched by the tensor-memory accelerator (Hopper TMA, through host
    tensor descriptors): rows past M and columns past K come back as zeros, so the K loop has no masks and
    the software pipeline keeps ``num_stages`` bulk copies in flight. ``SWAP``: the tile is computed as
    W x^T ([BLOCK_N, BLOCK_M]: the weight rows on the MMA's M side, the tokens on its N side, as cuBLAS's decode
    kernels do) and transposed for the store."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_lo = pid_s * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N, BLOCK_M] if SWAP else [BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        x = x_desc.load([pid_m * BLOCK_M, k0])
        w = w_desc.load([pid_n * BLOCK_N, k0])
        if SWAP:
            acc = tl.dot(w, x.T, acc)
        else:
            acc = tl.dot(x, w.T, acc)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _store_or_fix_up(tl.trans(acc) if SWAP else acc, y_ptr, ws_ptr, cnt_ptr, rows, cols, M, N, WS_STRIDE, BLOCK_M,
                     BLOCK_N, SPLIT)


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
