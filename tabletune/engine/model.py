"""Llama / Qwen3-family decoder (dense or MoE) over a slot-per-request KV cache.

The forward takes ``tokens [B, q]``, ``start_pos [B]`` (tokens already cached
per sequence) and ``slots [B]`` (cache rows), writes the q new keys/values and
returns the final-normed hidden states ``[B, q, hidden]``. Each layer is
``add+norm -> qkv -> (qk-norm, RoPE, cache write) -> attention -> o -> add+norm
-> gate_up -> silu*mul -> down``: eight launches on the Triton path, one fewer where the GEMM chooser
runs silu*mul inside the down GEMM (the gated kernel), and one fewer again in a verify step of k >= 1
(qk-norm, RoPE and the cache write run inside the attention launch, which also merges its splits).
With the fused-norm layers (``fuse_norm_rows``, at most FUSED_NORM_MAX_M rows) the norms and silu*mul
run inside the GEMMs' epilogues: six launches (five in a verify step).

With an ``L2Prefetch`` (small batches on CUDA), each layer also hints its o-projection
weight into L2 from a side stream right after the qkv GEMM, while RoPE and attention,
which at small batch leave the memory bus mostly idle, run on the main stream.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from tabletune.engine import ops as torch_ops
from tabletune.engine.kv_cache import KVCache
from tabletune.engine.presets import ModelConfig


def _param(*shape: int, dtype, device, std: float | None = None) -> nn.Parameter:
    t = torch.randn(*shape, dtype=torch.float32 if device == "cpu" else dtype, device=device)
    t = t.mul_(std if std is not None else 1.0 / math.sqrt(shape[-1])).to(dtype)
    return nn.Parameter(t, requires_grad=False)


def _ones(n: int, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.ones(n, dtype=dtype, device=device), requires_grad=False)


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
        self._folded: dict[str, torch.Tensor] = {}  # folded()
        if cfg.is_moe:
            e, im = cfg.num_experts, cfg.moe_intermediate_size
            self.router = _param(e, h, dtype=dtype, device=device)
            self.w_gate_up = _param(e, 2 * im, h, dtype=dtype, device=device)
            self.w_down = _param(e, h, im, dtype=dtype, device=device)
        else:
            self.w_gate_up = _param(2 * cfg.intermediate_size, h, dtype=dtype, device=device)
            self.w_down = _param(h, cfg.intermediate_size, dtype=dtype, device=device)

    def attn(self, ops, x, start_pos, slots, k_cache, v_cache, prefill_at: tuple[int, int] | None = None,
             prefetch: L2Prefetch | None = None, fuse_rope: bool = True, accumulate: bool = False):
        """x [B, q, hidden] (normed) -> attention output [B, q, hidden].

        ``prefill_at = (start, slot)`` marks a one-sequence prompt (SDPA over the slot's keys; the slot an int, or
        a one-element device tensor in a captured prefill). ``fuse_rope``: a verify
        step (q >= 2 tokens a sequence) runs qk-norm, RoPE and the cache write inside the attention launch
        (``ops.rope_attention``); on the H200 that measured -2.2% to +0.1% at k >= 1, +0.9% and +1.4% at k = 0.
        ``accumulate``: the o GEMM's result may be a ``kernels.accumulator`` (see ``linear``).
        """
        b, qlen, _ = x.shape
        o = self.attend(ops, linear(x, self.wqkv), start_pos, slots, k_cache, v_cache, prefill_at, prefetch,
                        fuse_rope)
        return linear(o.reshape(b, qlen, -1), self.wo, accumulate=accumulate)

    def attend(self, ops, qkv, start_pos, slots, k_cache, v_cache, prefill_at: tuple[int, int] | None = None,
               prefetch: L2Prefetch | None = None, fuse_rope: bool = True):
        """qkv [B, q, (H+2Hkv)*D] -> attention output [B, q, H, D] before the o projection (see ``attn``)."""
        cfg = self.cfg
        qlen = qkv.shape[1]
        if prefetch is not None:
            prefetch.issue(self.wo)
        rope = (self.q_norm, self.k_norm, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta,
                cfg.rms_norm_eps)
        scale = cfg.head_dim ** -0.5
        if prefill_at is None and fuse_rope and qlen > 1:  # k = 0: the separate launch measured faster
            return ops.rope_attention(qkv, start_pos, slots, k_cache, v_cache, *rope, scale)
        q = ops.qk_rope_cache_write(qkv, start_pos, slots, k_cache, v_cache, *rope)
        if prefill_at is None:
            return ops.attention(q, k_cache, v_cache, start_pos, slots, scale)
        return torch_ops.prefill_attention(q, k_cache, v_cache, *prefill_at, scale)

    def folded(self, name: str) -> torch.Tensor:
        """A copy of ``wqkv`` or ``w_gate_up`` with the weight of the norm before it (in_norm, post_norm) folded into
        its columns (``gemm.fold_norm``), for the fused-norm layers; made on first use, after the weights are loaded
        (the memory of that weight once more)."""
        if name not in self._folded:
            from tabletune.engine import gemm

            norm = {"wqkv": self.in_norm, "w_gate_up": self.post_norm}[name]
            self._folded[name] = gemm.fold_norm(getattr(self, name), norm)
        return self._folded[name]

    def mlp(self, ops, x, accumulate: bool = False):
        """``accumulate``: the down GEMM's result may be a ``kernels.accumulator`` (see ``linear``)."""
        if self.cfg.is_moe:
            return moe_mlp(ops, x, self.router, self.w_gate_up, self.w_down, self.cfg.num_experts_per_tok)
        if x.is_cuda:  # silu(gate) * up inside the down GEMM (or before cuBLAS)
            return linear(linear(x, self.w_gate_up), self.w_down, gated=True, accumulate=accumulate)
        return linear(ops.silu_mul(linear(x, self.w_gate_up), self.w_down.dtype), self.w_down)


