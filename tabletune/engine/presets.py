"""Model shapes: a HF ``config.json`` (Llama / Qwen2 / Qwen3 / Qwen3-MoE) or a named preset.

The presets copy the public configs' shape fields (layers, widths, heads,
vocabulary, experts); with a preset the engine builds random bf16 weights,
which is all a step-time measurement needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tabletune import fileio
from tabletune.errors import InputError


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before RoPE
    tie_embeddings: bool = False
    num_experts: int = 0  # 0: dense MLP
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads {self.num_heads} not a multiple of num_kv_heads")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"{self.name}: num_experts_per_tok must be in 1..{self.num_experts}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def num_params(self, active_only: bool = False) -> int:
        """Parameters, embeddings included once (twice when untied)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        if self.is_moe:
            n_exp = self.num_experts_per_tok if active_only else self.num_experts
            mlp = n_exp * 3 * h * self.moe_intermediate_size + h * self.num_experts
        else:
            mlp = 3 * h * self.intermediate_size
        emb = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * (attn + mlp) + emb

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes


PRESETS: dict[str, ModelConfig] = {
    "qwen3-8b": ModelConfig("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, qk_norm=True),
    "qwen3-32b": ModelConfig("qwen3-32b", 151936, 5120, 25600, 64, 64, 8, 128, qk_norm=True),
    "llama-3.1-8b": ModelConfig("llama-3.1-8b", 128256, 4096, 14336, 32, 32, 8, 128, rope_theta=500_000.0,
                                rms_norm_eps=1e-5),
    "qwen3-30b-a3b": ModelConfig("qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, 128, qk_norm=True,
                                 num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "qwen3-0.6b": ModelConfig("qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, qk_norm=True, tie_embeddings=True),
    "smollm2-135m": ModelConfig("smollm2-135m", 49152, 576, 1536, 30, 9, 3, 64, rope_theta=100_000.0,
                                rms_norm_eps=1e-5, tie_embeddings=True),
    # a tiny shape for CPU tests
    "tiny": ModelConfig("tiny", 97, 64, 128, 2, 4, 2, 16, rope_theta=10_000.0, qk_norm=True),
    "tiny-moe": ModelConfig("tiny-moe", 97, 64, 128, 2, 4, 2, 16, rope_theta=10_000.0, qk_norm=True,
                            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
}


def config_from_hf(path: str | Path) -> ModelConfig:
    """Read a HF ``config.json`` (a file or the folder holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    d = fileio.read_json(p)
    if not isinstance(d, dict):
        raise InputError(str(p), "<root>", type(d).__name__, "must be an object")
    arch = " ".join(d.get("architectures") or [d.get("model_type", "")])
    if not any(a in arch.lower() for a in ("llama", "qwen")):
        raise InputError(str(p), "architectures", arch, "only Llama / Qwen2 / Qwen3 decoders are supported")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise InputError(str(p), "rope_parameters.rope_type", rope.get("rope_type"), "only default RoPE is supported")
    try:
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        return ModelConfig(
            name=str(d.get("_name_or_path") or p.parent.name),
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d.get("intermediate_size", 0)),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10_000.0))),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            qk_norm="qwen3" in arch.lower(),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            num_experts=int(d.get("num_experts", 0)),
            num_experts_per_tok=int(d.get("num_experts_per_tok", 0)),
            moe_intermediate_size=int(d.get("moe_intermediate_size", 0)),
        )
    except KeyError as exc:
        raise InputError(str(p), str(exc.args[0]), None, "missing field") from None


def resolve(model: str) -> ModelConfig:
    """A preset name, or a folder / config.json path."""
    if model in PRESETS:
        return PRESETS[model]
    if Path(model).exists():
        return config_from_hf(model)
    raise InputError("--model", "model", model, f"unknown preset; choose one of {sorted(PRESETS)}")


def replace(cfg: ModelConfig, **changes: object) -> ModelConfig:
    return dataclasses.replace(cfg, **changes)
