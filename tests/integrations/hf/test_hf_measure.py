import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.errors import InputError
from tabletune.integrations.hf import measure
from tabletune.integrations.hf.measure import AcceptanceRun, detail_path, write_trace
from tabletune.integrations.hf.replay import TRACE_COLUMNS


@pytest.mark.parametrize("field,value", [("drafter", "eagle"), ("workload", "poetry"), ("temperature", -1.0),
                                         ("k_max", 0), ("num_prompts", 0), ("ngram_min", 0)])
def test_run_validation(field, value):
    kwargs = {"drafter": "ngram", "workload": "code", "temperature": 0.0, field: value}
    with pytest.raises(InputError, match=field.split("_")[0]):
        AcceptanceRun(**kwargs)


def test_bad_cli_input_exits_2_without_output(tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["acceptance", "--drafter", "ngram", "--workload", "code", "--k-max", "0",
                                       "--out", str(out)])
    assert result.exit_code == 2
    assert "k_max" in result.output and not out.exists()


def test_detail_path():
    assert detail_path("a/ngram_code_T0.json").as_posix() == "a/ngram_code_T0.detail.json"


def test_trace_file_is_what_trace_fit_reads(tmp_path):
    from tabletune.policies.trace_fit import read_traces

    rows = [("HumanEval/0/rename", 1, 1, 1, 0.9, 0.5, 0.8, 3, 1.0, 1),
            ("HumanEval/0/rename", 1, 2, 2, float("nan"), float("nan"), float("nan"), 3, 0.0, 0)]
    path = tmp_path / "t.csv.gz"
    write_trace(path, rows)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert lines[0] == ",".join(TRACE_COLUMNS) and lines[2].endswith(",,,3,0,0")
    cols = read_traces(path)
    assert cols["accepted"].tolist() == [1.0, 0.0] and np.isnan(cols["top1_prob"][1])


def test_cached_trajectories_are_cut_from_a_superset(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "cache_dir", lambda: tmp_path)
    folder = tmp_path / "trajectories"
    folder.mkdir()
    data = {"max_new_tokens": 4, "trajectories": [{"id": f"mtbench/{i}", "prompt": [1], "output": [5, 6, 7, 8]}
                                                  for i in (111, 112, 113)]}
    (folder / "math_T0_seed0_n3_len4.json").write_text(json.dumps(data))
    run = AcceptanceRun(drafter="ngram", workload="math", temperature=0.0, num_prompts=2, max_new_tokens=2)
    monkeypatch.setattr(measure, "load_prompts", lambda name, limit: [type("P", (), {"id": f"mtbench/{i}"})()
                                                                      for i in (111, 112)][:limit])
    got = measure.trajectories(run, runner=None)
    assert [(t.id, t.output) for t in got] == [("mtbench/111", [5, 6]), ("mtbench/112", [5, 6])]
