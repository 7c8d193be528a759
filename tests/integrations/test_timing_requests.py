"""The vLLM tuner's timed requests: their context window and the n-gram drafts padded to k (no vLLM needed)."""

from __future__ import annotations

import pytest

from tabletune.integrations.vllm.timing_requests import FullDrafts, pad_drafts, timing_window


def test_the_window_averages_the_context():
    assert timing_window(300) == (150, 300)  # contexts 150 .. 450, mean 300
    assert timing_window(2048) == (2048 - 192, 384)  # refresh capped at 384
    assert timing_window(20) == (4, 32)  # refresh at least 32
    assert timing_window(1) == (1, 32)
    with pytest.raises(ValueError):
        timing_window(0)


def test_pad_drafts_fills_each_due_row_to_k():
    drafts = [[7], [], [1, 2, 3, 4], []]
    sampled = [[5], [9, 8], [3], []]  # the last row sampled nothing: no draft is due
    assert pad_drafts(drafts, sampled, 3) == [[7, 7, 7], [8, 8, 8], [1, 2, 3], []]
    assert pad_drafts(drafts, sampled, 0) == [[], [], [], []]


class _Proposer:
    def propose(self, k, sampled, *rest, **kw):
        return [[] for _ in sampled]


def test_full_drafts_pad_only_while_on():
    proposer = _Proposer()
    hook = FullDrafts(proposer)
    assert proposer.propose(2, [[4], [6]], None) == [[], []]
    hook.on = True
    assert proposer.propose(2, [[4], [6]], None, slot_mappings=None) == [[4, 4], [6, 6]]


def test_a_model_without_tokenizer_takes_the_bytes_mod_its_vocabulary(tmp_path):
    from tabletune.integrations.vllm.timing_requests import model_token_ids

    (tmp_path / "config.json").write_text('{"vocab_size": 100}')
    assert model_token_ids(str(tmp_path), True, ["ab", "é"]) == [[97, 98], [0xC3 % 100, 0xA9 % 100]]
