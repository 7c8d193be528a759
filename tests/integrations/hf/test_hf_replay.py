import numpy as np
import pytest
from margins import binomial_margin

from tabletune.integrations.hf.replay import Draft, by_generation_position, count, replay

REJECT_AT = {2, 7}


def propose_deterministic(i: int, k: int) -> Draft:
    accept = np.array([0.0 if t in REJECT_AT else 1.0 for t in range(i, i + k)])
    ones = np.ones(k)
    return Draft(accept_prob=accept, top1_prob=ones * 0.9, entropy=ones, margin=ones * 0.5, ngram_len=3)


def test_schedule_hand_worked():
    r = replay("req", num_tokens=10, k=4, propose=propose_deterministic, rng=np.random.default_rng(0))
    # token 0 comes from prefill; draft at 1: t1 accepted, t2 rejected -> next at 3; draft at 3: t3..t6
    # accepted -> bonus t7 (its rejection is never tested) -> next at 8; draft at 8 truncated to 2 tokens
    assert r.drafts == [(1, 4, 1), (3, 4, 4), (8, 2, 2)]
    assert [(row[1], row[2], row[3], row[-1]) for row in r.trace] == [
        (1, 1, 1, 1), (1, 2, 2, 0), (3, 1, 3, 1), (3, 2, 4, 1), (3, 3, 5, 1), (3, 4, 6, 1), (8, 1, 8, 1), (8, 2, 9, 1)]
    assert r.num_steps == 4
    c = count([r], k_max=4, workload="w")
    assert c.reached == [3, 3, 1, 1]
    assert c.accepted == [3, 2, 1, 1]
    assert c.drafted == [3, 3, 2, 2]
    assert r.summary()["num_accepted_tokens"] == 7 and r.summary()["num_draft_tokens"] == 10


def test_draft_straddling_the_end_is_verified_in_full_when_the_trajectory_allows():
    r = replay("req", 10, 4, propose_deterministic, np.random.default_rng(0), num_verifiable=12)
    assert r.drafts[-1] == (8, 4, 4)


def test_no_proposal_is_a_plain_decode_step():
    empty = Draft(np.empty(0), np.empty(0), np.empty(0), np.empty(0), 0)
    r = replay("req", 5, 4, lambda i, k: empty, np.random.default_rng(0))
    assert r.drafts == [] and r.trace == [] and r.num_steps == 5  # prefill + 4 decode steps
    assert r.summary()["acceptance_rate"] is None


def test_fractional_acceptance_is_sampled():
    half = Draft(np.full(1, 0.5), np.ones(1), np.ones(1), np.ones(1), 0)
    r = replay("req", 20000, 1, lambda i, k: half, np.random.default_rng(1))
    counts = count([r], 1)
    assert abs(counts.rates()[0] - 0.5) <= binomial_margin(0.5, counts.reached[0])


def test_by_generation_position_buckets():
    r = replay("req", 10, 4, propose_deterministic, np.random.default_rng(0))
    buckets = by_generation_position([r], 4, bucket_tokens=4)
    assert [(b["gen_start"], b["num_drafts"]) for b in buckets] == [(0, 2), (8, 1)]
    assert buckets[0]["accepted"] == [2, 1, 1, 1] and buckets[1]["rates"][:2] == [1.0, 1.0]


def test_accept_probability_given_the_output_is_exact():
    """Sampling y ~ p and accepting with min(1, q(y)/p(y)) reproduces speculative sampling:
    P(accept) = sum min(p, q), and P(y | accept) = min(p, q) / sum min(p, q)."""
    torch = pytest.importorskip("torch")
    from tabletune.integrations.hf.model import _position_scores

    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    target = torch.log(p).repeat(3, 1)
    draft = torch.log(q).repeat(3, 1)
    scores = _position_scores(target, draft, torch.tensor([0, 1, 2]), temperature=1.0)
    assert scores.accept_prob.tolist() == pytest.approx([0.4, 2 / 3, 1.0], rel=1e-5)
    assert float((p.numpy() * scores.accept_prob).sum()) == pytest.approx(float(torch.minimum(p, q).sum()))
    assert scores.top1_prob[0] == pytest.approx(0.6) and scores.margin[0] == pytest.approx(0.4)
    greedy = _position_scores(target, draft, torch.tensor([0, 1, 2]), temperature=0.0)
    assert greedy.accept_prob.tolist() == [0.0, 0.0, 1.0]  # the drafter's argmax is token 2
