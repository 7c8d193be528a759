"""The 2-D by-context table: rows by max_context_len, the last open-ended; bad files name the field."""

from __future__ import annotations

import json

import pytest

from tabletune.errors import InputError
from tabletune.table import ContextRow, ContextTable, DraftTable

OBJ = {"by_context": [
    {"max_context_len": 512, "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 2]]},
    {"max_context_len": 2048, "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 64, 1]]},
    {"max_context_len": 8192, "num_speculative_tokens_per_batch_size": [[1, 64, 1]]},
]}


def test_rows_and_open_ended_last_row():
    t = ContextTable.from_json(OBJ)
    assert t.row_index(1) == 0 and t.row_index(512) == 0 and t.row_index(513) == 1
    assert t.row_index(8192) == 2 and t.row_index(100_000) == 2
    assert t.table_for(700).k_for(2) == 3 and t.k_max == 4
    assert t.to_json() == OBJ


@pytest.mark.parametrize("obj, field", [
    ({"by_context": []}, "by_context"),
    ({"rows": []}, "by_context"),
    ({"by_context": [{"max_context_len": 0, "num_speculative_tokens_per_batch_size": [[1, 1, 1]]}]},
     "by_context[0].max_context_len"),
    ({"by_context": [OBJ["by_context"][1], OBJ["by_context"][0]]}, "by_context[1].max_context_len"),
    ({"by_context": [{"max_context_len": 5, "num_speculative_tokens_per_batch_size": [[2, 3, 1]]}]},
     "num_speculative_tokens_per_batch_size"),
])
def test_bad_files_name_the_field(tmp_path, obj, field):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(InputError) as err:
        ContextTable.load(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_rows_must_increase():
    with pytest.raises(ValueError):
        ContextTable((ContextRow(10, DraftTable.fixed(1)), ContextRow(10, DraftTable.fixed(2))))
