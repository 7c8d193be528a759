import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.integrations.hf.ngram import NgramMatch, longest_match, propose


def test_longest_match_prefers_longer_n():
    tokens = np.array([1, 2, 3, 9, 2, 3, 7, 1, 2, 3])
    assert longest_match(tokens, 2, 3) == NgramMatch(n=3, start=0)
    assert propose(tokens, 2, 3, k=4)[0].tolist() == [9, 2, 3, 7]


def test_earliest_occurrence_of_the_longest_n():
    tokens = np.array([5, 6, 9, 5, 6, 8, 5, 6])
    draft, n = propose(tokens, 2, 4, k=2)
    assert (draft.tolist(), n) == ([9, 5], 2)


def test_draft_stops_at_the_end_of_the_context():
    tokens = np.array([1, 2, 3, 4, 1, 2, 3])
    assert propose(tokens, 2, 3, k=8)[0].tolist() == [4, 1, 2, 3]


def test_overlapping_match():
    assert propose(np.array([7, 7, 7, 7]), 2, 3, k=5)[0].tolist() == [7]


def test_no_match_and_short_context():
    assert propose(np.array([1, 2, 3, 4]), 1, 3, k=3)[1] == 0
    assert propose(np.array([1]), 2, 3, k=3)[0].size == 0
    assert propose(np.array([4, 1, 2, 4]), 1, 1, k=2)[0].tolist() == [1, 2]


def test_bad_parameters():
    with pytest.raises(ValueError, match="min_n"):
        propose(np.array([1, 2]), 3, 2, k=1)


def _brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        for s in range(0, len(tokens) - n):
            if tokens[s:s + n] == tokens[-n:]:
                return tokens[s + n: s + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(1, 3), st.integers(0, 3), st.integers(1, 6))
def test_matches_a_brute_force_search(tokens, min_n, extra, k):
    draft, _ = propose(np.array(tokens, dtype=np.int64), min_n, min_n + extra, k)
    assert draft.tolist() == _brute_force(tokens, min_n, min_n + extra, k)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 3), st.integers(0, 3), st.integers(1, 8))
def test_matches_vllm_ngram_proposer(tokens, min_n, extra, k):
    vllm_ngram = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    arr = np.array(tokens, dtype=np.int32)
    theirs = vllm_ngram._find_longest_matched_ngram_and_propose_tokens(arr, min_n, min_n + extra, 10_000, k)
    assert propose(arr, min_n, min_n + extra, k)[0].tolist() == theirs.tolist()
