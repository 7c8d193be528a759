"""Split-KV decoding attention (flash-decoding style), alone or with qk-norm, RoPE and the cache write fused in.

One program per (sequence, KV head, split) loads each K / V tile once for all the query heads that share it: the
G = H / Hkv heads times the q query tokens are the rows of one tile, so a step reads the KV once. Row r is token
r // G of head kvh * G + r % G and sees keys 0 .. start_pos + r // G (causal, lower-right aligned). The split that
finishes last for a (sequence, KV head) merges the partials in split order (``common``: last program merges):

    o = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s

``_rope_attn_kernel`` (verify steps, q >= 2) also applies qk-norm and RoPE to its query rows, and the programs whose
key range reaches the new positions first write the q new keys and values into the cache. Its packed form reads a
row's q_b tokens at qoff_b .. qoff_b + q_b - 1 of a packed token axis (``ops.Packed``); tiles are sized for q_max.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tabletune.engine.kernels.common import MAX_TICKETS, empty_rows, launch_kwargs, pdl_wait
from tabletune.engine.kernels.rope import rope_rows


class AttnConfig(NamedTuple):
    """An attention launch: key splits per (sequence, KV head), keys a tile, warps, pipeline stages."""
    splits: int
    block_n: int = 64
    warps: int = 4
    stages: int = 3


def attn_config(batch_size: int, num_kv_heads: int, num_sms: int = 132) -> AttnConfig:
    """Below one (sequence, KV head) pair an SM: enough splits to fill at most one wave of SMs (1 .. 8) and
    128-key tiles of 8 warps; from there on one split and 64-key tiles of 4 warps (H200, 8B shape: the configs the
    step-time measurements kept)."""
    pairs = batch_size * num_kv_heads
    if pairs < num_sms:
        return AttnConfig(max(1, min(8, num_sms // pairs)), 128, 8, 3)
    return AttnConfig(1, 64, 4, 4 if pairs < 4 * num_sms else 3)


@triton.jit
def _attn_program(start_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, qlen, stride_slot, stride_head,
                  NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's (sequence, KV head, split), its key range lo .. hi-1 of the sequence's start + q keys (splits
    of whole BLOCK_N tiles), and the base pointers of its K and V rows."""
    b, kvh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(start_ptr + b)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    kv_len = start + qlen
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    kbase = k_cache_ptr + slot * stride_slot + kvh * stride_head
    vbase = v_cache_ptr + slot * stride_slot + kvh * stride_head
    return b, kvh, sp, start, lo, hi, kbase, vbase


