"""The grid's context from a prompt set, and the timing rows of real text (hand-worked)."""

from __future__ import annotations

import pytest

from tabletune.errors import InputError
from tabletune.tuner.workload import byte_token_ids, context_lens, quantile, timing_rows, workload_context_len

LENS = (120, 40, 100, 60)  # sorted: 40, 60, 100, 120


def test_quantile_interpolates_between_order_statistics():
    assert quantile(LENS, 0.5) == 80  # h = 1.5: 60 + 0.5 * (100 - 60)
    assert quantile(LENS, 0.9) == pytest.approx(114)  # h = 2.7: 100 + 0.7 * 20
    assert quantile(LENS, 0.0) == 40 and quantile(LENS, 1.0) == 120
    assert quantile((7,), 0.3) == 7


def test_the_default_context_is_the_median_prompt_plus_half_the_output():
    assert workload_context_len(LENS, 128) == 80 + 64
    assert workload_context_len(LENS, 129) == 80 + 64  # whole tokens: 129 // 2
    assert context_lens(None, LENS, 128) == (144,)
    assert context_lens("", LENS, 128) == (144,)


def test_context_lens_mix_quantiles_and_plain_lengths():
    # p90: 114 + 10 = 124; p50: 80 + 10 = 90; 90 given twice is one length
    assert context_lens("p90, 512,p50,90", LENS, 20) == (90, 124, 512)
    assert context_lens("2048", (), 20) == (2048,)  # no quantile: no prompts needed


@pytest.mark.parametrize("text, why", [("p50,x", "integer or a quantile"), ("0", ">= 1"), ("p101", "quantile"),
                                       (",", "give context lengths")])
def test_bad_context_lens_name_the_value(text, why):
    with pytest.raises(InputError, match=why):
        context_lens(text, LENS, 20)


def test_a_quantile_needs_prompts():
    with pytest.raises(InputError, match="needs prompts"):
        context_lens("p50", (), 20)


def test_timing_rows_end_with_a_whole_prompt_preceded_by_the_others():
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    assert timing_rows(prompts, 3, 4) == [
        [9, 1, 2, 3],  # prompt 0, preceded by the end of prompt 2 (cyclically)
        [2, 3, 4, 5],  # prompt 1, preceded by prompt 0
        [6, 7, 8, 9],  # prompt 2 fills the row
    ]
    assert timing_rows(prompts, 2, 2, offset=2) == [[8, 9], [2, 3]]  # longer prompts: their last tokens
    assert timing_rows(prompts, 1, 9) == [[4, 5, 6, 7, 8, 9, 1, 2, 3]]
    assert timing_rows([[], [5]], 2, 3) == [[5, 5, 5], [5, 5, 5]]  # empty prompts are skipped


def test_timing_rows_refuse_nothing_to_lay_out():
    with pytest.raises(ValueError):
        timing_rows([[]], 1, 4)
    with pytest.raises(ValueError):
        timing_rows([[1]], 1, 0)


def test_byte_token_ids_wrap_into_the_vocabulary():
    assert byte_token_ids("Aé", 128) == [65, 0xC3 % 128, 0xA9 % 128]
