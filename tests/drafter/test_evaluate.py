"""``tabletune drafter eval``: the held-out table's arithmetic by hand, and the command on a tiny target and head."""

import json
import math
import string

import pytest

from tabletune.acceptance import AcceptanceCounts
from tabletune.drafter.evaluate import format_table, held_out_row
from tabletune.errors import InputError


def test_row_rates_and_tokens_per_step_by_hand():
    c = AcceptanceCounts(k_max=4)
    for size, m in ((4, 4), (4, 2), (4, 0), (4, 1)):
        c.observe_draft(size, m)
    row = held_out_row(c, "code", 0.0, 3, k=4)
    # reached 4, 3, 2, 1; accepted 3, 2, 1, 1 -> a = 3/4, 2/3, 1/2, 1
    assert row.rates == pytest.approx((0.75, 2 / 3, 0.5, 1.0))
    assert row.tokens_per_step == pytest.approx(1 + 0.75 + 0.5 + 0.25 + 0.25)  # = 1 + E[accepted] = 1 + 7/4
    table = format_table([row]).splitlines()
    assert table[0] == "| workload | T | prompts | drafts | a_1 | a_2 | a_3 | a_4 | tokens/step, k=4 |"
    assert table[2] == "| code | 0 | 3 | 4 | 0.750 | 0.667 | 0.500 | 1.000 | 2.75 |"


def test_unreached_positions_are_nan_and_k_is_checked():
    c = AcceptanceCounts(k_max=3)
    c.observe_draft(3, 0)
    row = held_out_row(c, "chat", 1.0, 1, k=1)
    assert row.a_1 == 0.0 and math.isnan(row.rates[1]) and row.tokens_per_step == 1.0
    with pytest.raises(InputError, match="k"):
        held_out_row(c, "chat", 1.0, 1, k=4)


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from click.testing import CliRunner  # noqa: E402

from tabletune.cli import main  # noqa: E402
from tabletune.integrations.hf.eagle_head import EagleHead, HeadConfig, save_head  # noqa: E402


@pytest.fixture
def tiny(tmp_path):
    """A random 2-layer Llama with a character tokenizer (97 tokens, SmolLM2's end-of-turn token) and a head."""
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"][:94]
    vocab = {t: i for i, t in enumerate(["<unk>", "<|im_end|>", "<|im_start|>"] + chars)}
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                                additional_special_tokens=["<|im_start|>"])
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                                   max_position_embeddings=4096, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    target = tmp_path / "target"
    transformers.LlamaForCausalLM(cfg).save_pretrained(target)
    fast.save_pretrained(target)
    head = EagleHead(HeadConfig.from_llama(cfg.to_dict()))
    head.reset_parameters()
    save_head(head, tmp_path / "head", {}, dtype=torch.float32)
    return target, tmp_path / "head"


def test_eval_prints_the_held_out_table_of_a_tiny_head(tiny, tmp_path):
    target, head = tiny
    out = tmp_path / "table.md"
    result = CliRunner().invoke(main, ["drafter", "eval", "--head", str(head), "--target-dir", str(target),
                                       "--workload", "chat", "--temperature", "0", "--k-max", "4", "--max-prompts",
                                       "2", "--max-new-tokens", "12", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("| workload | T | prompts | drafts | a_1 |")
    row = lines[2].split(" | ")
    assert row[:3] == ["| chat", "0", "2"] and int(row[3]) > 0 and 0.0 <= float(row[4]) <= 1.0
    assert lines[2] in out.read_text()


def test_eval_refuses_a_folder_that_is_not_a_head(tiny, tmp_path):
    target, _ = tiny
    result = CliRunner().invoke(main, ["drafter", "eval", "--head", str(tmp_path), "--target-dir", str(target)])
    assert result.exit_code == 2 and "tabletune_head.json" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_eval_refuses_a_trajectories_file_without_the_workload(tiny, tmp_path):
    _, head = tiny
    traj = tmp_path / "eval_trajectories.json"
    traj.write_text(json.dumps({"max_new_tokens": 8, "T0": {"code": []}}))
    result = CliRunner().invoke(main, ["drafter", "eval", "--head", str(head), "--workload", "chat", "--temperature",
                                       "0", "--trajectories", str(traj)])
    assert result.exit_code == 2 and "T0.chat" in result.output


def test_traces_split_by_prompt_into_two_halves():
    from tabletune.drafter.evaluate import split_by_prompt

    # token_trace.prompt_half: p0 and p1 calibrate, p2 and p3 score (sha256 of the name, its first byte's parity)
    rows = [("p0", 1, 1), ("p2", 1, 1), ("p0", 3, 1), ("p1", 1, 1), ("p2", 2, 2), ("p3", 5, 1)]
    calibration, scoring = split_by_prompt(rows)
    assert calibration == [("p0", 1, 1), ("p0", 3, 1), ("p1", 1, 1)]
    assert scoring == [("p2", 1, 1), ("p2", 2, 2), ("p3", 5, 1)]


def test_eval_scores_a_training_runs_trajectories(tiny, tmp_path):
    """Given continuations (``eval_trajectories.json``) are scored as they are: no prompt is generated or read."""
    target, head = tiny
    traj = tmp_path / "eval_trajectories.json"
    rows = [{"id": f"c{i}", "prompt": [5, 6 + i, 7], "output": [8 + i, 9, 10, 11, 12, 13]} for i in range(3)]
    traj.write_text(json.dumps({"max_new_tokens": 6, "T0": {"code": rows}, "T1": {"code": rows[:2]}}))
    result = CliRunner().invoke(main, ["drafter", "eval", "--head", str(head), "--target-dir", str(target),
                                       "--workload", "code", "--k-max", "3", "--k", "2", "--trajectories", str(traj)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("| tokens/step, k=2 |")
    assert [line.split(" | ")[:3] for line in lines[2:]] == [["| code", "0", "3"], ["| code", "1", "2"]]
