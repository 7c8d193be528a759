"""Triton kernels for the decode hot path (GPU; also run by Triton's interpreter in tests).

* ``qk_rope_cache``: one program per token splits its qkv row, applies Qwen3's
  per-head RMSNorm to q and k, RoPE, and writes K and V into the slot cache. RoPE
  reads cos / sin from a table made once per cache length (``rope_table``) instead of
  evaluating them per element, which every attention program would repeat once fused.
* ``rope_attention``: the same inside the attention launch (decode steps).
* ``attention``: split-KV decoding attention (flash-decoding style). One program
  per (sequence, KV head, split) loads each K/V tile once for all the query heads
  that share it: the G = H/Hkv heads times the q query tokens are the rows of one
  tile, so KV is read once per step. Row r is token r // G of head kvh*G + r % G
  and sees keys 0 .. start_pos + r // G (causal, lower-right aligned). The split
  that finishes last for a (sequence, KV head) merges the partials in split order:
  o = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s (no second launch). The split count, tile, warps and
  stages of each launch shape are timed at start-up (``choose_attention``) from b * Hkv >= SMs on.
* ``silu_mul`` and ``add_rms_norm``: the element-wise fusions of a layer.

Optional and off (measured no gain on the H200, engine 0.7.dev4): L2 hints of the KV in the attention launches
(``attn_prefetch_wait``: a program's first cached tiles before its PDL wait; ``attn_prefetch_ahead``: the tile N
ahead in its loop). ``attn_force`` runs every launch with one tile: how ``runner.SpecEngine`` times the candidates
of ``step_attn_candidates`` inside the captured step.

"Last program merges": a program stores its partial, then takes a ticket from a
counter (atomic, acquire-release); the one that draws ticket S-1 reads all S
partials and resets the counter to 0, so counters are zero between launches.

``prefetch_l2``: a side-stream kernel that pulls a weight matrix into L2 while the
latency-bound kernels of small batches (RoPE, attention) leave the memory bus idle,
so that the GEMM after them reads it from L2. Attention loads K/V with
``evict_first`` so that the prefetched lines survive its reads.

Programmatic dependent launch (PDL, Hopper): with ``TABLETUNE_PDL=1`` on CUDA every
kernel here is launched so that it may start while its predecessor drains; its
first statement waits for the predecessor's results (``gdc_wait``), then lets its
own successor launch. This hides the launch gap and tail of ~300 small kernels.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tabletune.engine import ops as torch_ops
from tabletune.engine.gemm_kernels import _prefetch_l2
from tabletune.engine.model import PREFETCH_MODES

MAX_TICKETS = 1 << 16
_counters: dict[tuple[torch.device, int], torch.Tensor] = {}
lane = 0  # which ticket buffer launches use: the runner sets 1 around work on its second stream


ROW_PAD = 128  # row capacity of GEMM inputs made here: M rounded up to this (see ``empty_rows``)


def empty_rows(m: int, n: int, dtype, device) -> torch.Tensor:
    """An uninitialised [m, n] tensor whose storage holds m rounded up to ``ROW_PAD`` rows.

    The kernels that produce GEMM inputs (norm, attention, silu*mul) allocate this way, so that
    ``gemm.linear`` can run cuBLAS on the padded row count (``gemm.padded_rows``) without a copy
    where cuBLAS is faster there than at M itself; the extra rows hold garbage, and rows of a
    product do not mix, so the first m output rows are unaffected.
    """
    return torch.empty(round_up(m, ROW_PAD), n, dtype=dtype, device=device)[:m]


def round_up(m: int, multiple: int) -> int:
    return -(-m // multiple) * multiple


def counters(device: torch.device) -> torch.Tensor:
    """Tickets for "last program merges" kernels; zero between launches (the last program resets its own).

    One buffer per ``lane``: kernels that may run at the same time on two streams must not share tickets.
    """
    key = (device, lane)
    if key not in _counters:
        _counters[key] = torch.zeros(MAX_TICKETS, dtype=torch.int32, device=device)
    return _counters[key]


_pdl_ok: dict[torch.device, bool] = {}


def pdl_enabled(x: torch.Tensor) -> bool:
    """PDL on: CUDA, compute capability >= 9, TABLETUNE_PDL not "0", and a probe launch worked."""
    if not x.is_cuda or os.environ.get("TABLETUNE_PDL", "1") == "0":
        return False
    if x.device not in _pdl_ok:
        ok = torch.cuda.get_device_capability(x.device)[0] >= 9
        if ok:
            try:
                a = torch.ones(1, 2, device=x.device)
                b = torch.empty(1, 1, device=x.device)
                _silu_mul_kernel[(1, 1)](a, b, 1, BLOCK=16, USE_PDL=True, launch_pdl=True)
                torch.cuda.synchronize(x.device)
            except Exception as exc:  # this Triton cannot launch with PDL: run without it
                print(f"tabletune: PDL off ({type(exc).__name__}: {exc})")
                ok = False
        _pdl_ok[x.device] = ok
    return _pdl_ok[x.device]


def pdl_kwargs(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def _pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _qk_rope_cache_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, qn_ptr, kn_ptr,
                          cos_ptr, sin_ptr, QLEN, stride_slot, stride_head, eps,
                          H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HP: tl.constexpr,
                          HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_wait(USE_PDL)
    tok = tl.program_id(0)
    b = tok // QLEN
    pos = tl.load(start_ptr + b) + tok % QLEN
    slot = tl.load(slots_ptr + b).to(tl.int64)
    heads = tl.arange(0, HP)[:, None]  # [HP, 1]: q heads, then k heads, then v heads
    offs = tl.arange(0, D)[None, :]  # [1, D]
    rot = (offs + D // 2) % D
    ok = heads < H + 2 * HKV
    base = qkv_ptr + tok.to(tl.int64) * (H + 2 * HKV) * D + heads * D
    x = tl.load(base + offs, mask=ok, other=0.0).to(tl.float32)
    xr = tl.load(base + rot, mask=ok, other=0.0).to(tl.float32)
    is_q = heads < H
    is_k = (heads >= H) & (heads < H + HKV)
    if HAS_NORM:
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 1)[:, None] / D + eps)
        w = tl.where(is_q, tl.load(qn_ptr + offs).to(tl.float32), tl.load(kn_ptr + offs).to(tl.float32))
        wr = tl.where(is_q, tl.load(qn_ptr + rot).to(tl.float32), tl.load(kn_ptr + rot).to(tl.float32))
        xn = x * inv * w
        xr = xr * inv * wr
    else:
        xn = x
    sign = tl.where(offs < D // 2, -1.0, 1.0)
    y = xn * tl.load(cos_ptr + pos * D + offs) + sign * xr * tl.load(sin_ptr + pos * D + offs)
    tl.store(q_out_ptr + (tok.to(tl.int64) * H + heads) * D + offs, y.to(q_out_ptr.dtype.element_ty),
             mask=is_q)
    cache_off = slot * stride_slot + pos.to(tl.int64) * D + offs
    kh = tl.where(is_k, heads - H, 0)
    tl.store(k_cache_ptr + cache_off + kh * stride_head, y.to(k_cache_ptr.dtype.element_ty), mask=is_k)
    is_v = (heads >= H + HKV) & ok
    vh = tl.where(is_v, heads - H - HKV, 0)
    tl.store(v_cache_ptr + cache_off + vh * stride_head, x.to(v_cache_ptr.dtype.element_ty), mask=is_v)


_rope_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_table(device: torch.device, head_dim: int, theta: float, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim] fp32 for positions 0 .. length-1 (``ops.rope_cos_sin``), made once per key and
    kept: graphs captured with a table read it at replay. Made outside graph capture (the warm-up step does)."""
    key = (device, head_dim, float(theta), length)
    if key not in _rope_tables:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the RoPE table would be made inside CUDA graph capture: run one step eagerly first")
        cos, sin = torch_ops.rope_cos_sin(torch.arange(length, device=device), head_dim, theta)
        _rope_tables[key] = (cos.contiguous(), sin.contiguous())
    return _rope_tables[key]


def qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads,
                        head_dim, theta, eps):
    b, qlen, _ = qkv.shape
    q = torch.empty(b, qlen, num_heads, head_dim, dtype=k_cache.dtype, device=qkv.device)
    has_norm = q_norm_w is not None
    cos, sin = rope_table(qkv.device, head_dim, theta, k_cache.shape[2])
    pdl = pdl_enabled(qkv)
    _qk_rope_cache_kernel[(b * qlen,)](
        qkv, q, k_cache, v_cache, start_pos, slots, q_norm_w if has_norm else qkv, k_norm_w if has_norm else qkv,
        cos, sin, qlen, k_cache.stride(0), k_cache.stride(1), eps,
        H=num_heads, HKV=num_kv_heads, D=head_dim, HP=triton.next_power_of_2(num_heads + 2 * num_kv_heads),
        HAS_NORM=has_norm, USE_PDL=pdl, num_warps=4, **pdl_kwargs(pdl))
    return q


@triton.jit
def _attn_program(start_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, QLEN, stride_slot, stride_head,
                  NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, HS: tl.constexpr):
    """This program's (sequence, KV head, split) and its key range lo .. hi-1 of the sequence's start + q keys
    (splits of whole BLOCK_N tiles), with the sequence's K and V base pointers for that KV head; grid axis 1 counts
    (KV head, head group) pairs, HS head groups a KV head, and ``hg`` is this program's group."""
    b = tl.program_id(0)
    kvh = tl.program_id(1) // HS
    hg = tl.program_id(1) % HS
    sp = tl.program_id(2)
    start = tl.load(start_ptr + b)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    kv_len = start + QLEN
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    kbase = k_cache_ptr + slot * stride_slot + kvh * stride_head
    vbase = v_cache_ptr + slot * stride_slot + kvh * stride_head
    return b, kvh, hg, sp, start, lo, hi, kbase, vbase


