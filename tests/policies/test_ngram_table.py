import json

import numpy as np
import pytest
from per_request_helpers import STARTER_8B

from tabletune.errors import InputError
from tabletune.fileio import write_json
from tabletune.policies.ngram_table import NgramTable


def test_table_from_length_rates_extends_the_match_per_accepted_token():
    table = NgramTable.from_length_rates([0.0, 0.1, 0.1, 0.5, 0.7], k_max=3)
    assert table.rates[0].tolist() == [0, 0, 0]
    assert table.rates[1].tolist() == pytest.approx([0.1, 0.1, 0.5])  # r[1], r[2], r[3]
    assert table.rates[3].tolist() == pytest.approx([0.5, 0.7, 0.7])  # r[3], r[4], r[4] (capped)
    surv = table.survival(np.array([3, 0]), np.array([2, 3]), 3)
    np.testing.assert_allclose(surv, [[0.5, 0.35, 0.0], [0.0, 0.0, 0.0]])


def test_table_fit_moves_from_prior_to_data():
    prior = NgramTable.from_length_rates([0.0, 0.5, 0.5], k_max=2)
    fitted = NgramTable.fit(np.full(20, 2), np.ones(20), np.ones(20), prior, prior_weight=20.0)
    assert fitted.rates[2, 0] == pytest.approx((20 + 20 * 0.5) / 40)  # 0.75
    assert fitted.rates[2, 1] == pytest.approx(0.5)  # untouched cell keeps the prior


def test_table_file_round_trip_and_errors(tmp_path):
    table = NgramTable.from_length_rates([0.0, 0.1, 0.5, 0.9], k_max=2)
    path = tmp_path / "ngram.json"
    write_json(path, table.to_json())
    again = NgramTable.load(path)
    np.testing.assert_allclose(again.rates, table.rates)
    # a 2-position table serves k_max = 4 by repeating its last column
    assert again.survival(np.array([3]), np.array([4]), 4).shape == (1, 4)
    path.write_text(json.dumps({"schema": "tabletune.ngram_table", "version": 1, "rates": [[0.5, 1.5]]}))
    with pytest.raises(InputError, match="rates"):
        NgramTable.load(path)


def test_committed_trace_table_is_a_valid_rate_table():
    table = NgramTable.load(STARTER_8B.parents[2] / "profiles" / "policies" / "ngram-table-smollm2-mtbench.json")
    assert table.rates.shape[1] == 8 and (table.rates[0] == 0).all()
    assert ((table.rates >= 0) & (table.rates <= 1)).all()
