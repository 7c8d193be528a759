"""The layer ops in plain PyTorch: the CPU path and the reference for the Triton kernels.

Shapes: B sequences, q query tokens each, H query heads, Hkv KV heads, D head dim.
The KV cache of one layer is ``[num_slots, Hkv, max_len, D]`` for K and for V; a
sequence in slot s with ``start_pos`` tokens already cached writes its q new
keys at positions start_pos .. start_pos+q-1, and query i sees keys
0 .. start_pos+i (a causal mask aligned to the lower right).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Packed:
    """The token axis of a packed verify pass (vLLM's flattened batch): row b's q_b tokens sit at qoff_b ..
    qoff_b + q_b - 1. Attention keeps the padded layout [B, q_max]: ``flat`` [T] places token t there (row b,
    position p: b * q_max + p), ``index`` [B, q_max] is the reverse, clamped to each row's last token."""

    qoff: torch.Tensor  # [B] int64
    qlen: torch.Tensor  # [B] int64, 1 .. q_max
    flat: torch.Tensor  # [T] int64
    q_max: int

    @property
    def index(self) -> torch.Tensor:
        pos = torch.arange(self.q_max, device=self.qoff.device)
        return self.qoff[:, None] + torch.minimum(pos[None], self.qlen[:, None] - 1)


def upload(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list, an array) as a tensor on ``device`` without waiting: on CUDA through pinned memory, the
    copy queued behind the stream's work. ``torch.as_tensor(values, device="cuda")`` copies from pageable memory and
    first waits for the stream to drain, so the host would idle there while the device finishes what is queued,
    then launch the rest while the device idles."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * w, computed in float32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [*positions.shape, D] (HF's non-interleaved layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, q, heads, D]; cos/sin [B, q, D]. x*cos + rotate_half(x)*sin, in float32."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, :, None] + rot * sin[:, :, None]).to(x.dtype)


def qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads,
                        head_dim, theta, eps):
    """Split qkv [B, q, (H+2Hkv)*D]; qk-norm (if weights given), RoPE; write K, V to the cache; return Q [B, q, H, D]."""
    b, qlen, _ = qkv.shape
    h, hkv, d = num_heads, num_kv_heads, head_dim
    q = qkv[..., : h * d].reshape(b, qlen, h, d)
    k = qkv[..., h * d: (h + hkv) * d].reshape(b, qlen, hkv, d)
    v = qkv[..., (h + hkv) * d:].reshape(b, qlen, hkv, d)
    if q_norm_w is not None:
        q, k = rms_norm(q, q_norm_w, eps), rms_norm(k, k_norm_w, eps)
    # [B, q]
    pos = start_pos[:, None].long() + torch.arange(qlen, device=qkv.device)
    cos, sin = rope_cos_sin(pos, d, theta)
    q, k = apply_rope(q, cos, sin).to(k_cache.dtype), apply_rope(k, cos, sin)
    k_cache[slots[:, None], :, pos] = k.to(k_cache.dtype)
    v_cache[slots[:, None], :, pos] = v.to(v_cache.dtype)
    return q


def attention(q, k_cache, v_cache, start_pos, slots, scale):
    """q [B, q, H, D] against the cached keys of each slot; causal, lower-right aligned. Returns [B, q, H, D]."""
    b, qlen, h, d = q.shape
    # [B, Hkv, L, D]
    k, v = k_cache[slots], v_cache[slots]
    max_len = k.shape[2]
    # [B, q, L]: query i of sequence s sees keys 0 .. start_pos[s] + i
    limit = start_pos[:, None].long() + torch.arange(qlen, device=q.device)
    mask = torch.arange(max_len, device=q.device)[None, None, :] <= limit[:, :, None]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None], scale=scale,
        enable_gqa=True)
    return out.transpose(1, 2)


def rope_attention(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads, head_dim,
                   theta, eps, scale, packed: Packed | None = None):
    """``qk_rope_cache_write`` then ``attention`` (one launch in the Triton ops). ``packed``: qkv is [T, ...], padded
    to [B, q_max, ...] here (the padding repeats a row's last token into cache positions past the row's own) and
    the output [T, H, D] packed back."""
    if packed is not None:
        b = packed.qoff.shape[0]
        o = rope_attention(qkv[packed.index], start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads,
                           num_kv_heads, head_dim, theta, eps, scale)
        return o.reshape(b * packed.q_max, *o.shape[2:])[packed.flat]
    q = qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads,
                            head_dim, theta, eps)
    return attention(q, k_cache, v_cache, start_pos, slots, scale)


def silu_mul(gate_up: torch.Tensor, out_dtype=None) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] on the last dim."""
    g, u = gate_up.chunk(2, dim=-1)
    return (F.silu(g) * u).to(out_dtype or gate_up.dtype)


def linear(x: torch.Tensor, w: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """x [..., K] W^T over the last dim; gated: x = [gate | up] and y = (silu(gate) * up) W^T."""
    if gated:
        x = silu_mul(x, w.dtype)
    # [M, K]
    x2 = x.reshape(-1, x.shape[-1])
    return torch.mm(x2, w.t()).view(*x.shape[:-1], w.shape[0])


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """residual = x + delta (delta None: x); return (rms_norm(residual), residual)."""
    r = (x if delta is None else x + delta).to(weight.dtype)
    return rms_norm(r, weight, eps), r


def prefill_attention(q, k_cache, v_cache, start: int, slot, scale):
    """One sequence's prompt: q [1, P, H, D] at positions start..start+P-1, keys 0..start+P-1 of ``slot`` (an int,
    or a one-element tensor on the cache's device, as a captured prefill takes it). From position 0 the causal
    mask is SDPA's own (no mask tensor)."""
    _, plen, _, _ = q.shape
    end = start + plen
    if isinstance(slot, torch.Tensor):
        k, v = (c.index_select(0, slot.view(1))[:, :, :end].to(q.dtype) for c in (k_cache, v_cache))
    else:
        k, v = (c[slot, :, :end][None].to(q.dtype) for c in (k_cache, v_cache))
    if start == 0:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = torch.ones(plen, end, dtype=torch.bool, device=q.device).tril(diagonal=start)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


class TorchOps:
    """The ops of ``model.Decoder`` in plain PyTorch, with the interface of ``kernels.triton_ops.TritonOps``."""

    linear = staticmethod(linear)
    add_rms_norm = staticmethod(add_rms_norm)
    rms_norm = staticmethod(rms_norm)
    silu_mul = staticmethod(silu_mul)
    qk_rope_cache_write = staticmethod(qk_rope_cache_write)
    attention = staticmethod(attention)
    rope_attention = staticmethod(rope_attention)
