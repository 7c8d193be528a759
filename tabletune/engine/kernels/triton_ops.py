"""``TritonOps``: the model's ops on the Triton kernels, with everything they keep between calls.

One object per engine holds the ticket counters, the RoPE tables, the PDL flag and the GEMM chooser, so that two
engines in one process share nothing and no module state is changed at run time.
"""

from __future__ import annotations

import torch

from tabletune.engine import ops as torch_ops
from tabletune.engine.config import KernelConfig
from tabletune.engine.kernels import attention as attn
from tabletune.engine.kernels import norms, rope
from tabletune.engine.kernels.common import MAX_TICKETS, pdl_works
from tabletune.engine.kernels.gemm import GemmChooser


class TritonOps:
    def __init__(self, device: torch.device, cfg: KernelConfig) -> None:
        self.device = device
        self.pdl = cfg.pdl and pdl_works(device)
        self.counters = torch.zeros(MAX_TICKETS, dtype=torch.int32, device=device)
        cuda = device.type == "cuda"
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 132
        self.gemm = GemmChooser(self.counters, self.pdl, cfg.split_k)
        self._rope: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def linear(self, x: torch.Tensor, w: torch.Tensor, gated: bool = False) -> torch.Tensor:
        """x [..., K] W^T over the last dim (gated: x = [gate | up], silu(gate) * up first): the GEMM chooser's pick
        on CUDA, torch elsewhere (Triton's interpreter)."""
        # [M, K]
        x2 = x.reshape(-1, x.shape[-1])
        y = self.gemm.linear(x2, w, gated) if x.is_cuda else torch_ops.linear(x2, w, gated)
        return y.view(*x.shape[:-1], w.shape[0])

    def add_rms_norm(self, x, delta, weight, eps: float):
        return norms.add_rms_norm(x, delta, weight, eps, self.pdl)

    def rms_norm(self, x, weight, eps: float):
        return norms.add_rms_norm(x, None, weight, eps, self.pdl)[0]

    def silu_mul(self, gate_up, out_dtype=None):
        return norms.silu_mul(gate_up, self.pdl, out_dtype)

    def rope_table(self, head_dim: int, theta: float, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [length, head_dim], made once per key outside graph capture and kept (graphs read them)."""
        key = (head_dim, float(theta), length)
        if key not in self._rope:
            self._rope[key] = rope.rope_table(self.device, head_dim, theta, length)
        return self._rope[key]

    def qk_rope_cache_write(self, qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads,
                            num_kv_heads, head_dim, theta, eps):
        cos, sin = self.rope_table(head_dim, theta, k_cache.shape[2])
        return rope.qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads,
                                        num_kv_heads, head_dim, eps, cos, sin, self.pdl)

    def attention(self, q, k_cache, v_cache, start_pos, slots, scale: float, cfg: attn.AttnConfig | None = None):
        cfg = cfg or attn.attn_config(q.shape[0], k_cache.shape[1], self.num_sms)
        return attn.attention(q, k_cache, v_cache, start_pos, slots, scale, cfg, self.counters, self.pdl)

    def rope_attention(self, qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads, num_kv_heads,
                       head_dim, theta, eps, scale, cfg: attn.AttnConfig | None = None, packed=None):
        cos, sin = self.rope_table(head_dim, theta, k_cache.shape[2])
        cfg = cfg or attn.attn_config(start_pos.shape[0], num_kv_heads, self.num_sms)
        return attn.rope_attention(qkv, start_pos, slots, k_cache, v_cache, q_norm_w, k_norm_w, num_heads,
                                   num_kv_heads, head_dim, eps, scale, cos, sin, cfg, self.counters, self.pdl,
                                   packed)
