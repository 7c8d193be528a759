import gzip

import numpy as np
import pytest

from tabletune.errors import InputError
from tabletune.policies.disco_model import train_disco
from tabletune.policies.trace_fit import fit_ngram_table, read_traces, trace_rows


def test_trace_files_train_disco_and_the_ngram_table(tmp_path):
    rows = ["request,draft_start,draft_pos,gen_pos,top1_prob,entropy,margin,ngram_len,accept_prob,accepted"]
    rng = np.random.default_rng(0)
    for i in range(400):  # model drafter: accepted iff confident
        p = rng.uniform(0.05, 0.99)
        rows.append(f"r{i},0,{1 + i % 4},{i},{p:.3f},{-np.log(p):.3f},{p / 2:.3f},0,{p:.3f},{int(p > 0.5)}")
    for i in range(200):  # n-gram drafter (no probabilities): long matches accepted
        length = 2 + i % 10
        rows.append(f"n{i},0,1,{i},nan,nan,nan,{length},1,{int(length >= 6)}")
    path = tmp_path / "traces.csv.gz"
    path.write_bytes(gzip.compress("\n".join(rows).encode()))
    cols = read_traces(tmp_path)
    x, y = trace_rows(cols)
    assert x.shape == (400, 4)
    model = train_disco(x, y)
    assert model.accept_prob(np.array([[0.9, 0.1, 0.45, 1.0]]))[0] > 0.5 > model.accept_prob(
        np.array([[0.1, 2.3, 0.05, 1.0]]))[0]
    table = fit_ngram_table(cols, k_max=4)
    assert table.rates[9, 0] > 0.8 and table.rates[3, 0] < 0.2
    bad = tmp_path / "bad.csv"
    bad.write_text("draft_pos,accepted\n1,1\n")
    with pytest.raises(InputError, match="missing columns"):
        read_traces(bad)