@triton.jit
def _prefetch_kv(kbase, vbase, n0, end, TILES: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 LINE: tl.constexpr):
    """Hint keys n0 .. n0 + TILES * BLOCK_N - 1 of this (sequence, KV head), K and V, into L2: one
    ``prefetch.global.L2`` per ``LINE`` elements (128 bytes); keys past ``end`` - 1 are clamped to it, so every
    address is inside the sequence's cache rows (no data comes back, the results are unchanged)."""
    keys = tl.minimum(n0 + tl.arange(0, TILES * BLOCK_N), end - 1)
    off = keys.to(tl.int64)[:, None] * D + (tl.arange(0, D // LINE) * LINE)[None, :]
    _prefetch_l2(kbase + off)
    _prefetch_l2(vbase + off)


@triton.jit
def _attn_tiles(q, kbase, vbase, lo, hi, limit, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, PF_AHEAD: tl.constexpr = 0, LINE: tl.constexpr = 64):
    """Online softmax of the rows of ``q`` over keys lo .. hi-1 (row r sees keys <= limit[r]): (m, l, acc).
    ``PF_AHEAD`` > 0: each iteration also hints the K and V tile that many tiles ahead into L2."""
    d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = scale * 1.4426950408889634
    for n0 in range(lo, hi, BLOCK_N):
        if PF_AHEAD > 0:
            _prefetch_kv(kbase, vbase, n0 + PF_AHEAD * BLOCK_N, hi, 1, D, BLOCK_N, LINE)
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        kv_off = cols.to(tl.int64)[:, None] * D + d[None, :]
        k = tl.load(kbase + kv_off, mask=col_ok[:, None], other=0.0, eviction_policy="evict_first")
        v = tl.load(vbase + kv_off, mask=col_ok[:, None], other=0.0, eviction_policy="evict_first")
        m_i, l_i, acc = _online_softmax_step(q, k, v, (cols[None, :] <= limit[:, None]) & col_ok[None, :], qk_scale,
                                             m_i, l_i, acc)
    return m_i, l_i, acc


@triton.jit
def _online_softmax_step(q, k, v, visible, qk_scale, m_i, l_i, acc):
    """One K / V tile folded into the online softmax: scores q k^T (scaled to log2 units) where ``visible``
    [rows, keys], else -inf; the running row max m, sum l and output acc, updated."""
    s = tl.where(visible, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _attn_store(out_ptr, o_part, m_part, l_part, cnt_ptr, m_i, l_i, acc, b, sp, tok, heads, row_ok, QLEN,
                H: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Write the output rows (token ``tok``, query head ``heads`` each; one split), or store this split's partial
    and let the last split of the (sequence, grid axis 1) pair merge them."""
    d = tl.arange(0, D)
    rows = tl.arange(0, BLOCK_M)
    o_off = ((b * QLEN + tok).to(tl.int64) * H + heads) * D
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + o_off[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        pair = b * tl.num_programs(1) + tl.program_id(1)
        part = (pair * NUM_SPLITS + sp).to(tl.int64) * BLOCK_M
        tl.store(o_part + (part + rows)[:, None] * D + d[None, :], acc)
        tl.store(m_part + part + rows, m_i)
        tl.store(l_part + part + rows, l_i)
        tl.debug_barrier()  # every thread's partial is stored before the ticket (release below)
        ticket = tl.atomic_add(cnt_ptr + pair, 1, sem="acq_rel")
        if ticket == NUM_SPLITS - 1:
            _attn_merge(out_ptr, o_part, m_part, l_part, pair, o_off, row_ok, D, NUM_SPLITS, BLOCK_M)
            tl.atomic_xchg(cnt_ptr + pair, 0)


@triton.jit
def _prefetch_cached(kbase, vbase, lo, hi, start, TILES: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                     LINE: tl.constexpr):
    """Before the PDL wait: hint the first ``TILES`` tiles of this program's keys lo .. hi-1 into L2, only keys
    before ``start`` (written by earlier steps: with PDL every launch before the one this kernel waits for has
    finished, and that one, the qkv GEMM or the RoPE launch, writes no key before ``start``). Nothing when
    ``TILES`` is 0 or the program holds no cached key."""
    if TILES > 0:
        end = tl.minimum(hi, start)
        if end > lo:
            _prefetch_kv(kbase, vbase, lo, end, TILES, D, BLOCK_N, LINE)


@triton.jit
def _attn_kernel(q_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, out_ptr, o_part, m_part, l_part, cnt_ptr,
                 QLEN, scale, stride_slot, stride_head,
                 H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr, PF_WAIT: tl.constexpr = 0,
                 PF_AHEAD: tl.constexpr = 0, LINE: tl.constexpr = 64, GS: tl.constexpr = 0):
    """Grid (B, Hkv * G / GS, splits): a program takes GS of its KV head's G query heads (GS = 0: all G)."""
    HG: tl.constexpr = G if GS == 0 else GS
    b, kvh, hg, sp, start, lo, hi, kbase, vbase = _attn_program(start_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, QLEN,
                                                                stride_slot, stride_head, NUM_SPLITS, BLOCK_N, G // HG)
    _prefetch_cached(kbase, vbase, lo, hi, start, PF_WAIT, D, BLOCK_N, LINE)
    _pdl_wait(USE_PDL)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < HG * QLEN
    tok = rows // HG
    heads = kvh * G + hg * HG + rows % HG
    d = tl.arange(0, D)
    q_off = ((b * QLEN + tok).to(tl.int64) * H + heads) * D
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    limit = start + tok
    m_i, l_i, acc = _attn_tiles(q, kbase, vbase, lo, hi, limit, scale, D, BLOCK_M, BLOCK_N, PF_AHEAD, LINE)
    _attn_store(out_ptr, o_part, m_part, l_part, cnt_ptr, m_i, l_i, acc, b, sp, tok, heads, row_ok, QLEN, H, D,
                NUM_SPLITS, BLOCK_M)


@triton.jit
def _rope_rows(qkv_ptr, tok_row, head, pos, norm_ptr, cos_ptr, sin_ptr, ok, eps, H: tl.constexpr,
               HKV: tl.constexpr, D: tl.constexpr, HAS_NORM: tl.constexpr):
    """Rows of the qkv buffer (token row ``tok_row``, head ``head`` counted over q, k, v heads) with the head's
    RMSNorm (if any) and RoPE at ``pos`` (from the cos / sin table) applied, fp32 [rows, D]; the same math as
    ``_qk_rope_cache_kernel``."""
    offs = tl.arange(0, D)[None, :]
    rot = (offs + D // 2) % D
    base = qkv_ptr + tok_row.to(tl.int64)[:, None] * (H + 2 * HKV) * D + head[:, None] * D
    x = tl.load(base + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    xr = tl.load(base + rot, mask=ok[:, None], other=0.0).to(tl.float32)
    if HAS_NORM:
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 1)[:, None] / D + eps)
        x = x * inv * tl.load(norm_ptr + offs).to(tl.float32)
        xr = xr * inv * tl.load(norm_ptr + rot).to(tl.float32)
    sign = tl.where(offs < D // 2, -1.0, 1.0)
    tab = pos.to(tl.int64)[:, None] * D + offs
    cos = tl.load(cos_ptr + tab, mask=ok[:, None], other=0.0)
    sin = tl.load(sin_ptr + tab, mask=ok[:, None], other=0.0)
    return x * cos + sign * xr * sin


@triton.jit
def _rope_attn_kernel(qkv_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr,
                      out_ptr, o_part, m_part, l_part, cnt_ptr, QLEN, scale, stride_slot, stride_head, eps,
                      H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                      NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QP: tl.constexpr,
                      HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr, PF_WAIT: tl.constexpr = 0,
                      PF_AHEAD: tl.constexpr = 0, LINE: tl.constexpr = 64, GS: tl.constexpr = 0):
    """``_qk_rope_cache_kernel`` and ``_attn_kernel`` in one launch. A program of (sequence, KV head, split)
    applies qk-norm and RoPE to its G * q query rows itself; a program whose key range reaches the new
    positions (start .. start + q - 1) first writes the q new keys (normed, rotated) and values of its KV head
    into the cache, then waits at a barrier so that its own loads see them. Two programs may write the same new
    key (a split boundary inside the new positions, or the head groups of one KV head): with the same value.
    GS as in ``_attn_kernel``."""
    HG: tl.constexpr = G if GS == 0 else GS
    b, kvh, hg, sp, start, lo, hi, kbase, vbase = _attn_program(start_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, QLEN,
                                                                stride_slot, stride_head, NUM_SPLITS, BLOCK_N, G // HG)
    _prefetch_cached(kbase, vbase, lo, hi, start, PF_WAIT, D, BLOCK_N, LINE)
    _pdl_wait(USE_PDL)
    d = tl.arange(0, D)
    if hi > start:
        t = tl.arange(0, QP)
        t_ok = t < QLEN
        tok_row = b * QLEN + t
        k_new = _rope_rows(qkv_ptr, tok_row, H + kvh + t * 0, start + t, kn_ptr, cos_ptr, sin_ptr, t_ok, eps, H,
                           HKV, D, HAS_NORM)
        v_src = qkv_ptr + tok_row.to(tl.int64)[:, None] * (H + 2 * HKV) * D + (H + HKV + kvh) * D + d[None, :]
        v_new = tl.load(v_src, mask=t_ok[:, None], other=0.0)
        new_off = (start + t).to(tl.int64)[:, None] * D + d[None, :]
        tl.store(kbase + new_off, k_new.to(k_cache_ptr.dtype.element_ty), mask=t_ok[:, None])
        tl.store(vbase + new_off, v_new.to(v_cache_ptr.dtype.element_ty), mask=t_ok[:, None])
        tl.debug_barrier()  # the new keys are stored before any thread of this program loads them
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < HG * QLEN
    tok = tl.where(row_ok, rows // HG, 0)
    heads = kvh * G + hg * HG + rows % HG
    q = _rope_rows(qkv_ptr, b * QLEN + tok, heads, start + tok, qn_ptr, cos_ptr, sin_ptr, row_ok, eps,
                   H, HKV, D, HAS_NORM).to(k_cache_ptr.dtype.element_ty)
    limit = start + tok
    m_i, l_i, acc = _attn_tiles(q, kbase, vbase, lo, hi, limit, scale, D, BLOCK_M, BLOCK_N, PF_AHEAD, LINE)
    _attn_store(out_ptr, o_part, m_part, l_part, cnt_ptr, m_i, l_i, acc, b, sp, tok, heads, row_ok, QLEN, H, D,
                NUM_SPLITS, BLOCK_M)


@triton.jit
def _attn_merge(out_ptr, o_part, m_part, l_part, pair, o_off, row_ok, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """o = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s over the splits of one (sequence, KV head), in split order."""
    rows = tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    m_tot = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_tot = tl.zeros([BLOCK_M], tl.float32)
    o_tot = tl.zeros([BLOCK_M, D], tl.float32)
    for s in tl.static_range(NUM_SPLITS):  # unrolled: the partial loads are issued together
        part = (pair * NUM_SPLITS + s).to(tl.int64) * BLOCK_M
        m_s = tl.load(m_part + part + rows, cache_modifier=".cg")
        l_s = tl.load(l_part + part + rows, cache_modifier=".cg")
        o_s = tl.load(o_part + (part + rows)[:, None] * D + d[None, :], cache_modifier=".cg")
        m_new = tl.maximum(m_tot, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m_tot - m_safe)
        c = tl.exp2(m_s - m_safe)
        o_tot = o_tot * a[:, None] + o_s * c[:, None]
        l_tot = l_tot * a + l_s * c
        m_tot = m_new
    out = o_tot / tl.where(l_tot == 0.0, 1.0, l_tot)[:, None]
    tl.store(out_ptr + o_off[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def num_splits_for(batch_size: int, num_kv_heads: int, num_sms: int = 132) -> int:
    """Splits of the keys so that batch * kv_heads * splits covers the SMs once (1 .. 8).

    Measured on the H200 (engine_roofline --diagnose): one split is fastest once batch * kv_heads >= 256
    (the merge costs more than the extra programs bring), 8 at b = 1, 2-5 at b = 8.
    """
    return max(1, min(8, -(-num_sms // (batch_size * num_kv_heads))))


class AttnConfig(NamedTuple):
    """An attention launch's config: key splits per (sequence, KV head), keys a tile, warps, pipeline stages."""
    splits: int
    block_n: int = 64
    warps: int = 4
    stages: int = 3


def default_attn_config(batch_size: int, num_kv_heads: int) -> AttnConfig:
    """The config every attention launch used up to engine 0.7.dev2, and still uses off CUDA (the interpreter) and
    below one (sequence, KV head) pair an SM: ``num_splits_for``, 64-key tiles, 4 warps, 3 stages."""
    return AttnConfig(num_splits_for(batch_size, num_kv_heads))


def heads_per_program(g: int, qlen: int, max_rows: int = 0) -> int:
    """Query heads of a KV head's group of G that one attention program takes: all G (``max_rows`` 0, or G * q
    rows within it), else the largest divisor of G whose rows (heads x q tokens) fit ``max_rows``, at least 1."""
    if not max_rows or g * qlen <= max_rows:
        return g
    return max([gs for gs in range(1, g + 1) if g % gs == 0 and gs * qlen <= max_rows], default=1)


def _attn_setup(b: int, qlen: int, h: int, hkv: int, d: int, dtype, device, splits: int, gs: int):
    """(G, BLOCK_M, split partials (o, m, l), output [B, q, H, D]) of an attention launch whose programs take
    ``gs`` query heads each."""
    g = h // hkv
    block_m = max(16, triton.next_power_of_2(gs * qlen))
    pairs = b * hkv * (g // gs)
    assert pairs <= MAX_TICKETS
    n_part = pairs * splits * block_m if splits > 1 else 1
    m_part = torch.empty(n_part, dtype=torch.float32, device=device)
    parts = (torch.empty(n_part, d, dtype=torch.float32, device=device), m_part, torch.empty_like(m_part))
    out = empty_rows(b * qlen, h * d, dtype, device).view(b, qlen, h, d)
    return g, block_m, parts, out


ATTN_TILES = ((64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 8, 3))  # (keys a tile, warps, stages) the chooser times
ATTN_ROTATE_BYTES = 192 << 20  # scratch KV the chooser rotates through (a step reads a layer's KV from HBM, not L2)

# Query rows an attention program takes at most (0: every launch as up to engine 0.7.dev5, one program per
# (sequence, KV head, split) for all G x q rows). 16: where G x q > 16 (q = 5-8 tokens for G = 4) the group's heads
# are dealt to G / ``heads_per_program`` programs of at most 16 rows, each reading the same keys (H200: at q = 5 the
# 20 rows of a program took a 32-row block and RoPE + attention went from 0.432 to 0.524 ms a step at b = 4).
attn_max_rows = 0
# With attn_max_rows: the key splits of such a launch divided by its head groups (False: kept), so that it runs
# about as many programs as without them.
attn_rows_halve_splits = False
attn_chooser = True  # False: every launch runs ``default_attn_config`` (engine_roofline.py --attn-compare)
# L2 hints of the KV (CUDA only; tiles of K and V, each 1, 2, 4 or 8; 0: off): ``attn_prefetch_wait`` tiles of each
# program's cached keys before its PDL wait, while the launch before it drains; ``attn_prefetch_ahead``: in the
# loop, the tile that many tiles ahead (engine_roofline.py --attn-prefetch-compare)
attn_prefetch_wait = 0
attn_prefetch_ahead = 0
# (block_n, warps, stages, splits or None for ``wave_splits``): every launch without its own ``cfg`` / ``num_splits``
# takes this tile, on CUDA too (None: off; engine_roofline.py --attn-tile-compare times the step with each)
attn_force: tuple | None = None
# (kind, b, q, H, Hkv, D, cache length, dtype, device) -> the config ``choose_attention`` timed fastest
_attn_choice: dict[tuple, AttnConfig] = {}


def wave_splits(batch_size: int, num_kv_heads: int, num_sms: int = 132) -> int:
    """Splits so that batch * kv_heads * splits fills at most one wave of SMs (1 .. 8): ``num_splits_for`` rounded
    down instead of up. Measured on the H200 (``engine_attention_configs.py``): at b = 4, 8, 16 (5 -> 4, 3 -> 2,
    2 -> 1 splits) 1-22% faster, the same at b = 1, 2 and from b = 32 on (one split either way)."""
    return max(1, min(8, num_sms // (batch_size * num_kv_heads)))


def attn_candidates(batch_size: int, num_kv_heads: int, num_sms: int) -> list[AttnConfig]:
    """What ``choose_attention`` times: ``wave_splits`` with each of ATTN_TILES, then ``default_attn_config``
    (engine 0.7.dev2's)."""
    s = wave_splits(batch_size, num_kv_heads, num_sms)
    cands = [AttnConfig(s, *t) for t in ATTN_TILES] + [default_attn_config(batch_size, num_kv_heads)]
    return list(dict.fromkeys(cands))


STEP_TILES = ((128, 8, 3), (64, 4, 4))  # tiles the in-step choice times at ``wave_splits`` beside the start-up choice
STEP_CHOICE_WAVES = 4  # it runs for buckets of fewer (sequence, KV head) pairs than this many times the SM count


def step_attn_candidates(batch_size: int, num_kv_heads: int, num_sms: int) -> list[tuple | None]:
    """What ``runner.SpecEngine`` times inside the captured step of a bucket of fewer than STEP_CHOICE_WAVES x SMs
    (sequence, KV head) pairs (b <= 64 for 8 KV heads on 132 SMs; below one pair an SM timing launches alone
    misled, and up to b = 64 the chooser's configs differed from the default): None (every launch as
    ``_attn_config`` gives it: the default, or the start-up chooser's pick), then each of STEP_TILES at
    ``wave_splits`` as an ``attn_force`` value. Empty for larger buckets (there the configs were within 1%)."""
    if batch_size * num_kv_heads >= STEP_CHOICE_WAVES * num_sms:
        return []
    s = wave_splits(batch_size, num_kv_heads, num_sms)
    return [None] + [(*t, s) for t in STEP_TILES if AttnConfig(s, *t) != default_attn_config(batch_size, num_kv_heads)]


def choose_attention(kind: str, b: int, qlen: int, h: int, hkv: int, d: int, length: int, dtype,
                     device: torch.device) -> AttnConfig:
    """The fastest of ``attn_candidates`` for an ``attention`` (kind "attn") or ``rope_attention`` ("rope") launch
    of this shape, timed once (``gemm._time_us``) on scratch caches of ``length`` positions with every sequence at
    the longest context they hold, rotated through ATTN_ROTATE_BYTES; a candidate whose output is off the PyTorch
    ops' (``ops.attention`` / ``ops.rope_attention``) by more than 2e-2 is not chosen, as in ``gemm.choose`` (none
    correct: an error). Made outside graph capture (the warm-up step); in a capture, or when the scratch does not
    fit, the ``wave_splits`` config with the first tile.

    Only for launches of at least one (sequence, KV head) pair an SM (b >= 17 for the 8B shape on an H200); below
    that the default. In the step the chosen configs were 1.0% and 2.6% faster at b = 32 and 64 (k = 0), but 1.4%
    and 1.6% slower at b = 8 and 16 (k = 0), although timed alone they read the KV 1-22% faster there (H200,
    ``engine_roofline.py --attn-compare``, same card; ``engine_attention_configs.py``)."""
    from tabletune.engine import gemm

    key = (kind, b, qlen, h, hkv, d, length, dtype, device)
    if key in _attn_choice:
        return _attn_choice[key]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if b * hkv < sms:  # timed alone the candidates won up to 22% here too, but inside the step they lost
        _attn_choice[key] = default_attn_config(b, hkv)
        return _attn_choice[key]
    cands = attn_candidates(b, hkv, sms)
    if torch.cuda.is_current_stream_capturing():
        return cands[0]
    try:
        copies = max(1, min(8, -(-ATTN_ROTATE_BYTES // (2 * b * hkv * length * d * torch.finfo(dtype).bits // 8))))
        caches = [(torch.empty(b, hkv, length, d, dtype=dtype, device=device).normal_(),
                   torch.empty(b, hkv, length, d, dtype=dtype, device=device).normal_()) for _ in range(copies)]
    except torch.cuda.OutOfMemoryError:
        _attn_choice[key] = cands[0]
        return cands[0]
    start = torch.full((b,), length - qlen, dtype=torch.long, device=device)
    slots = torch.arange(b, device=device)
    scale = d ** -0.5
    if kind == "attn":
        x = torch.randn(b, qlen, h, d, device=device).to(dtype)

        def run(c, kc, vc):
            return attention(x, kc, vc, start, slots, scale, cfg=c)

        def reference(kc, vc):
            return torch_ops.attention(x, kc, vc, start, slots, scale)
    else:
        x = torch.randn(b, qlen, (h + 2 * hkv) * d, device=device).to(dtype)
        norm = torch.ones(d, dtype=dtype, device=device)

        def run(c, kc, vc):  # qk-norm on, any RoPE base: neither changes what a config costs
            return rope_attention(x, start, slots, kc, vc, norm, norm, h, hkv, d, 1e6, 1e-6, scale, cfg=c)

        def reference(kc, vc):
            return torch_ops.rope_attention(x, start, slots, kc, vc, norm, norm, h, hkv, d, 1e6, 1e-6, scale)
    expected = reference(*caches[0]).float()
    i = [0]

    def rotate():
        i[0] = (i[0] + 1) % copies
        return caches[i[0]]
    timings = {}
    for c in cands:
        try:
            out = run(c, *caches[0]).float()
        except Exception:  # does not compile or launch here (shared memory)
            torch.cuda.synchronize()
            continue
        if float((out - expected).norm() / expected.norm().clamp_min(1e-30)) < 2e-2:
            timings[c] = gemm._time_us(lambda: run(c, *rotate()))
    caches.clear()  # the scratch KV back before the next shape
    if not timings:
        raise RuntimeError(f"no attention config for {kind} b={b} q={qlen} ran correctly on this GPU")
    _attn_choice[key] = min(timings, key=timings.get)
    return _attn_choice[key]


def _attn_config(kind: str, q: torch.Tensor, b: int, qlen: int, h: int, hkv: int, d: int, k_cache: torch.Tensor,
                 num_splits: int | None, cfg: AttnConfig | None) -> AttnConfig:
    """``cfg``; else the default with ``num_splits``; else (CUDA) ``choose_attention``; else the default."""
    if cfg is not None:
        return AttnConfig(*cfg)
    c = default_attn_config(b, hkv)
    if num_splits:
        return c._replace(splits=num_splits)
    if attn_force is not None:
        block_n, warps, stages, splits = attn_force
        if splits is None:
            splits = wave_splits(b, hkv, torch.cuda.get_device_properties(q.device).multi_processor_count
                                 if q.is_cuda else 132)
        return AttnConfig(splits, block_n, warps, stages)
    if q.is_cuda and attn_chooser:
        return choose_attention(kind, b, qlen, h, hkv, d, k_cache.shape[2], k_cache.dtype, q.device)
    return c


PREFETCH_TILES = (0, 1, 2, 4, 8)


def _prefetch_args(x: torch.Tensor, k_cache: torch.Tensor) -> dict:
    """The attention kernels' L2-hint constexprs: ``attn_prefetch_wait`` / ``attn_prefetch_ahead`` on CUDA, off
    elsewhere (Triton's interpreter runs no inline PTX); LINE: cache elements a 128-byte line."""
    for name, tiles in (("attn_prefetch_wait", attn_prefetch_wait), ("attn_prefetch_ahead", attn_prefetch_ahead)):
        if tiles not in PREFETCH_TILES:
            raise ValueError(f"kernels.{name} = {tiles!r}: not one of {PREFETCH_TILES}")
    if not x.is_cuda or not (attn_prefetch_wait or attn_prefetch_ahead):
        return {}
    line = PREFETCH_LINE_BYTES // k_cache.element_size()
    return {"PF_WAIT": attn_prefetch_wait, "PF_AHEAD": attn_prefetch_ahead, "LINE": min(line, k_cache.shape[-1])}


def attention(q, k_cache, v_cache, start_pos, slots, scale, num_splits: int | None = None,
              cfg: AttnConfig | None = None):
    """q [B, q, H, D] against the cache (``_attn_kernel``), with ``cfg``, or the default with ``num_splits``, or
    (neither given, CUDA) the config ``choose_attention`` timed for this shape."""
    b, qlen, h, d = q.shape
    hkv = k_cache.shape[1]
    c, gs = _head_groups(_attn_config("attn", q, b, qlen, h, hkv, d, k_cache, num_splits, cfg), h // hkv, qlen,
                         num_splits, cfg)
    g, block_m, (o_part, m_part, l_part), out = _attn_setup(b, qlen, h, hkv, d, q.dtype, q.device, c.splits, gs)
    pdl = pdl_enabled(q)
    _attn_kernel[(b, hkv * (g // gs), c.splits)](
        q, k_cache, v_cache, start_pos, slots, out, o_part, m_part, l_part, counters(q.device), qlen, scale,
        k_cache.stride(0), k_cache.stride(1), H=h, G=g, D=d, NUM_SPLITS=c.splits, BLOCK_M=block_m,
        BLOCK_N=c.block_n, USE_PDL=pdl, num_warps=c.warps, num_stages=c.stages, **pdl_kwargs(pdl),
        **_prefetch_args(q, k_cache), **_gs_arg(g, gs))
    return out


def _head_groups(c: AttnConfig, g: int, qlen: int, num_splits: int | None, cfg: AttnConfig | None
                 ) -> tuple[AttnConfig, int]:
    """The launch's config and query heads a program (``attn_max_rows``); with ``attn_rows_halve_splits`` the
    splits of a launch split into head groups are divided by their number, unless given by the caller."""
    gs = heads_per_program(g, qlen, attn_max_rows)
    if gs < g and attn_rows_halve_splits and cfg is None and not num_splits:
        c = c._replace(splits=max(1, c.splits * gs // g))
    return c, gs


def _gs_arg(g: int, gs: int) -> dict:
    """The kernels' GS constexpr, left out when a program takes the whole group (the kernel as before)."""
    return {} if gs == g else {"GS": gs}


def rope_attention(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads,
                   head_dim, theta, eps, scale, num_splits: int | None = None, cfg: AttnConfig | None = None):
    """``qk_rope_cache_write`` then ``attention`` in one launch (``_rope_attn_kernel``): qkv [B, q, (H+2Hkv)*D]
    -> attention output [B, q, H, D], the q new keys and values written into the cache. ``cfg`` as in
    ``attention``."""
    b, qlen, _ = qkv.shape
    hkv, d = num_kv_heads, head_dim
    c, gs = _head_groups(_attn_config("rope", qkv, b, qlen, num_heads, hkv, d, k_cache, num_splits, cfg),
                         num_heads // hkv, qlen, num_splits, cfg)
    g, block_m, (o_part, m_part, l_part), out = _attn_setup(b, qlen, num_heads, hkv, d, k_cache.dtype, qkv.device,
                                                            c.splits, gs)
    has_norm = q_norm_w is not None
    cos, sin = rope_table(qkv.device, d, theta, k_cache.shape[2])
    pdl = pdl_enabled(qkv)
    _rope_attn_kernel[(b, hkv * (g // gs), c.splits)](
        qkv, k_cache, v_cache, start_pos, slots, q_norm_w if has_norm else qkv, k_norm_w if has_norm else qkv, cos,
        sin, out, o_part, m_part, l_part, counters(qkv.device), qlen, scale, k_cache.stride(0), k_cache.stride(1),
        eps, H=num_heads, HKV=hkv, G=g, D=d, NUM_SPLITS=c.splits, BLOCK_M=block_m, BLOCK_N=c.block_n,
        QP=max(2, triton.next_power_of_2(qlen)), HAS_NORM=has_norm, USE_PDL=pdl, num_warps=c.warps,
        num_stages=c.stages, **pdl_kwargs(pdl), **_prefetch_args(qkv, k_cache), **_gs_arg(g, gs))
    return out


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    _pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(x_ptr + row * 2 * N + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * N + N + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, out_dtype=None) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * n)
    y = empty_rows(x.shape[0], n, out_dtype or x.dtype, x.device)
    pdl = pdl_enabled(x)
    _silu_mul_kernel[(x.shape[0], triton.cdiv(n, 1024))](x, y, n, BLOCK=1024, USE_PDL=pdl, **pdl_kwargs(pdl))
    return y.view(*gate_up.shape[:-1], n)


@triton.jit
def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, y_ptr, r_ptr, N, eps, BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr,
                         USE_PDL: tl.constexpr, DELTA_ACC: tl.constexpr = False):
    """``DELTA_ACC``: delta is an fp32 accumulator (``accumulator``): rounded to the residual's dtype, as the GEMM's
    own store would have, and set back to zeros."""
    _pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    r = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        dl = tl.load(d_ptr + row * N + cols, mask=ok, other=0.0)
        if DELTA_ACC:
            dl = dl.to(r_ptr.dtype.element_ty)
            tl.store(d_ptr + row * N + cols, tl.zeros([BLOCK], tl.float32), mask=ok)
        r += dl.to(tl.float32)
    r_lo = r.to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + row * N + cols, r_lo, mask=ok)
    r = r_lo.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, 0) / N + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (r * inv * w).to(y_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x, delta, weight, eps):
    """residual = x + delta (delta None: x); return (rms_norm(residual), residual). A delta that is an
    ``accumulator`` is read, rounded to the residual's dtype and left at zeros."""
    n = x.shape[-1]
    r = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    y = empty_rows(x.numel() // n, n, weight.dtype, x.device).view(x.shape)
    pdl = pdl_enabled(x)
    acc = is_accumulator(delta)
    _add_rms_norm_kernel[(x.numel() // n,)](x, x if delta is None else delta, weight, y, r, n, eps,
                                            BLOCK=triton.next_power_of_2(n), HAS_DELTA=delta is not None,
                                            USE_PDL=pdl, num_warps=8, **pdl_kwargs(pdl),
                                            **({"DELTA_ACC": True} if acc else {}))
    return y, r


# (M, N, device, lane) -> an fp32 buffer of zeros that one GEMM adds its split-K partials into (``gemm.linear`` with
# ``accumulate``) and the add_rms_norm after it reads and zeroes again; kept, so CUDA graphs read and write it
_accumulators: dict[tuple, torch.Tensor] = {}
_accumulator_ptrs: set[int] = set()


def accumulator(m: int, n: int, device: torch.device) -> torch.Tensor:
    """The [m, n] fp32 accumulator of this ``lane`` (zeros whenever no GEMM has added into it since its consumer
    ran); made outside graph capture (the warm-up step does), zeroed once."""
    key = (m, n, device, lane)
    if key not in _accumulators:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("an accumulator would be made inside CUDA graph capture: run one step eagerly first")
        buf = _accumulators[key] = torch.zeros(m, n, dtype=torch.float32, device=device)
        _accumulator_ptrs.add(buf.data_ptr())
    return _accumulators[key]


def is_accumulator(t: torch.Tensor | None) -> bool:
    """Whether ``t`` is (a view from the start of) an ``accumulator``."""
    return t is not None and t.dtype == torch.float32 and t.data_ptr() in _accumulator_ptrs


def rms_norm(x, weight, eps):
    return add_rms_norm(x, None, weight, eps)[0]


PREFETCH_LINE_BYTES = 128
PREFETCH_BULK_BYTES = 16384  # one cp.async.bulk.prefetch per 16 KB


@triton.jit
def _prefetch_kernel(ptr, NUM_CHUNKS, CHUNKS_PER_PROG, CHUNK_ELEMS: tl.constexpr, BLOCK: tl.constexpr,
                     MODE: tl.constexpr):
    """One hint per chunk of ``ptr``: ``prefetch.global.L2`` per 128-byte line (MODE 0; MODE 1 with the
    evict_last policy) or one ``cp.async.bulk.prefetch.L2`` per 16 KB (MODE 2). No data comes back."""
    lo = tl.program_id(0) * CHUNKS_PER_PROG
    for i in range(lo, lo + CHUNKS_PER_PROG, BLOCK):
        idx = tl.minimum(i + tl.arange(0, BLOCK), NUM_CHUNKS - 1)
        p = ptr + idx.to(tl.int64) * CHUNK_ELEMS
        if MODE == 0:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32,
                                      is_pure=False, pack=1)
        elif MODE == 1:
            tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [p],
                                      dtype=tl.int32, is_pure=False, pack=1)
        else:
            size = tl.full([BLOCK], CHUNK_ELEMS * 2, tl.int32)
            tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                      [p, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_plan(nbytes: int, mode: str, programs: int = 16, block: int = 256) -> tuple[int, int, int]:
    """(chunk elements of 2 bytes, number of chunks, chunks per program) to cover ``nbytes`` with ``programs``
    programs of ``block`` lanes."""
    if mode not in PREFETCH_MODES:
        raise ValueError(f"prefetch mode {mode!r} not in {PREFETCH_MODES}")
    chunk = PREFETCH_BULK_BYTES if mode == "bulk" else PREFETCH_LINE_BYTES
    num_chunks = max(1, nbytes // chunk)
    per_prog = round_up(-(-num_chunks // programs), block)
    return chunk // 2, num_chunks, per_prog


def prefetch_l2(w: torch.Tensor, mode: str = "lines", programs: int = 16) -> None:
    """Hint the GPU to pull the contiguous tensor ``w`` (2-byte elements) into L2; CUDA only, no sync, no result."""
    if not w.is_contiguous() or w.element_size() != 2:
        raise ValueError("prefetch_l2 takes a contiguous 2-byte tensor")
    chunk_elems, num_chunks, per_prog = prefetch_plan(w.nbytes, mode, programs)
    grid = (-(-num_chunks // per_prog),)
    _prefetch_kernel[grid](w, num_chunks, per_prog, CHUNK_ELEMS=chunk_elems, BLOCK=256,
                           MODE=PREFETCH_MODES.index(mode), num_warps=8)
