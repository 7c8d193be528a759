"""Dummy-weight model presets and dummy flags: the config vLLM reads, token-id prompts without a tokenizer."""

import json

import pytest

from tabletune.integrations.vllm import presets
from tabletune.integrations.vllm.timing_requests import model_token_ids


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TABLETUNE_CACHE", str(tmp_path))


@pytest.mark.parametrize("name, layers, hidden, params_b", [("qwen3-8b", 36, 4096, 8.19), ("qwen3-0.6b", 28, 1024, 0.60),
                                                              ("qwen3-32b", 64, 5120, 32.76)])
def test_qwen3_shapes_match_the_public_configs(name, layers, hidden, params_b):
    preset = presets.resolve_model(name)
    assert preset.load_format == "dummy" and preset.skip_tokenizer_init
    cfg = json.loads((presets.dummy_model_dir(name) / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (layers, hidden, 151936)
    h, i, v, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    attn = h * d * (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) + cfg["num_attention_heads"] * d * h
    params = layers * (attn + 3 * h * i) + v * h * (1 if cfg["tie_word_embeddings"] else 2)
    assert params / 1e9 == pytest.approx(params_b, abs=0.01)


def test_transformers_reads_the_qwen3_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(presets.dummy_model_dir("qwen3-8b"))
    assert cfg.model_type == "qwen3" and cfg.num_key_value_heads == 8


def test_dummy_flags_make_a_users_folder_take_token_id_prompts(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    assert not presets.resolve_model(str(folder)).skip_tokenizer_init
    for flags in (("--load-format", "dummy"), ("--load-format=dummy",), ("--skip-tokenizer-init",)):
        preset = presets.resolve_model(str(folder), flags)
        assert preset.skip_tokenizer_init and preset.load_format == "dummy"
    assert not presets.resolve_model(str(folder), ("--load-format", "auto")).skip_tokenizer_init
    ids = model_token_ids(str(folder), True, ["def f():"])  # no tokenizer is loaded
    assert ids == [list(b"def f():")]


def test_a_dummy_draft_model_preset_resolves_to_its_folder():
    presets.check_method("draft_model", 7, "qwen3-0.6b")
    config = presets.speculative_config("draft_model", 7, "qwen3-0.6b", [[1, 256, 3]])
    assert config["model"] == str(presets.dummy_model_dir("qwen3-0.6b"))


def test_the_written_config_names_a_dummy_draft_preset_not_its_cache_folder():
    from tabletune.integrations.vllm import tuner_engine
    from tabletune.tuner import EngineSpec

    spec = EngineSpec(model="qwen3-8b", method="draft_model", k_max=7, max_batch_size=256, draft_model="qwen3-0.6b")
    assert tuner_engine.speculative_config(spec, [[1, 256, 2]])["model"] == "qwen3-0.6b"