def linear(x: torch.Tensor, w: torch.Tensor, gated: bool = False, accumulate: bool = False) -> torch.Tensor:
    """y = x W^T over the last dim; gated (CUDA only): y = (silu(gate) * up) W^T for x = [gate | up];
    ``accumulate``: see ``gemm.linear`` (only for a y that goes to ``add_rms_norm`` and nowhere else)."""
    x2 = x.reshape(-1, x.shape[-1])
    y = gemm_linear(x2, w, gated, accumulate) if x.is_cuda else torch.mm(x2, w.t())
    return y.view(*x.shape[:-1], w.shape[0])


def gemm_linear(x2: torch.Tensor, w: torch.Tensor, gated: bool = False, accumulate: bool = False) -> torch.Tensor:
    from tabletune.engine import gemm

    return gemm.linear(x2, w, gated, accumulate)


def moe_mlp(ops, x, router, w_gate_up, w_down, top_k):
    """Qwen3-MoE: softmax router, top-k experts, renormalised weights; sum_e w_e * down_e(silu*mul(gate_up_e x)).

    Rows are sorted by expert and run as one grouped GEMM (``torch._grouped_mm``) on CUDA, so
    only the experts that some token picked are read; a loop over experts on the CPU.
    """
    shape = x.shape
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
            y[rows] = linear(ops.silu_mul(linear(xs[rows], w_gate_up[ex]), x.dtype), w_down[ex])
    out = (y.view(t, top_k, -1) * weight[..., None]).sum(1)
    return out.view(shape)


LM_HEAD_CHOOSE_ROWS = 64
FUSED_NORM_MAX_M = 64  # rows up to which a decode step may run the fused-norm layers: the wgmma kernel's fused
FUSED_POINTER_M = 16  # epilogues (Hopper, bf16) up to 64 rows, the pointer kernel's (one 16-row block) up to 16
PREFETCH_MODES = ("lines", "lines_evict_last", "bulk")  # kernels.prefetch_l2's hint instructions


class L2Prefetch:
    """Weight prefetches into L2 on a side stream, forked from the main stream where ``issue`` is called.

    A prefetch is only a hint (no result, nothing waits for it); ``join`` makes the main stream wait for the
    side stream once at the end of the forward, as CUDA-graph capture requires of every forked stream.
    """

    def __init__(self, mode: str, stream: torch.cuda.Stream, programs: int = 16) -> None:
        self.mode, self.stream, self.programs, self.issued = mode, stream, programs, 0

    def issue(self, w: torch.Tensor) -> None:
        from tabletune.engine import kernels

        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            kernels.prefetch_l2(w, self.mode, self.programs)
        self.issued += 1

    def join(self) -> None:
        if self.issued:
            torch.cuda.current_stream().wait_stream(self.stream)
            self.issued = 0


