"""Load HF safetensors (Llama / Qwen3 names) into a ``Decoder``, fusing qkv and gate_up."""

from __future__ import annotations

from pathlib import Path

import torch

from tabletune.errors import InputError


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputError(str(folder), "<weights>", str(folder), "no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def _get_put(t: dict[str, torch.Tensor], source: str):
    """(get(name): the tensor, else an InputError; put(param, value): copied in place after a shape check)."""
    def get(name: str) -> torch.Tensor:
        if name not in t:
            raise InputError(source, name, None, "missing tensor")
        return t[name]

    def put(param: torch.nn.Parameter, value: torch.Tensor) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise InputError(source, "<shape>", tuple(value.shape), f"expected {tuple(param.shape)}")
        param.data.copy_(value.to(param.dtype))
    return get, put


def load_hf_weights(model, folder: Path) -> None:
    t = _read_all(folder)
    if any(name.endswith("q_proj.bias") for name in t):
        raise InputError(str(folder), "q_proj.bias", True, "attention biases (Qwen2) are not supported")
    get, put = _get_put(t, str(folder))
    with torch.no_grad():
        put(model.embed, get("model.embed_tokens.weight"))
        put(model.final_norm, get("model.norm.weight"))
        if not model.cfg.tie_embeddings:
            put(model.lm_head, get("lm_head.weight"))
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            put(layer.in_norm, get(p + "input_layernorm.weight"))
            put(layer.post_norm, get(p + "post_attention_layernorm.weight"))
            qkv = [get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            put(layer.wqkv, torch.cat(qkv, 0))
            put(layer.wo, get(p + "self_attn.o_proj.weight"))
            if layer.q_norm is not None:
                put(layer.q_norm, get(p + "self_attn.q_norm.weight"))
                put(layer.k_norm, get(p + "self_attn.k_norm.weight"))
            if model.cfg.is_moe:
                raise InputError(str(folder), "num_experts", model.cfg.num_experts, "MoE weights load is not supported")
            put(layer.w_gate_up, torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], 0))
            put(layer.w_down, get(p + "mlp.down_proj.weight"))


def load_eagle_head(drafter, folder: str | Path) -> None:
    """A trained EAGLE-1 head (``integrations.hf.eagle_head``: vLLM's names) into an ``EagleDrafter(norms=False)``."""
    from tabletune.integrations.hf.eagle_head import load_head_state

    hc, t = load_head_state(Path(folder))
    cfg = drafter.target[0].cfg
    ours = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rope_theta)
    theirs = (hc.hidden_size, hc.num_heads, hc.num_kv_heads, hc.head_dim, hc.intermediate_size, hc.rope_theta)
    if ours != theirs or hc.vocab_size != cfg.vocab_size:
        raise InputError(str(folder), "head", theirs, f"does not fit the target's shape {ours}")
    if cfg.qk_norm:
        raise InputError(str(folder), "head", "eagle1", f"a Llama layer; the target {cfg.name} has qk-norm")
    put_eagle_state(drafter, t, str(folder))


def put_eagle_state(drafter, t: dict[str, torch.Tensor], source: str) -> None:
    """vLLM-named EAGLE-1 tensors ``t`` into an ``EagleDrafter(norms=False)``'s fused weights (qkv and gate_up
    concatenated), copied in place: captured CUDA graphs keep reading the same storage. The copies run on the
    current stream (``drafter.online`` publishes an updated head this way between two steps)."""
    layer, p = drafter.layer, "layers.0."
    get, put = _get_put(t, source)
    with torch.no_grad():
        for param, value in ((drafter.fc, get("fc.weight")),
                             (layer.wqkv, torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"], 0)),
                             (layer.wo, get(p + "self_attn.o_proj.weight")),
                             (layer.post_norm, get(p + "post_attention_layernorm.weight")),
                             (layer.w_gate_up, torch.cat([get(p + "mlp.gate_proj.weight"),
                                                          get(p + "mlp.up_proj.weight")], 0)),
                             (layer.w_down, get(p + "mlp.down_proj.weight"))):
            put(param, value)
