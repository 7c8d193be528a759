"""The SGLang writer against a fixture of SGLang's documented parsing rules
(``tests/fixtures/sglang_adaptive_rules.py``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletune.cli import main
from tabletune.errors import InputError
from tabletune.sglang_config import from_sglang, launch_flags, routed_step, to_sglang
from tabletune.table import DraftTable

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import sglang_adaptive_rules as sglang  # noqa: E402

TABLES = ([[1, 7, 3], [8, 8, 4], [9, 22, 3], [23, 160, 0]], [[1, 64, 3]], [[1, 2, 5], [3, 40, 2], [41, 256, 1]])


@pytest.mark.parametrize("ranges", TABLES)
def test_sglang_runs_the_tuned_k_at_every_batch_size(ranges):
    table = DraftTable.from_ranges(ranges)
    config = to_sglang(table)
    slots = sglang.load(json.dumps(config))
    initial = int(re.search(r"--speculative-num-steps (\d+)", launch_flags(config, "a.json")).group(1))
    steps = sglang.start_steps(slots, initial, strict=True)
    assert all(len(candidates) == 1 for candidates in slots.values())  # pinned: the EMA has nowhere to go
    for b in range(1, 2 * ranges[-1][1]):
        assert steps[sglang.route(slots, b)] == table.k_for(b) == routed_step(config, b), b
    assert from_sglang(config).extended_to(ranges[-1][1]) == table  # round trip (the last range open-ended)


def test_cuda_graph_padding_moves_a_range_start_to_the_next_graph_size():
    config = to_sglang(DraftTable.from_ranges([[1, 10, 3], [11, 64, 1]]))
    slots, graphs = sglang.load(json.dumps(config)), [1, 2, 4, 8, 16, 32, 64]
    for b in range(1, 65):
        assert config[str(sglang.route(slots, b, graphs))]["candidate_steps"][0] == routed_step(config, b, graphs)
    assert routed_step(config, 9, graphs) == 1  # 9 pads to 16, which the range from 11 covers


def test_first_releases_have_no_step_0():
    table = DraftTable.from_ranges([[1, 8, 3], [9, 32, 1], [33, 256, 0]])
    with pytest.raises(ValueError):
        sglang.load(json.dumps(to_sglang(table)), allow_step0=False)
    old = to_sglang(table, min_step=1)
    slots = sglang.load(json.dumps(old), allow_step0=False)
    assert slots == {1: [3], 9: [1]}  # k = 0 raised to 1 and joined with its neighbour


def test_bad_configs_name_the_key():
    for bad, field in (([1], "<file>"), ({"strategy": "ema"}, "<keys>"), ({"1": {"candidate_steps": [1, 3]}}, "1."),
                       ({"1": {"candidate_steps": [-1]}}, "1.")):
        with pytest.raises(InputError) as err:
            from_sglang(bad, "x.json")
        assert "x.json" in str(err.value) and field in str(err.value)


def test_table_cmd_writes_sglang_and_refuses_it_by_context(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("batch_size,k,step_ms\n" + "".join(f"{b},{k},{10 + b * (k + 1) * 0.5}\n"
                                                      for b in (1, 8, 64) for k in range(4)))
    out = tmp_path / "sglang.json"
    res = CliRunner().invoke(main, ["table", "--step-times", str(csv), "--acceptance", "0.9,0.8,0.7",
                                    "--format", "sglang", "--output", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    config = json.loads(out.read_text())
    assert config == json.loads(res.stdout) and sglang.load(out.read_text())
    bad = CliRunner().invoke(main, ["table", "--step-times", str(csv), "--acceptance", "0.9,0.8,0.7",
                                    "--format", "sglang", "--sglang-min-step", "2"])
    assert bad.exit_code == 2