class Decoder(nn.Module):
    """A stack of decoder layers with embeddings, final norm and LM head."""

    def __init__(self, cfg: ModelConfig, dtype=torch.bfloat16, device="cpu", num_layers: int | None = None,
                 use_triton: bool | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        n = cfg.num_layers if num_layers is None else num_layers
        self.embed = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device, std=1.0)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype, device) for _ in range(n))
        self.final_norm = _ones(cfg.hidden_size, dtype, device)
        self.lm_head = self.embed if cfg.tie_embeddings else _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype,
                                                                     device=device)
        self.ops = select_ops(torch.device(device) if isinstance(device, str) else device, use_triton)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache(len(self.layers), num_slots, c.num_kv_heads, max_len, c.head_dim, self.dtype, self.device)

    def forward(self, tokens, start_pos, slots, cache: KVCache, embeds: torch.Tensor | None = None,
                prefill_at: tuple[int, int] | None = None, prefetch: L2Prefetch | None = None,
                fuse_rope: bool = True, fuse_norm_rows: int = 0):
        """tokens [B, q] -> final-normed hidden [B, q, hidden]; ``prefetch``: hint each o weight into L2;
        ``fuse_rope``: see ``DecoderLayer.attn``; ``fuse_norm_rows``: a decode step of at most this many rows runs
        ``_forward_fused_norm``."""
        ops, eps = self.ops, self.cfg.rms_norm_eps
        x = self.embed[tokens] if embeds is None else embeds
        if self.fuses_norm(x, prefill_at, fuse_norm_rows):
            return self._forward_fused_norm(x, start_pos, slots, cache, prefetch, fuse_rope)
        delta = None  # the first add+norm has nothing to add
        acc = ops is not torch_ops  # the o and down results go to the Triton add_rms_norm only
        for i, layer in enumerate(self.layers):
            h, x = ops.add_rms_norm(x, delta, layer.in_norm, eps)
            a = layer.attn(ops, h, start_pos, slots, cache.k[i], cache.v[i], prefill_at, prefetch, fuse_rope, acc)
            h, x = ops.add_rms_norm(x, a, layer.post_norm, eps)
            delta = layer.mlp(ops, h, acc)
        if prefetch is not None:
            prefetch.join()
        return ops.add_rms_norm(x, delta, self.final_norm, eps)[0]

    def fuses_norm(self, x: torch.Tensor, prefill_at, max_rows: int) -> bool:
        """Whether a forward of ``x`` runs the fused-norm layers: CUDA, Triton ops, dense, decode, at most
        ``max_rows`` and FUSED_POINTER_M rows (FUSED_NORM_MAX_M where the wgmma kernel's epilogues can run)."""
        rows = x.numel() // x.shape[-1]
        if not (x.is_cuda and prefill_at is None and not self.cfg.is_moe and self.ops is not torch_ops
                and rows <= min(max_rows, FUSED_NORM_MAX_M)):
            return False
        from tabletune.engine import gemm

        return rows <= gemm.fused_max_rows(self.layers[0].wqkv)

    def _forward_fused_norm(self, x, start_pos, slots, cache: KVCache, prefetch: L2Prefetch | None,
                            fuse_rope: bool = True):
        """The forward with no norm or silu * mul launch inside the stack (rows <= 16): the o and down GEMMs add into
        the residual stream in their epilogue and leave the rows' sums of squares; the qkv and gate_up GEMMs read
        the residual stream through a copy of W with the norm's weight folded in and scale each finished row by its
        1 / rms; gate_up's epilogue also takes silu(gate) * up (``gemm.norm_linear`` / ``gemm.residual_linear``).
        The K loops are the plain GEMM's. The same math as ``forward``, rounded in other places: the norm weight once
        into W, 1 / rms after the product instead of before it, the sums of squares added in another order."""
        from tabletune.engine import gemm

        eps = self.cfg.rms_norm_eps
        b, qlen, hidden = x.shape
        m = b * qlen
        h, r = self.ops.add_rms_norm(x, None, self.layers[0].in_norm, eps)
        r2 = r.view(m, hidden)  # the residual stream, updated in place by the o and down GEMMs
        squares = None
        for i, layer in enumerate(self.layers):
            if squares is None:  # the first layer's norm ran above, on its own
                qkv = linear(h, layer.wqkv)
            else:
                wqkv = layer.folded("wqkv")
                qkv = gemm.norm_linear(r2, wqkv, gemm.choose_fused(m, wqkv, "norm"),
                                       gemm.RowNorm(squares, eps)).view(b, qlen, -1)
            o = layer.attend(self.ops, qkv, start_pos, slots, cache.k[i], cache.v[i], None, prefetch, fuse_rope)
            squares = gemm.residual_linear(o.reshape(m, -1), layer.wo, gemm.choose_fused(m, layer.wo, "resid"), r2)
            w_gate_up = layer.folded("w_gate_up")
            act = gemm.norm_linear(r2, w_gate_up, gemm.choose_fused(m, w_gate_up, "norm-silu"),
                                   gemm.RowNorm(squares, eps), silu=True)
            squares = gemm.residual_linear(act, layer.w_down, gemm.choose_fused(m, layer.w_down, "resid"), r2)
        if prefetch is not None:
            prefetch.join()
        return self.ops.add_rms_norm(r, None, self.final_norm, eps)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> logits [..., vocab] in the model's dtype: on CUDA the GEMM chooser's pick per M up to
        LM_HEAD_CHOOSE_ROWS rows (where a Triton kernel can win), cuBLAS above (timing the vocabulary-wide
        candidates at large M cost minutes of start-up and cuBLAS won there: docs/engine_notes.md, v0.5)."""
        h2 = hidden.reshape(-1, hidden.shape[-1])
        if h2.shape[0] <= LM_HEAD_CHOOSE_ROWS:
            return linear(hidden, self.lm_head)
        return torch.mm(h2, self.lm_head.t()).view(*hidden.shape[:-1], -1)

    def load_safetensors(self, folder: str | Path) -> None:
        from tabletune.engine.weights import load_hf_weights

        load_hf_weights(self, Path(folder))


def select_ops(device: torch.device, use_triton: bool | None):
    """Triton kernels on CUDA (unless use_triton=False), the PyTorch ops elsewhere."""
    if use_triton is None:
        use_triton = device.type == "cuda"
    if use_triton:
        from tabletune.engine import kernels

        return kernels
    return torch_ops
