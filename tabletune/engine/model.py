"""Llama / Qwen3-family decoder (dense or MoE) over a slot-per-request KV cache.

The forward takes ``tokens [B, q]``, ``start_pos [B]`` (tokens already cached per sequence) and ``slots [B]`` (cache
rows), writes the q new keys / values and returns the final-normed hidden states ``[B, q, hidden]``. A layer is

    add+norm -> qkv GEMM -> (qk-norm, RoPE, cache write) -> attention -> o GEMM -> add+norm -> gate_up GEMM -> down GEMM

with silu(gate) * up inside the down GEMM (the gated split-K kernel) or just before it. In a verify step (q >= 2)
qk-norm, RoPE and the cache write run inside the attention launch. The ops (``ops.TorchOps`` or
``kernels.triton_ops.TritonOps``) are an object the model owns; ``select_ops`` makes them from a ``KernelConfig``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from tabletune.engine import ops as torch_ops
from tabletune.engine.config import KernelConfig
from tabletune.engine.kv_cache import KVCache
from tabletune.engine.presets import ModelConfig

LM_HEAD_CHOOSE_ROWS = 64  # the LM head runs the GEMM chooser's pick up to this many rows, cuBLAS above


def _param(*shape: int, dtype, device, std: float | None = None) -> nn.Parameter:
    t = torch.randn(*shape, dtype=torch.float32 if device == "cpu" else dtype, device=device)
    t = t.mul_(std if std is not None else 1.0 / math.sqrt(shape[-1])).to(dtype)
    return nn.Parameter(t, requires_grad=False)


def _ones(n: int, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.ones(n, dtype=dtype, device=device), requires_grad=False)


def select_ops(device: torch.device, cfg: KernelConfig | None = None):
    """The Triton kernels on CUDA (unless ``cfg.use_triton`` is False), the PyTorch ops elsewhere."""
    cfg = cfg or KernelConfig()
    use_triton = device.type == "cuda" if cfg.use_triton is None else cfg.use_triton
    if not use_triton:
        return torch_ops.TorchOps()
    from tabletune.engine.kernels.triton_ops import TritonOps

    return TritonOps(device, cfg)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype, device) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.in_norm = _ones(h, dtype, device)
        self.wqkv = _param((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h, dtype=dtype, device=device)
        self.q_norm = _ones(d, dtype, device) if cfg.qk_norm else None
        self.k_norm = _ones(d, dtype, device) if cfg.qk_norm else None
        self.wo = _param(h, cfg.num_heads * d, dtype=dtype, device=device)
        self.post_norm = _ones(h, dtype, device)
        if cfg.is_moe:
            e, im = cfg.num_experts, cfg.moe_intermediate_size
            self.router = _param(e, h, dtype=dtype, device=device)
            self.w_gate_up = _param(e, 2 * im, h, dtype=dtype, device=device)
            self.w_down = _param(e, h, im, dtype=dtype, device=device)
        else:
            self.w_gate_up = _param(2 * cfg.intermediate_size, h, dtype=dtype, device=device)
            self.w_down = _param(h, cfg.intermediate_size, dtype=dtype, device=device)

    def attn(self, ops, x, start_pos, slots, k_cache, v_cache, prefill_at: tuple | None = None,
             packed: torch_ops.Packed | None = None):
        """x [B, q, hidden] (normed; [T, hidden] when ``packed``) -> attention output after the o projection, same
        shape.

        ``prefill_at = (start, slot)`` marks a one-sequence prompt (SDPA over the slot's keys; the slot an int, or a
        one-element device tensor in a captured prefill)."""
        cfg = self.cfg
        qkv = ops.linear(x, self.wqkv)
        rope = (self.q_norm, self.k_norm, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta,
                cfg.rms_norm_eps)
        scale = cfg.head_dim ** -0.5
        if packed is not None:  # a packed verify step: the GEMMs see T tokens, attention pads rows to q_max
            return ops.linear(ops.rope_attention(qkv, start_pos, slots, k_cache, v_cache, *rope, scale,
                                                 packed=packed).flatten(-2), self.wo)
        b, qlen, _ = x.shape
        if prefill_at is None and qlen > 1:  # a verify step: one launch (k = 0 measured faster with two)
            o = ops.rope_attention(qkv, start_pos, slots, k_cache, v_cache, *rope, scale)
        else:
            q = ops.qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, *rope)
            if prefill_at is None:
                o = ops.attention(q, k_cache, v_cache, start_pos, slots, scale)
            else:
                o = torch_ops.prefill_attention(q, k_cache, v_cache, *prefill_at, scale)
        return ops.linear(o.reshape(b, qlen, -1), self.wo)

    def mlp(self, ops, x):
        if self.cfg.is_moe:
            return moe_mlp(ops, x, self.router, self.w_gate_up, self.w_down, self.cfg.num_experts_per_tok)
        return ops.linear(ops.linear(x, self.w_gate_up), self.w_down, gated=True)


def moe_mlp(ops, x, router, w_gate_up, w_down, top_k):
    """Qwen3-MoE: softmax router, top-k experts, renormalised weights; sum_e w_e * down_e(silu*mul(gate_up_e x)).

    Rows are sorted by expert and run as one grouped GEMM (``torch._grouped_mm``) on CUDA, so only the experts that
    some token picked are read; a loop over experts on the CPU.
    """
    shape = x.shape
    # [T, hidden]
    x2 = x.reshape(-1, shape[-1])
    t, e = x2.shape[0], router.shape[0]
    probs = torch.softmax(torch.mm(x2, router.t()).float(), dim=-1)
    weight, idx = probs.topk(top_k, dim=-1)
    weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
    flat = idx.reshape(-1)
    if x.is_cuda:
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = x2[order // top_k]
        hs = torch._grouped_mm(xs, w_gate_up.transpose(-2, -1), offs=offs)
        ys = torch._grouped_mm(ops.silu_mul(hs, x.dtype), w_down.transpose(-2, -1), offs=offs)
        y = torch.empty_like(ys)
        y[order] = ys
    else:
        xs = x2.repeat_interleave(top_k, dim=0)
        y = torch.zeros(t * top_k, shape[-1], dtype=x.dtype, device=x.device)
        for ex in torch.unique(flat).tolist():
            rows = (flat == ex).nonzero().squeeze(1)
            y[rows] = torch_ops.linear(torch_ops.linear(xs[rows], w_gate_up[ex]), w_down[ex], gated=True)
    out = (y.view(t, top_k, -1) * weight[..., None]).sum(1)
    return out.view(shape)


class Decoder(nn.Module):
    """A stack of decoder layers with embeddings, final norm and LM head; ``ops`` default: ``select_ops(device)``."""

    def __init__(self, cfg: ModelConfig, dtype=torch.bfloat16, device="cpu", ops=None) -> None:
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.embed = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device, std=1.0)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype, device) for _ in range(cfg.num_layers))
        self.final_norm = _ones(cfg.hidden_size, dtype, device)
        self.lm_head = self.embed if cfg.tie_embeddings else _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype,
                                                                     device=device)
        self.ops = ops if ops is not None else select_ops(torch.device(device))

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache(len(self.layers), num_slots, c.num_kv_heads, max_len, c.head_dim, self.dtype, self.device)

    def forward(self, tokens, start_pos, slots, cache: KVCache, prefill_at: tuple | None = None,
                packed: torch_ops.Packed | None = None):
        """tokens [B, q] -> final-normed hidden [B, q, hidden]; ``packed``: tokens [T] -> hidden [T, hidden]."""
        ops, eps = self.ops, self.cfg.rms_norm_eps
        x = self.embed[tokens]
        delta = None  # the first add+norm has nothing to add
        for i, layer in enumerate(self.layers):
            h, x = ops.add_rms_norm(x, delta, layer.in_norm, eps)
            a = layer.attn(ops, h, start_pos, slots, cache.k[i], cache.v[i], prefill_at, packed)
            h, x = ops.add_rms_norm(x, a, layer.post_norm, eps)
            delta = layer.mlp(ops, h)
        return ops.add_rms_norm(x, delta, self.final_norm, eps)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> logits [..., vocab] in the model's dtype: the GEMM chooser's pick up to
        LM_HEAD_CHOOSE_ROWS rows, cuBLAS above (timing vocabulary-wide candidates at large M costs start-up)."""
        # [M, hidden]
        h2 = hidden.reshape(-1, hidden.shape[-1])
        if h2.shape[0] <= LM_HEAD_CHOOSE_ROWS:
            return self.ops.linear(hidden, self.lm_head)
        return torch.mm(h2, self.lm_head.t()).view(*hidden.shape[:-1], -1)

    def load_safetensors(self, folder: str | Path) -> None:
        from tabletune.engine.weights import load_hf_weights

        load_hf_weights(self, Path(folder))
