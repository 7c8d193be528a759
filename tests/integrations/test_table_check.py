"""The plugin's per-step checks without vLLM: drafts that exceed the table's k, and the by-context row."""

from __future__ import annotations

import logging

from tabletune.integrations.vllm.table_check import ContextRows, DraftCheck
from tabletune.table import ContextTable


def test_honoured_table_is_reported_after_enough_informative_steps():
    check = DraftCheck(k_max=4, stretch=8)
    for _ in range(7):
        check.observe(2, [2, 1, 0])  # n-gram may draft fewer, never more
    assert check.state() == {"table_honoured": None, "k_mismatch_steps": 0}
    check.observe(2, [2, 2])
    assert check.state() == {"table_honoured": True, "k_mismatch_steps": 0}


def test_table_k_max_steps_cannot_tell():
    check = DraftCheck(k_max=4, stretch=2)
    for _ in range(10):
        check.observe(4, [4, 4])
    assert check.state()["table_honoured"] is None


def test_a_stretch_of_mismatches_warns_once_loudly(caplog):
    check = DraftCheck(k_max=4, stretch=5, describe=lambda: "vLLM 9.9, V2 model runner")
    with caplog.at_level(logging.ERROR, logger="tabletune.controller"):
        for _ in range(4):
            check.observe(1, [4, 4])  # the runner drafts num_speculative_tokens whatever the table says
        check.observe(1, [1])  # the stretch breaks: no warning yet
        for _ in range(12):
            check.observe(1, [4, 3])
    assert check.state() == {"table_honoured": False, "k_mismatch_steps": 16}
    warnings = [r for r in caplog.records if "NOT HONOURED" in r.getMessage()]
    assert len(warnings) == 1 and "vLLM 9.9, V2 model runner" in warnings[0].getMessage()


def test_context_rows_pick_by_mean_or_max():
    table = ContextTable.from_json({"by_context": [
        {"max_context_len": 512, "num_speculative_tokens_per_batch_size": [[1, 4, 3]]},
        {"max_context_len": 2048, "num_speculative_tokens_per_batch_size": [[1, 4, 1]]}]})
    expand = lambda ranges: [0] + [ranges[0][2]] * 4  # noqa: E731 -- a dense lookup for b = 1..4
    rows = ContextRows(table, expand)
    assert rows.pick([100, 300, 1000]) == [0, 3, 3, 3, 3] and rows.row == 0  # mean 467
    assert rows.pick([5000]) == [0, 1, 1, 1, 1] and rows.row == 1  # beyond the last bound: the last row
    assert rows.pick([]) is None
    assert ContextRows(table, expand, "max").pick([100, 300, 1000]) == [0, 1, 1, 1, 1]


def test_a_step_that_honours_the_table_ends_the_stretch(caplog):
    """Mismatches that never run ``stretch`` steps in a row (n-gram's occasional full draft) are no verdict."""
    check = DraftCheck(k_max=4, stretch=5)
    with caplog.at_level(logging.ERROR, logger="tabletune.controller"):
        for _ in range(2):
            for _ in range(4):
                check.observe(1, [2])
            check.observe(1, [1, 0])  # honours k = 1: the stretch of 4 ends here
    assert check.state() == {"table_honoured": True, "k_mismatch_steps": 8}
    assert not [r for r in caplog.records if "NOT HONOURED" in r.getMessage()]
