"""Verification of k drafted tokens against the target's k+1 next-token distributions.

Greedy (temperature 0): the target's argmax t_j at each of the k+1 verified
positions; m = the number of leading drafts with d_j == t_j; the step emits
t_0..t_m (the accepted drafts equal the target's tokens, t_m is the bonus or the
correction). Outputs are the non-speculative greedy outputs exactly.

Rejection sampling (temperature T > 0), lossless (Leviathan et al. 2023, Chen et
al. 2023): with target p_j and draft q_j,

* accept d_j with probability min(1, p_j(d_j) / q_j(d_j));
* at the first rejection j, emit a sample of norm(max(0, p_j - q_j));
* if all k are accepted, emit a bonus sample of p_k.

A drafter without probabilities (n-gram, replay) has q_j = one-hot(d_j).
Sampling uses the exponential race argmax(w / E), E ~ Exp(1), which samples
from w / sum(w) with no host sync and inside a CUDA graph.

The forced-rejection cap (``cap``, per row) lowers m to min(m, cap): when the
verification reaches position cap, that position ignores its draft and emits the
target's own token, t_cap under greedy and a fresh sample of p_cap otherwise (not
the residual: the draft there is never tested), so a capped step is as lossless
as an uncapped one.
"""

from __future__ import annotations

import torch


def sample(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of non-negative ``weights [..., V]``, with probability w / sum(w)."""
    e = torch.empty_like(weights).exponential_(generator=generator)
    return (weights / e).argmax(-1)


def num_accepted_greedy(drafts: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """m = leading matches of drafts [B, k] against target_tokens [B, k+1]."""
    k = drafts.shape[1]
    match = drafts == target_tokens[:, :k]
    return torch.cumprod(match.int(), dim=1).sum(1)


def verify(logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None, temperature: float,
           cap: torch.Tensor | None = None, generator: torch.Generator | None = None,
           index: torch.Tensor | None = None):
    """logits [B, k+1, V], drafts [B, k] -> (num_accepted m [B], tokens [B, k+1]); row b emits tokens[b, :m+1].
    ``index`` [B, k+1]: logits are packed [T, V] and row b's position j is logits[index[b, j]]."""
    b, k = drafts.shape
    k1 = k + 1
    if temperature == 0:
        target = logits.argmax(-1)
        target = target if index is None else target[index]
        m = num_accepted_greedy(drafts, target)
        if cap is not None:
            m = torch.minimum(m, cap)
        return m, target
    p = torch.softmax((logits if index is None else logits[index]).float() / temperature, dim=-1)
    # [B, k]
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    if draft_probs is None:
        q = torch.zeros_like(p[:, :k]).scatter_(-1, drafts[..., None], 1.0)
    else:
        q = draft_probs.float()
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(b, k, device=logits.device, generator=generator)
    accept = u * q_d < p_d  # u < p/q without dividing by zero
    m = torch.cumprod(accept.int(), dim=1).sum(1)
    residual = (p[:, :k] - q).clamp_min(0)
    # p == q leaves no residual; rejection then has probability 0, any fallback will do
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[:, :k])
    correction = torch.cat([sample(residual, generator), sample(p[:, k:], generator)], dim=1)
    pos = torch.arange(k1, device=logits.device)
    drafts_ext = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens = torch.where(pos < m[:, None], drafts_ext, correction)
    if cap is not None:
        fresh = sample(p, generator)
        # verification reached the cap: its draft is ignored and p_cap is sampled afresh
        forced = cap <= m
        m = torch.minimum(m, cap)
        tokens = torch.where(forced[:, None] & (pos == m[:, None]), fresh, tokens)
    return m, tokens
