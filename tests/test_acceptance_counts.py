import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile, load_rates, parse_rates
from tabletune.errors import InputError


def test_censored_counts_hand_worked():
    c = AcceptanceCounts(k_max=4)
    c.observe_draft(4, 1)  # reached 1,2 ; accepted 1
    c.observe_draft(4, 4)  # reached 1..4 ; accepted 1..4
    c.observe_draft(2, 0)  # reached 1 ; accepted none
    assert c.reached == [3, 2, 1, 1]
    assert c.accepted == [2, 1, 1, 1]
    assert c.drafted == [3, 3, 2, 2]
    assert c.rates() == [pytest.approx(2 / 3), 0.5, 1.0, 1.0]
    # vLLM's per-position ratio is a survival estimate, not a_j
    assert c.survival() == [pytest.approx(2 / 3), pytest.approx(1 / 3), 0.5, 0.5]
    assert c.mean_accepted_length() == pytest.approx(5 / 3)


def test_unreached_position_has_no_rate():
    c = AcceptanceCounts(k_max=3)
    c.observe_draft(1, 1)
    assert c.rates() == [1.0, None, None]
    assert c.known_rates() == [1.0]


@given(st.lists(st.integers(0, 5), min_size=1, max_size=200), st.integers(1, 5))
def test_from_vllm_counts_exact_for_constant_k(ms, k):
    direct = AcceptanceCounts(k_max=k)
    for m in ms:
        direct.observe_draft(k, min(m, k))
    converted = AcceptanceCounts.from_vllm_counts(direct.num_drafts, direct.drafted, direct.accepted)
    assert converted.reached == direct.reached
    assert converted.rates() == direct.rates()


def test_profile_json_roundtrip(tmp_path):
    c = AcceptanceCounts(k_max=3, workload="code", temperature=0.0, drafter="ngram")
    for m in (0, 1, 2, 3, 3):
        c.observe_draft(3, m)
    p = AcceptanceProfile([c], model="tiny")
    path = tmp_path / "a.json"
    p.save(path)
    q = AcceptanceProfile.load(path)
    assert q.entries[0].reached == c.reached and q.entries[0].accepted == c.accepted
    assert load_rates(str(path)) == pytest.approx([4 / 5, 3 / 4, 2 / 3])


def test_profile_rejects_accepted_above_reached(tmp_path):
    bad = {"schema": "tabletune.acceptance_profile", "version": 1,
           "entries": [{"k_max": 2, "reached": [3, 1], "accepted": [2, 2], "drafted": [3, 3]}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"bad.json: field 'entries\[0\].accepted\[1\]'"):
        AcceptanceProfile.load(path)


def test_profile_rejects_unknown_version(tmp_path):
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"schema": "tabletune.acceptance_profile", "version": 99, "entries": []}))
    with pytest.raises(InputError, match="'version' = 99"):
        AcceptanceProfile.load(path)


@pytest.mark.parametrize("text", ["0.5,1.2", "0,0.5", "-0.1", "nan", "0.5,abc", ""])
def test_parse_rates_rejects(text):
    with pytest.raises(InputError):
        parse_rates(text)


def test_parse_rates_ok():
    assert parse_rates("0.9, 0.8,1") == [0.9, 0.8, 1.0]


@given(st.binary(max_size=300))
def test_acceptance_file_parser_never_crashes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fuzz") / "a.json"
    p.write_bytes(data)
    try:
        AcceptanceProfile.load(p)
    except InputError:
        pass


def test_draft_rate_counts_undrafted_request_steps(tmp_path):
    c = AcceptanceCounts(k_max=2, drafter="ngram")
    assert c.draft_rate == 1.0  # nothing counted: drafting always
    c.observe_draft(2, 1)
    c.observe_undrafted(3)  # three request-steps where the n-gram drafter found no match
    assert c.undrafted == 3 and c.draft_rate == pytest.approx(1 / 4)
    path = tmp_path / "a.json"
    AcceptanceProfile([c]).save(path)
    assert json.loads(path.read_text())["entries"][0]["draft_rate"] == 0.25
    assert AcceptanceProfile.load(path).entries[0].draft_rate == pytest.approx(0.25)
    bad = json.loads(path.read_text())
    bad["entries"][0]["undrafted"] = -1
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"field 'entries\[0\].undrafted' = -1"):
        AcceptanceProfile.load(path)


def test_observe_drafts_counts_as_observe_draft_one_by_one():
    """The batch form (the engine's scheduler counts a step's rows at once) equals the loop, k = 0 rows, m > k and
    k > k_max included."""
    import random

    import numpy as np

    rng = random.Random(0)
    for _ in range(200):
        k_max = rng.randint(1, 8)
        ks = [rng.randint(0, k_max + 2) for _ in range(rng.randint(0, 20))]
        ms = [rng.randint(0, k + 1) for k in ks]
        one, batch = AcceptanceCounts(k_max), AcceptanceCounts(k_max)
        for k, m in zip(ks, ms):
            one.observe_draft(k, m)
        batch.observe_drafts(np.array(ks, np.int64), np.array(ms, np.int64))
        assert (one.num_drafts, one.drafted, one.reached, one.accepted) == \
            (batch.num_drafts, batch.drafted, batch.reached, batch.accepted), (ks, ms)
