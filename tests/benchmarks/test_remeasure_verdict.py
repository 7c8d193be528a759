"""The re-measure's noise, said plainly: a ratio within the rounds' spread is a tie (benchmarks/remeasure_vllm.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import remeasure_vllm as rm  # noqa: E402


def test_spread_of_rounds():
    s = rm.spread_of([90.0, 110.0, 100.0])
    assert (s.low, s.median, s.high) == (90.0, 100.0, 110.0)
    assert s.relative == pytest.approx(0.2)  # (110 - 90) / 100


def test_a_ratio_within_the_larger_spread_is_a_tie():
    tight, loose = rm.spread_of([99.0, 100.0, 101.0]), rm.spread_of([95.0, 100.0, 105.0])  # 2% and 10%
    assert rm.verdict(0.95, tight) == "loss"  # 5% below, spread 2%
    assert rm.verdict(0.95, tight, loose) == "tie"  # within the larger, 10%
    assert rm.verdict(1.05, tight) == "win"
    assert rm.verdict(1.015, tight) == "tie"  # |1.015 - 1| <= 0.02
    assert rm.verdict(0.899, loose) == "loss"


def rows(load, by_config):
    return [{"load": load, "config": name, "round": i, "throughput_tok_s": v, "output_tokens": round(v), "wall_s": 1.0}
            for name, values in by_config.items() for i, v in enumerate(values)]


def test_comparison_names_the_best_fixed_k_and_the_verdict():
    data = rows(4, {"k=0": [100, 101, 99], "k=1": [120, 118, 122], "tuned": [110, 111, 109]}) + \
        rows(16, {"k=0": [100, 90, 110], "k=1": [95, 96, 94], "tuned": [97, 99, 98]})
    lines = rm.comparison(data, pooled=False).splitlines()
    # load 4: best k=1 (120), tuned 110 -> 91.7%, spreads 3.3% and 1.8%: a loss
    assert lines[4] == "| 4 | 2.0% | 3.3% | 1.8% | k=1 | 91.7% | loss |"
    # load 16: best k=0 (median 100, spread 20%), tuned 98: a tie
    assert lines[5] == "| 16 | 20.0% | 2.1% | 2.0% | k=0 | 98.0% | tie |"


def test_paired_rounds_show_the_per_round_ratio_range():
    data = rows(4, {"k=0": [100, 200, 150], "tuned": [90, 210, 150]})
    line = rm.comparison(data, pooled=True).splitlines()[4]
    assert line.endswith("| k=0 | 100.0% | tie | 90.0% - 105.0% |")  # pooled 450 / 450; rounds 0.9, 1.05, 1.0


def test_documented_table_is_cut_to_the_engines_k_max_and_static_configs_are_not_fixed_k():
    from tabletune.table import DraftTable

    lookups = rm.configs(DraftTable(((1, 256, 3),)), k_max=4, max_num_seqs=256, documented=True)
    assert list(lookups) == ["k=0", "k=1", "k=2", "k=3", "k=4", "documented", "tuned"]
    doc = lookups["documented"]
    assert (doc[1], doc[16], doc[17], doc[33], doc[65], doc[129]) == (4, 4, 4, 3, 1, 0)  # k 5 cut to 4
    rows = [dict(load=8, config=c, round=0, throughput_tok_s=t, output_tokens=t, wall_s=1.0)
            for c, t in (("k=0", 100.0), ("k=1", 150.0), ("tuned", 140.0), ("static k=1", 200.0))]
    md = rm.summarise(rows, "controlled", "[[1, 256, 1]]")
    assert "| 8 | 100.0 | 150.0 | 140.0 | 200.0 | 93.3% | 140.0% | 70.0% |" in md  # best fixed is k=1, not static


def test_steady_state_starts_after_the_first_wave_and_load_one_spans_several_requests():
    from types import SimpleNamespace

    class Loop:  # the engine at the edge: one request of the first wave finishes every 10 steps
        def __init__(self):
            self.steps = 0

        def run(self, n):
            before, self.steps = self.steps, self.steps + n
            return SimpleNamespace(finished=self.steps // 10 - before // 10)

    loop = Loop()
    assert rm.past_first_wave(loop, load=4) == 40  # the 4th request ends at step 40
    args = SimpleNamespace(steps=32, steady=True)
    assert [rm.segment_steps(args, load) for load in (1, 4, 16, 64)] == [256, 128, 64, 32]
    assert rm.segment_steps(SimpleNamespace(steps=32, steady=False), 1) == 64


def test_prediction_with_prefill_by_hand():
    pred = rm.Prediction({4: {"k=0": 200.0, "k=2": 400.0}}, {4: {"k=0": 1.0, "k=2": 2.0}}, "by hand")
    # k=0: 100 tokens in (99 + 1) / 200 s + 0.25 s = 0.75 s; k=2: (99 + 2) / 400 + 0.25 = 0.5025 s
    assert pred.served_tok_s(4, "k=0", 100, 250.0) == pytest.approx(100 / 0.75)
    assert pred.served_tok_s(4, "k=2", 100, 250.0) == pytest.approx(100 / 0.5025)
    assert pred.served_tok_s(4, "k=2", 100, None) == 400.0  # no prefill measured: decode-only


def test_prefill_comes_from_the_rows_and_an_old_csv_has_none():
    data = rows(4, {"k=0": [100, 110], "tuned": [120, 99]})
    assert rm.prefill_of(data, 4) is None  # no prefill_ms column
    for r in data:
        r["prefill_ms"] = "276.4"
    assert rm.prefill_of(data, 4) == pytest.approx(276.4)
    assert rm.round_ratios(data, 4, "tuned") == pytest.approx([1.2, 0.9])  # per round, over that round's k=0