@triton.jit
def _attn_tiles(q, kbase, vbase, lo, hi, limit, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """Online softmax of the rows of ``q`` over keys lo .. hi-1 (row r sees keys <= limit[r]): (m, l, acc)."""
    d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = scale * 1.4426950408889634
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        kv_off = cols.to(tl.int64)[:, None] * D + d[None, :]
        k = tl.load(kbase + kv_off, mask=col_ok[:, None], other=0.0, eviction_policy="evict_first")
        v = tl.load(vbase + kv_off, mask=col_ok[:, None], other=0.0, eviction_policy="evict_first")
        visible = (cols[None, :] <= limit[:, None]) & col_ok[None, :]
        s = tl.where(visible, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _attn_merge(out_ptr, o_part, m_part, l_part, pair, o_off, row_ok, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """The splits of one (sequence, KV head) merged in split order into the output rows."""
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


@triton.jit
def _attn_store(out_ptr, o_part, m_part, l_part, cnt_ptr, m_i, l_i, acc, b, sp, tok, heads, row_ok, row0,
                H: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Write the output rows (token row0 + tok; one split), or store this split's partial and let the last split
    merge them."""
    d = tl.arange(0, D)
    rows = tl.arange(0, BLOCK_M)
    o_off = ((row0 + tok).to(tl.int64) * H + heads) * D
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
def _attn_kernel(q_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, out_ptr, o_part, m_part, l_part, cnt_ptr,
                 QLEN, scale, stride_slot, stride_head, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                 NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr):
    """Grid (B, Hkv, splits): q [B, q, H, D] already normed and rotated, its keys already in the cache."""
    b, kvh, sp, start, lo, hi, kbase, vbase = _attn_program(start_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, QLEN,
                                                            stride_slot, stride_head, NUM_SPLITS, BLOCK_N)
    pdl_wait(USE_PDL)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G * QLEN
    tok = rows // G
    heads = kvh * G + rows % G
    q_off = ((b * QLEN + tok).to(tl.int64) * H + heads) * D
    q = tl.load(q_ptr + q_off[:, None] + tl.arange(0, D)[None, :], mask=row_ok[:, None], other=0.0)
    m_i, l_i, acc = _attn_tiles(q, kbase, vbase, lo, hi, start + tok, scale, D, BLOCK_M, BLOCK_N)
    _attn_store(out_ptr, o_part, m_part, l_part, cnt_ptr, m_i, l_i, acc, b, sp, tok, heads, row_ok, b * QLEN, H, D,
                NUM_SPLITS, BLOCK_M)


@triton.jit
def _rope_attn_kernel(qkv_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, qoff_ptr, qlen_ptr, qn_ptr, kn_ptr,
                      cos_ptr, sin_ptr, out_ptr, o_part, m_part, l_part, cnt_ptr, QLEN, scale, stride_slot,
                      stride_head, eps, H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                      NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QP: tl.constexpr,
                      HAS_NORM: tl.constexpr, PACKED: tl.constexpr, USE_PDL: tl.constexpr):
    """``rope.qk_rope_cache_write`` and ``_attn_kernel`` in one launch. A program whose key range reaches the new
    positions (start .. start + q - 1) first writes the q new keys (normed, rotated) and values of its KV head, then
    waits at a barrier so that its own loads see them; two splits may write the same new key, with the same value.
    ``PACKED``: the sequence's q tokens are rows qoff .. qoff + q - 1 of qkv and out (else b * QLEN on, q = QLEN)."""
    if PACKED:
        row0 = tl.load(qoff_ptr + tl.program_id(0))
        qlen = tl.load(qlen_ptr + tl.program_id(0))
    else:
        row0 = tl.program_id(0) * QLEN
        qlen = QLEN
    b, kvh, sp, start, lo, hi, kbase, vbase = _attn_program(start_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, qlen,
                                                            stride_slot, stride_head, NUM_SPLITS, BLOCK_N)
    pdl_wait(USE_PDL)
    d = tl.arange(0, D)
    if hi > start:
        t = tl.arange(0, QP)
        t_ok = t < qlen
        tok_row = row0 + t
        k_new = rope_rows(qkv_ptr, tok_row, H + kvh + t * 0, start + t, kn_ptr, cos_ptr, sin_ptr, t_ok, eps, H,
                          HKV, D, HAS_NORM)
        v_src = qkv_ptr + tok_row.to(tl.int64)[:, None] * (H + 2 * HKV) * D + (H + HKV + kvh) * D + d[None, :]
        v_new = tl.load(v_src, mask=t_ok[:, None], other=0.0)
        new_off = (start + t).to(tl.int64)[:, None] * D + d[None, :]
        tl.store(kbase + new_off, k_new.to(k_cache_ptr.dtype.element_ty), mask=t_ok[:, None])
        tl.store(vbase + new_off, v_new.to(v_cache_ptr.dtype.element_ty), mask=t_ok[:, None])
        tl.debug_barrier()  # the new keys are stored before any thread of this program loads them
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G * qlen
    tok = tl.where(row_ok, rows // G, 0)
    heads = kvh * G + rows % G
    q = rope_rows(qkv_ptr, row0 + tok, heads, start + tok, qn_ptr, cos_ptr, sin_ptr, row_ok, eps, H, HKV, D,
                  HAS_NORM).to(k_cache_ptr.dtype.element_ty)
    m_i, l_i, acc = _attn_tiles(q, kbase, vbase, lo, hi, start + tok, scale, D, BLOCK_M, BLOCK_N)
    _attn_store(out_ptr, o_part, m_part, l_part, cnt_ptr, m_i, l_i, acc, b, sp, tok, heads, row_ok, row0, H, D,
                NUM_SPLITS, BLOCK_M)


def _setup(b: int, qlen: int, h: int, hkv: int, d: int, dtype, device, splits: int, num_tokens: int | None = None):
    """(BLOCK_M, split partials (o, m, l), output [B, q, H, D], or [T, H, D] for ``num_tokens`` T) of a launch."""
    block_m = max(16, triton.next_power_of_2(h // hkv * qlen))
    assert b * hkv <= MAX_TICKETS
    n_part = b * hkv * splits * block_m if splits > 1 else 1
    m_part = torch.empty(n_part, dtype=torch.float32, device=device)
    parts = (torch.empty(n_part, d, dtype=torch.float32, device=device), m_part, torch.empty_like(m_part))
    out = empty_rows(num_tokens or b * qlen, h * d, dtype, device)
    return block_m, parts, out.view(num_tokens, h, d) if num_tokens else out.view(b, qlen, h, d)


def attention(q, k_cache, v_cache, start_pos, slots, scale: float, cfg: AttnConfig, counters: torch.Tensor,
              pdl: bool) -> torch.Tensor:
    """q [B, q, H, D] against the cache of each sequence's slot -> [B, q, H, D]."""
    b, qlen, h, d = q.shape
    hkv = k_cache.shape[1]
    block_m, (o_part, m_part, l_part), out = _setup(b, qlen, h, hkv, d, q.dtype, q.device, cfg.splits)
    _attn_kernel[(b, hkv, cfg.splits)](
        q, k_cache, v_cache, start_pos, slots, out, o_part, m_part, l_part, counters, qlen, scale, k_cache.stride(0),
        k_cache.stride(1), H=h, G=h // hkv, D=d, NUM_SPLITS=cfg.splits, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        USE_PDL=pdl, num_warps=cfg.warps, num_stages=cfg.stages, **launch_kwargs(pdl))
    return out


def rope_attention(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads: int, num_kv_heads: int,
                   head_dim: int, eps: float, scale: float, cos, sin, cfg: AttnConfig, counters: torch.Tensor,
                   pdl: bool, packed=None) -> torch.Tensor:
    """qkv [B, q, (H+2Hkv)*D] -> attention output [B, q, H, D], the q new keys and values written into the cache;
    ``packed`` (``ops.Packed``): qkv [T, (H+2Hkv)*D] -> [T, H, D], row b's tokens at its qoff .. qoff + q_b - 1."""
    h, hkv, d = num_heads, num_kv_heads, head_dim
    if packed is None:
        b, qlen, _ = qkv.shape
        qoff = qlen_t = start_pos  # not read
    else:
        b, qlen, qoff, qlen_t = packed.qoff.shape[0], packed.q_max, packed.qoff, packed.qlen
    block_m, (o_part, m_part, l_part), out = _setup(b, qlen, h, hkv, d, k_cache.dtype, qkv.device, cfg.splits,
                                                    None if packed is None else qkv.shape[0])
    has_norm = q_norm_w is not None
    _rope_attn_kernel[(b, hkv, cfg.splits)](
        qkv, k_cache, v_cache, start_pos, slots, qoff, qlen_t, q_norm_w if has_norm else qkv,
        k_norm_w if has_norm else qkv, cos, sin, out, o_part, m_part, l_part, counters, qlen, scale,
        k_cache.stride(0), k_cache.stride(1), eps, H=h, HKV=hkv, G=h // hkv, D=d, NUM_SPLITS=cfg.splits,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, QP=max(2, triton.next_power_of_2(qlen)), HAS_NORM=has_norm,
        PACKED=packed is not None, USE_PDL=pdl, num_warps=cfg.warps, num_stages=cfg.stages, **launch_kwargs(pdl))
    return out
