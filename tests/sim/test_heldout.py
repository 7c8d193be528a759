"""The held-out split of the traces: fit on the calibration half of the prompts, score on the other."""

import csv
import gzip
import io
from pathlib import Path

import pytest

from tabletune.policies.trace_fit import read_traces
from tabletune.sim.replay import load_ngram_trace, load_traces, prompt_half

TRACES = Path(__file__).resolve().parents[2] / "profiles" / "traces"


def prompts(path: Path) -> set[str]:
    return {r["request"] for r in csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode()))}


def test_no_prompt_is_in_both_halves_and_every_file_agrees():
    files = sorted(TRACES.glob("*.csv.gz"))
    assert len(files) >= 20
    seen: dict[str, str] = {}
    for path in files:
        names = prompts(path)
        halves = {n: prompt_half(n) for n in names}
        cal = {n for n, h in halves.items() if h == "calibration"}
        score = {n for n, h in halves.items() if h == "scoring"}
        assert cal and score and not cal & score and cal | score == names, path.name
        for n, h in halves.items():  # one prompt, one half, in every file (model and n-gram chains, T0 and T1)
            assert seen.setdefault(n, h) == h, (path.name, n)


def test_loaders_keep_only_their_half():
    model = TRACES / "early-exit_code_T0.csv.gz"
    whole, cal, score = (load_traces([model], half=h) for h in (None, "calibration", "scoring"))
    assert cal.num_rows + score.num_rows == whole.num_rows and 0 < cal.num_rows < whole.num_rows
    ngram = TRACES / "ngram_code_T0.csv.gz"
    parts = [load_ngram_trace(ngram, half=h).num_rows for h in ("calibration", "scoring")]
    assert sum(parts) == load_ngram_trace(ngram).num_rows and min(parts) > 0
    rows = [len(read_traces(model, half=h)["accepted"]) for h in (None, "calibration", "scoring")]
    assert rows[1] + rows[2] == rows[0] and rows[1] > 0
    with pytest.raises(ValueError, match="half"):
        load_traces([model], half="train")
