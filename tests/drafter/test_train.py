"""A tiny training run on the CPU through the CLI: a random 2-layer Llama target, a few steps."""

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from tabletune.cli import main  # noqa: E402
from tabletune.drafter.head import load_head  # noqa: E402


@pytest.fixture
def tiny_target(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                                   max_position_embeddings=128, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path / "tiny"
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def test_tiny_cpu_training_run_writes_a_loadable_head(tmp_path, tiny_target):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"eos_id": 2}] + [{"id": f"p{i}", "workload": "code" if i % 2 else "chat", "source": "test",
                                "ids": [5 + i, 7, 11 + i, 13]} for i in range(4)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["drafter", "train", "--prompts", str(prompts), "--target-dir", str(tiny_target),
                                       "--max-new-tokens", "6", "--gen-batch", "4", "--max-steps", "4",
                                       "--batch-tokens", "64", "--out", str(out)])
    assert result.exit_code == 0, result.output
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    data = next(r for r in log if r["event"] == "data")
    assert data["sequences"] == 8 and data["greedy"] == 4  # greedy + one sampled continuation per prompt
    assert next(r for r in log if r["event"] == "done")["steps"] == 4
    head = load_head(out / "head")
    assert head.cfg.hidden_size == 32 and head.cfg.vocab_size == 97


def test_train_refuses_a_prompts_file_without_header(tmp_path, tiny_target):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "x", "ids": [1, 2]}) + "\n")
    result = CliRunner().invoke(main, ["drafter", "train", "--prompts", str(prompts), "--target-dir", str(tiny_target),
                                       "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "eos_id" in result.output


def test_the_loss_falls_over_a_tiny_training_run(tmp_path, tiny_target):
    """The training loop learns: one batch holds every sequence, so the loss of the last step (in the "done"
    record) is on the same tokens as that of step 1, and it must have fallen well below it."""
    from tabletune.drafter.train import TrainConfig, train

    target = transformers.LlamaForCausalLM.from_pretrained(tiny_target)
    with torch.no_grad():  # a peaked next-token distribution (random init is near uniform: nothing to learn)
        target.lm_head.weight.mul_(40.0)
    records = [{"id": f"p{i}", "workload": "code" if i % 2 else "chat", "source": "test",
                "ids": [5 + i, 7, 11 + i, 13]} for i in range(4)]
    cfg = TrainConfig(prompts="", out=str(tmp_path / "o"), max_new_tokens=8, gen_batch=8, max_steps=12,
                      batch_tokens=1024, lr=1e-2, warmup_steps=1, val_fraction=0.0, train_budget_s=600.0)
    log: list[dict] = []
    train(target, records, 2, cfg, log.append)
    first = next(r for r in log if r["event"] == "step")
    done = next(r for r in log if r["event"] == "done")
    assert first["step"] == 1 and done["steps"] == 12 and done["epochs"] == 12  # one batch: an epoch a step
    assert done["loss"] < 0.7 * first["loss"], (first, done)
