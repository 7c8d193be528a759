"""The EAGLE-1 head for a Llama target, laid out as vLLM's ``EagleLlamaForCausalLM`` loads it.

    x = fc([embed(token_j); f_{j-1}])                    f: the target's final-normed hidden state
    r = x + o_proj(attention(rope(q, k), v))             one Llama layer, no input RMSNorm (EAGLE-1)
    h = r + mlp(rmsnorm(r) * post_attention_layernorm)   no final norm
    logits = lm_head(h)                                  the target's own (tied) LM head, frozen

h at position j stands in for f_j: it predicts token j + 1 and is the feature of the next draft step.
The folder holds ``model.safetensors`` (``fc.weight``, ``layers.0.*``; no embedding, no LM head: both are
the target's) and ``config.json`` (a one-layer Llama config, as vLLM reads a draft model's).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tabletune import fileio
from tabletune.errors import InputError

WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int

    @classmethod
    def from_llama(cls, cfg: dict) -> HeadConfig:
        rope = cfg.get("rope_parameters") or {}
        return cls(cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                   cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"], cfg["intermediate_size"],
                   float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))), float(cfg["rms_norm_eps"]),
                   cfg["vocab_size"])

    def llama_config(self) -> dict:
        """The one-layer Llama config.json vLLM's EAGLE loader reads for the draft."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": self.hidden_size,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "intermediate_size": self.intermediate_size, "num_hidden_layers": 1,
                "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_norm_eps, "vocab_size": self.vocab_size,
                "hidden_act": "silu", "max_position_embeddings": 8192, "tie_word_embeddings": True,
                "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, heads, L, D], pos [B, L]: HF's half-split rotary embedding, in float32."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None, :, None] * inv  # [B, 1, L, D/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    xf = x.float()
    rot = torch.cat([-xf[..., d // 2:], xf[..., : d // 2]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


class _Attn(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)


class _Mlp(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Norm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class _Layer(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.self_attn = _Attn(c)
        self.post_attention_layernorm = _Norm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _Mlp(c)


class EagleHead(nn.Module):
    """Trainable EAGLE-1 head; ``forward`` runs whole right-padded sequences with a causal mask."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([_Layer(cfg)])

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """emb, feat [B, L, hidden], pos [B, L] -> h [B, L, hidden] (causal over the L positions)."""
        return self.forward_kv(emb, feat, pos)[0]

    def forward_kv(self, emb, feat, pos, past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """As ``forward``, also returning the keys / values [B, Hkv, P + L, D] (rotated) for later positions.
        With ``past`` (the keys / values of earlier positions) L must be 1: the token sees all of them."""
        c, layer = self.cfg, self.layers[0]
        b, n, _ = emb.shape
        x = self.fc(torch.cat([emb, feat], -1))
        a = layer.self_attn
        q = a.q_proj(x).view(b, n, c.num_heads, c.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q, k = rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta)
        if past is not None:
            assert n == 1, "with past keys, one position at a time"
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=past is None, enable_gqa=True)
        r = x + a.o_proj(o.transpose(1, 2).reshape(b, n, -1))
        return r + layer.mlp(layer.post_attention_layernorm(r)), (k, v)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Small random layer (std 0.02, output projections scaled down) and fc = [small random | identity]:
        at the start h = f, so the loss starts from the target's own (shifted) distribution, not from noise."""
        d = self.cfg.hidden_size
        for name, p in self.layers[0].named_parameters():
            if name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02 / (2 if name.split(".")[-2] in ("o_proj", "down_proj") else 1))
        self.fc.weight.zero_()
        self.fc.weight[:, :d].normal_(0.0, 0.02)
        self.fc.weight[:, d:].copy_(torch.eye(d))


def save_head(head: EagleHead, folder: Path, meta: dict, dtype=torch.bfloat16) -> None:
    """``model.safetensors`` + ``config.json`` + ``tabletune_head.json`` (meta), each written atomically."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    with fileio.atomic_path(folder / WEIGHTS_FILE) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    fileio.write_json(folder / "config.json", head.cfg.llama_config())
    fileio.write_json(folder / "tabletune_head.json", {"architecture": "eagle1", "head": asdict(head.cfg), **meta})


def save_random_head(target_cfg, folder: Path, dtype=torch.float32) -> EagleHead:
    """A freshly initialised head shaped for ``target_cfg`` (the target's ``ModelConfig``), saved in ``folder``:
    the untrained head of tests and quick runs (random, yet served losslessly)."""
    c = target_cfg
    head = EagleHead(HeadConfig(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                c.rope_theta, c.rms_norm_eps, c.vocab_size))
    head.reset_parameters()
    save_head(head, Path(folder), {}, dtype=dtype)
    return head


def load_head_state(folder: Path) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """The config and tensors of a saved head (vLLM names); ``InputError`` if the folder is not one."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path, weights = folder / "tabletune_head.json", folder / WEIGHTS_FILE
    for p in (meta_path, weights):
        if not p.exists():
            raise InputError(str(folder), p.name, str(p), "missing: not an EAGLE head folder")
    meta = json.loads(meta_path.read_text())
    if meta.get("architecture") != "eagle1":
        raise InputError(str(meta_path), "architecture", meta.get("architecture"), "expected 'eagle1'")
    return HeadConfig(**meta["head"]), load_file(str(weights))


def load_head(folder: Path) -> EagleHead:
    cfg, state = load_head_state(folder)
    head = EagleHead(cfg)
    head.load_state_dict({k: v.float() for k, v in state.items()})
    return head.eval()
