"""Verification: greedy hand-worked steps, and the rejection sampler's output distribution (chi-square)."""

import pytest

torch = pytest.importorskip("torch")

from margins import binomial_margin  # noqa: E402
from scipy.stats import chi2  # noqa: E402

from tabletune.engine.verify import num_accepted_greedy, verify  # noqa: E402


def _logits_for(tokens, vocab=6):
    """Logits whose argmax at position j is tokens[j]."""
    out = torch.zeros(len(tokens), vocab)
    for j, t in enumerate(tokens):
        out[j, t] = 5.0
    return out


def test_greedy_hand_worked():
    # target argmax per verified position: [3, 1, 4, 1]; drafts [3, 1, 5] -> 2 accepted, then the correction 4
    logits = _logits_for([3, 1, 4, 1])[None]
    m, tokens = verify(logits, torch.tensor([[3, 1, 5]]), None, 0.0)
    assert m.tolist() == [2]
    assert tokens[0, : m[0] + 1].tolist() == [3, 1, 4]


def test_greedy_all_accepted_gets_bonus_and_first_miss_stops():
    logits = torch.stack([_logits_for([2, 2, 2]), _logits_for([0, 1, 2])])
    m, tokens = verify(logits, torch.tensor([[2, 2], [1, 1]]), None, 0.0)
    assert m.tolist() == [2, 0]
    assert tokens[0].tolist() == [2, 2, 2]  # two drafts + bonus
    assert tokens[1, :1].tolist() == [0]  # the target's own token at the first miss


def test_num_accepted_counts_leading_matches_only():
    target = torch.tensor([[1, 2, 3, 4]])
    assert num_accepted_greedy(torch.tensor([[1, 9, 3]]), target).tolist() == [1]
    assert num_accepted_greedy(torch.tensor([[9, 2, 3]]), target).tolist() == [0]


def test_forced_rejection_cap_emits_target_token_greedy():
    logits = _logits_for([3, 1, 4, 1])[None]
    m, tokens = verify(logits, torch.tensor([[3, 1, 4]]), None, 0.0, cap=torch.tensor([1]))
    assert m.tolist() == [1]
    assert tokens[0, :2].tolist() == [3, 1]  # the target's token at the capped position, not a draft's


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum().item()
    expected = probs * n
    stat = (((counts - expected) ** 2) / expected).sum().item()
    return chi2.sf(stat, df=len(probs) - 1)


@pytest.mark.parametrize("use_cap", [False, True])
def test_rejection_sampling_matches_target_distribution(use_cap):
    """First emitted token ~ p, whatever the draft distribution q (lossless), with and without a cap."""
    g = torch.Generator().manual_seed(0)
    n, vocab, temp = 40000, 5, 1.0
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    logits = torch.log(p).expand(n, 2, vocab).clone()  # position 0 and the bonus position share p
    drafts = torch.multinomial(q.expand(n, vocab), 1, replacement=True, generator=g)
    draft_probs = q.expand(n, 1, vocab)
    cap = torch.zeros(n, dtype=torch.long) if use_cap else None
    m, tokens = verify(logits, drafts, draft_probs, temp, cap=cap, generator=g)
    first = tokens[:, 0]
    counts = torch.bincount(first, minlength=vocab).float()
    assert _chi_square_p(counts, p) > 1e-3
    if not use_cap:
        # acceptance rate = sum_x min(p(x), q(x)) = 0.1 + 0.1 + 0.15 + 0.1 + 0.05, a share of n draws
        assert abs(m.float().mean().item() - 0.5) <= binomial_margin(0.5, n)
        # after an accepted draft the bonus token is also ~ p
        bonus = tokens[m == 1, 1]
        assert _chi_square_p(torch.bincount(bonus, minlength=vocab).float(), p) > 1e-3
    else:
        assert m.sum().item() == 0


def test_ngram_style_drafts_without_probabilities():
    """A deterministic draft (q one-hot) is accepted with probability p(draft)."""
    g = torch.Generator().manual_seed(1)
    n = 40000
    p = torch.tensor([0.7, 0.2, 0.1])
    logits = torch.log(p).expand(n, 2, 3).clone()
    m, tokens = verify(logits, torch.zeros(n, 1, dtype=torch.long), None, 1.0, generator=g)
    assert abs(m.float().mean().item() - 0.7) <= binomial_margin(0.7, n)
    rejected = tokens[m == 0, 0]
    # the correction comes from norm(max(0, p - onehot(0))) = [0, 2/3, 1/3]
    assert (rejected == 0).sum().item() == 0
    c = torch.bincount(rejected, minlength=3).float()[1:]
    assert _chi_square_p(c, torch.tensor([2 / 3, 1 / 3])) > 1e-3


def test_ragged_caps_keep_rejection_sampling_lossless():
    """T = 1, drafts of k = 3 from q, per-row k_i in {0, 1, 2, 3} as the cap (a ragged step padded to 3): every
    emitted position j's token (rows that reach j) follows p, and no row accepts more than its k_i."""
    g = torch.Generator().manual_seed(1)
    n, vocab, k = 60000, 5, 3
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    logits = torch.log(p).expand(n, k + 1, vocab).clone()
    drafts = torch.multinomial(q.expand(n, vocab), k, replacement=True, generator=g)
    ks = torch.randint(0, k + 1, (n,), generator=g)
    m, tokens = verify(logits, drafts, q.expand(n, k, vocab), 1.0, cap=ks, generator=g)
    assert (m <= ks).all() and (m[ks == 0] == 0).all()
    for j in range(3):
        reached = m >= j
        counts = torch.bincount(tokens[reached, j], minlength=vocab).float()
        assert _chi_square_p(counts, p) > 1e-3, j
    # a row of k_i = 1 accepts its draft with probability sum_x min(p, q) = 0.5
    assert abs(m[ks == 1].float().mean().item() - 0.5) <= binomial_margin(0.5, int((ks == 1).sum()))


def test_packed_logits_verify_as_their_padded_rows():
    """Rows of k_i + 1 packed logits (``index`` [B, k + 1]: each row's positions, clamped to its last) verify as
    the padded rows do: the same greedy result, and under T = 1 with caps k_i every emitted token follows p."""
    g = torch.Generator().manual_seed(2)
    n, vocab, k = 40000, 5, 3
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])
    ks = torch.randint(0, k + 1, (n,), generator=g)
    qoff = torch.cumsum(ks + 1, 0) - (ks + 1)
    index = qoff[:, None] + torch.minimum(torch.arange(k + 1)[None], ks[:, None])
    drafts = torch.multinomial(q.expand(n, vocab), k, replacement=True, generator=g)
    m, tokens = verify(torch.log(p).expand(int((ks + 1).sum()), vocab).clone(), drafts, q.expand(n, k, vocab), 1.0,
                       cap=ks, generator=g, index=index)
    assert (m <= ks).all()
    for j in range(3):
        counts = torch.bincount(tokens[m >= j, j], minlength=vocab).float()
        assert _chi_square_p(counts, p) > 1e-3, j
    logits = torch.randn(int((ks + 1).sum()), vocab, generator=g)
    greedy_drafts = logits[index][:, :k].argmax(-1)
    greedy_drafts[::3, 1] = (greedy_drafts[::3, 1] + 1) % vocab  # some rows reject at position 2
    packed = verify(logits, greedy_drafts, None, 0.0, cap=ks, index=index)
    padded = verify(logits[index], greedy_drafts, None, 0.0, cap=ks)
    assert torch.equal(packed[0], padded[0]) and torch.equal(packed[1], padded[1]) and packed[0].float().mean() > 1
