"""Reading per-token traces: committed files by request, the n-gram chain's runs, the replay's rates."""

import numpy as np

from tabletune.sim.replay import load_ngram_trace
from tabletune.token_trace import TokenTrace, leading_runs, load_token_traces, pair_traces, prompt_half, replay_rates


def test_committed_traces_load_and_pair():
    model = load_token_traces("profiles/traces/early-exit_code_T0.csv.gz")
    ngram = load_token_traces("profiles/traces/ngram_code_T0.csv.gz")
    pairs = pair_traces(model, ngram)
    assert len(pairs) == 8 and all(ng is not None for _, ng in pairs)
    first = ngram[0]  # HumanEval/0: rows at 1..11 then 13..20: run at 1 is 11, match length 2
    assert first.run[0] == 11 and first.match_len[0] == 2 and not first.present[11]
    assert model[0].signals.shape[1] == 3 and 0 < model[0].accepted.mean() < 1


def test_a_half_keeps_its_prompts_only():
    path = "profiles/traces/ngram_code_T0.csv.gz"
    halves = [load_token_traces(path, half=h) for h in ("calibration", "scoring")]
    assert sorted(t.request for h in halves for t in h) == sorted(t.request for t in load_token_traces(path))
    assert {prompt_half(t.request) for t in halves[0]} == {"calibration"}


def test_the_simulators_ngram_streams_are_the_bridged_traces_end_to_end():
    path = "profiles/traces/ngram_code_T0.csv.gz"
    traces = [t.bridged() for t in load_token_traces(path)]
    streams = load_ngram_trace(path)
    assert np.array_equal(streams.run, np.concatenate([t.run for t in traces]))
    assert np.array_equal(streams.accepted, np.concatenate([t.accepted for t in traces]))


def test_replay_rates_hand_worked():
    """Flags 1 1 0 1 (wrapping), k_max 3: runs from each start are 2, 1, 0, 3 (1, 1, 1 via the wrap):
    a_1 = 3/4, a_2 = #(>=2)/#(>=1) = 2/3, a_3 = 1/2."""
    t = TokenTrace("r", np.full((4, 3), 0.5, np.float32), np.array([1, 1, 0, 1], bool), np.ones(4, bool),
                   np.full(4, 3))
    assert leading_runs(t.accepted, 3).tolist() == [2, 1, 0, 3]
    assert np.allclose(replay_rates([t], 3), (3 / 4, 2 / 3, 1 / 2))
