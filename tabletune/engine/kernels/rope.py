"""Qwen3's per-head RMSNorm of q and k, RoPE and the KV-cache write, in one launch (one program per token).

RoPE reads cos / sin from a table made once per cache length (``rope_table``) instead of evaluating them per
element, which every attention program would repeat once this is fused into attention (``attention.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tabletune.engine import ops as torch_ops
from tabletune.engine.kernels.common import launch_kwargs, pdl_wait


def rope_table(device: torch.device, head_dim: int, theta: float, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim] fp32 for positions 0 .. length-1 (``ops.rope_cos_sin``)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the RoPE table would be made inside CUDA graph capture: run one step eagerly first")
    cos, sin = torch_ops.rope_cos_sin(torch.arange(length, device=device), head_dim, theta)
    return cos.contiguous(), sin.contiguous()


@triton.jit
def rope_rows(qkv_ptr, tok_row, head, pos, norm_ptr, cos_ptr, sin_ptr, ok, eps, H: tl.constexpr, HKV: tl.constexpr,
              D: tl.constexpr, HAS_NORM: tl.constexpr):
    """Rows of the qkv buffer (token row ``tok_row``, head ``head`` counted over q, k, v heads) with the head's
    RMSNorm (if any) and RoPE at ``pos`` applied, fp32 [rows, D] (HF's non-interleaved layout)."""
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
def _qk_rope_cache_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, qn_ptr, kn_ptr,
                          cos_ptr, sin_ptr, QLEN, stride_slot, stride_head, eps, H: tl.constexpr, HKV: tl.constexpr,
                          D: tl.constexpr, HP: tl.constexpr, HAS_NORM: tl.constexpr, USE_PDL: tl.constexpr):
    """Rows of a token's program: its q heads (normed with qn, rotated, to q_out), its k heads (normed with kn,
    rotated, to the cache), then its v heads (to the cache as they are)."""
    pdl_wait(USE_PDL)
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
    tl.store(q_out_ptr + (tok.to(tl.int64) * H + heads) * D + offs, y.to(q_out_ptr.dtype.element_ty), mask=is_q)
    cache_off = slot * stride_slot + pos.to(tl.int64) * D + offs
    kh = tl.where(is_k, heads - H, 0)
    tl.store(k_cache_ptr + cache_off + kh * stride_head, y.to(k_cache_ptr.dtype.element_ty), mask=is_k)
    is_v = (heads >= H + HKV) & ok
    vh = tl.where(is_v, heads - H - HKV, 0)
    tl.store(v_cache_ptr + cache_off + vh * stride_head, x.to(v_cache_ptr.dtype.element_ty), mask=is_v)


def qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads: int,
                        num_kv_heads: int, head_dim: int, eps: float, cos, sin, pdl: bool) -> torch.Tensor:
    """qkv [B, q, (H+2Hkv)*D] -> Q [B, q, H, D] (normed, rotated); K (normed, rotated) and V written to the cache
    at positions start_pos .. start_pos + q - 1 of each sequence's slot."""
    b, qlen, _ = qkv.shape
    q = torch.empty(b, qlen, num_heads, head_dim, dtype=k_cache.dtype, device=qkv.device)
    has_norm = q_norm_w is not None
    _qk_rope_cache_kernel[(b * qlen,)](
        qkv, q, k_cache, v_cache, start_pos, slots, q_norm_w if has_norm else qkv, k_norm_w if has_norm else qkv,
        cos, sin, qlen, k_cache.stride(0), k_cache.stride(1), eps, H=num_heads, HKV=num_kv_heads, D=head_dim,
        HP=triton.next_power_of_2(num_heads + 2 * num_kv_heads), HAS_NORM=has_norm, USE_PDL=pdl, num_warps=4,
        **launch_kwargs(pdl))
    return q
