"""Triton kernels for the decode hot path (GPU; also run by Triton's interpreter in tests).

* ``qk_rope_cache``: one launch per layer splits qkv, applies Qwen3's per-head
  RMSNorm to q and k, RoPE, and writes K and V into the slot cache.
* ``attention``: split-KV decoding attention (flash-decoding style). One program
  per (sequence, KV head, split) loads each K/V tile once for all the query heads
  that share it: the G = H/Hkv heads times the q query tokens are the rows of one
  tile, so KV is read once per step. Row r is token r // G of head kvh*G + r % G
  and sees keys 0 .. start_pos + r // G (causal, lower-right aligned). A second
  launch merges the splits: o = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s.
* ``silu_mul`` and ``add_rms_norm``: the two element-wise fusions of a layer.
* ``skinny_mm``: y = x W^T for a few rows of x, streaming W once (memory-bound GEMV).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _qk_rope_cache_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, qn_ptr, kn_ptr,
                          QLEN, stride_slot, stride_head, log2_theta, eps,
                          H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HAS_NORM: tl.constexpr):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    b = tok // QLEN
    pos = tl.load(start_ptr + b) + tok % QLEN
    slot = tl.load(slots_ptr + b).to(tl.int64)
    offs = tl.arange(0, D)
    rot = (offs + D // 2) % D
    base = qkv_ptr + tok.to(tl.int64) * (H + 2 * HKV) * D + head * D
    x = tl.load(base + offs).to(tl.float32)
    if head < H + HKV:
        xr = tl.load(base + rot).to(tl.float32)
        if HAS_NORM:
            inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / D + eps)
            if head < H:
                w = tl.load(qn_ptr + offs).to(tl.float32)
                wr = tl.load(qn_ptr + rot).to(tl.float32)
            else:
                w = tl.load(kn_ptr + offs).to(tl.float32)
                wr = tl.load(kn_ptr + rot).to(tl.float32)
            x = x * inv * w
            xr = xr * inv * wr
        inv_freq = tl.exp2(-((offs % (D // 2)).to(tl.float32) * 2.0 / D) * log2_theta)
        ang = pos.to(tl.float32) * inv_freq
        sign = tl.where(offs < D // 2, -1.0, 1.0)
        y = x * tl.cos(ang) + sign * xr * tl.sin(ang)
        if head < H:
            tl.store(q_out_ptr + (tok.to(tl.int64) * H + head) * D + offs, y.to(q_out_ptr.dtype.element_ty))
        else:
            dst = k_cache_ptr + slot * stride_slot + (head - H) * stride_head + pos.to(tl.int64) * D + offs
            tl.store(dst, y.to(k_cache_ptr.dtype.element_ty))
    else:
        dst = v_cache_ptr + slot * stride_slot + (head - H - HKV) * stride_head + pos.to(tl.int64) * D + offs
        tl.store(dst, x.to(v_cache_ptr.dtype.element_ty))


def qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads,
                        head_dim, theta, eps):
    b, qlen, _ = qkv.shape
    q = torch.empty(b, qlen, num_heads, head_dim, dtype=k_cache.dtype, device=qkv.device)
    has_norm = q_norm_w is not None
    _qk_rope_cache_kernel[(b * qlen, num_heads + 2 * num_kv_heads)](
        qkv, q, k_cache, v_cache, start_pos, slots, q_norm_w if has_norm else qkv, k_norm_w if has_norm else qkv,
        qlen, k_cache.stride(0), k_cache.stride(1), math.log2(theta), eps,
        H=num_heads, HKV=num_kv_heads, D=head_dim, HAS_NORM=has_norm)
    return q


@triton.jit
def _attn_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, o_part, m_part, l_part,
                       QLEN, scale, stride_slot, stride_head, NUM_SPLITS,
                       H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    start = tl.load(start_ptr + b)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    kv_len = start + QLEN
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G * QLEN
    tok = rows // G
    d = tl.arange(0, D)
    q_off = ((b * QLEN + tok).to(tl.int64) * H + kvh * G + rows % G) * D
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    limit = start + tok
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    kbase = k_cache_ptr + slot * stride_slot + kvh * stride_head
    vbase = v_cache_ptr + slot * stride_slot + kvh * stride_head
    qk_scale = scale * 1.4426950408889634
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        kv_off = cols.to(tl.int64)[:, None] * D + d[None, :]
        k = tl.load(kbase + kv_off, mask=col_ok[:, None], other=0.0)
        v = tl.load(vbase + kv_off, mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where((cols[None, :] <= limit[:, None]) & col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    part = ((b * tl.num_programs(1) + kvh) * NUM_SPLITS + sp).to(tl.int64) * BLOCK_M
    tl.store(o_part + (part + rows)[:, None] * D + d[None, :], acc)
    tl.store(m_part + part + rows, m_i)
    tl.store(l_part + part + rows, l_i)


@triton.jit
def _attn_merge_kernel(out_ptr, o_part, m_part, l_part, QLEN, NUM_SPLITS,
                       H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    r = tl.program_id(2)
    if r < G * QLEN:
        s = tl.arange(0, BLOCK_S)
        s_ok = s < NUM_SPLITS
        d = tl.arange(0, D)
        idx = ((b * tl.num_programs(1) + kvh) * NUM_SPLITS + s).to(tl.int64) * BLOCK_M + r
        m = tl.load(m_part + idx, mask=s_ok, other=float("-inf"))
        l_s = tl.load(l_part + idx, mask=s_ok, other=0.0)
        m_max = tl.max(m, 0)
        w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
        o = tl.load(o_part + idx[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0)
        acc = tl.sum(w[:, None] * o, 0)
        l_sum = tl.sum(w * l_s, 0)
        out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)
        o_off = ((b * QLEN + r // G).to(tl.int64) * H + kvh * G + r % G) * D
        tl.store(out_ptr + o_off + d, out.to(out_ptr.dtype.element_ty))


def num_splits_for(batch_size: int, num_kv_heads: int, num_sms: int = 132) -> int:
    """Enough splits of the keys that batch * kv_heads * splits fills the GPU twice over (at most 16)."""
    return max(1, min(16, -(-2 * num_sms // (batch_size * num_kv_heads))))


def attention(q, k_cache, v_cache, start_pos, slots, scale, num_splits: int | None = None):
    b, qlen, h, d = q.shape
    hkv = k_cache.shape[1]
    g = h // hkv
    block_m = max(16, triton.next_power_of_2(g * qlen))
    splits = num_splits or num_splits_for(b, hkv)
    o_part = torch.empty(b * hkv * splits * block_m, d, dtype=torch.float32, device=q.device)
    m_part = torch.empty(b * hkv * splits * block_m, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    _attn_split_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, start_pos, slots, o_part, m_part, l_part, qlen, scale,
        k_cache.stride(0), k_cache.stride(1), splits, H=h, G=g, D=d, BLOCK_M=block_m, BLOCK_N=64,
        num_warps=4, num_stages=3)
    out = torch.empty_like(q)
    _attn_merge_kernel[(b, hkv, g * qlen)](out, o_part, m_part, l_part, qlen, splits, H=h, G=g, D=d,
                                           BLOCK_M=block_m, BLOCK_S=triton.next_power_of_2(splits), num_warps=2)
    return out


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(x_ptr + row * 2 * N + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * N + N + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, out_dtype=None) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * n)
    y = torch.empty(x.shape[0], n, dtype=out_dtype or x.dtype, device=x.device)
    _silu_mul_kernel[(x.shape[0], triton.cdiv(n, 1024))](x, y, n, BLOCK=1024)
    return y.view(*gate_up.shape[:-1], n)


@triton.jit
def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, y_ptr, r_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    r = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    r += tl.load(d_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    r_lo = r.to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + row * N + cols, r_lo, mask=ok)
    r = r_lo.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, 0) / N + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (r * inv * w).to(y_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x, delta, weight, eps):
    n = x.shape[-1]
    r = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    y = torch.empty_like(r)
    _add_rms_norm_kernel[(x.numel() // n,)](x, delta, weight, y, r, n, eps, BLOCK=triton.next_power_of_2(n),
                                            num_warps=8)
    return y, r


def rms_norm(x, weight, eps):
    return add_rms_norm(x, torch.zeros_like(x), weight, eps)[0]



@triton.jit
def _skinny_mm_kernel(x_ptr, w_ptr, y_ptr, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] * K + (k0 + kk)[None, :], mask=rows[:, None] < M, other=0.0)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :], mask=cols[:, None] < N, other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def skinny_mm(x: torch.Tensor, w: torch.Tensor, block_n: int = 32, block_k: int = 256) -> torch.Tensor:
    """y = x @ w.T for x [M, K] with M <= 16 and K a multiple of block_k."""
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_mm_kernel[(triton.cdiv(n, block_n),)](x, w, y, m, n, k, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
                                                  num_warps=4, num_stages=4)
    return y
