"""Replay speculative decoding along a fixed target trajectory (numpy only, no model).

Why a fixed trajectory is exact. Speculative sampling (Leviathan et al. 2023; Chen et al. 2023)
drafts d ~ q and accepts with probability min(1, p(d)/q(d)); on rejection it samples from
norm(max(0, p - q)). Every output token is distributed as p given the output prefix, and every
drafter state at a *reached* position is conditioned on that same prefix (all earlier drafts
were accepted, so they are output tokens). Sampling the output y ~ p first and then the
acceptance event given y is the same joint law:

    P(accept | y_t = x) = q(x) min(1, p(x)/q(x)) / p(x) = min(1, q(x)/p(x)).

So one target trajectory per request serves every drafter, and acceptance needs only per-position
numbers along it:

* greedy (temperature 0): accept iff the drafted token equals y_t;
* a token-proposing drafter (n-gram, q one-hot on d) at any temperature: accept iff d == y_t;
* a model drafter at temperature T > 0: accept with probability min(1, q_t(y_t) / p_t(y_t)).

Schedule (as vLLM's): the prefill step emits output token 0 with no draft. A draft starts at output
index i >= 1, proposes up to k tokens (at most ``num_verifiable - i``: the trajectory's known
tokens), the first m are accepted, and the next draft starts at i + m + 1 (the target's
correction or bonus token). A drafter with no proposal costs a plain decode step: i += 1. The
request ends once i >= num_tokens; a draft that straddles the end is verified in full when the
trajectory extends past it (as vLLM verifies drafts beyond max_tokens or EOS), else truncated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tabletune.acceptance import AcceptanceCounts

TRACE_COLUMNS = ("request", "draft_start", "draft_pos", "gen_pos", "top1_prob", "entropy", "margin",
                 "ngram_len", "accept_prob", "accepted")


@dataclass(frozen=True)
class Draft:
    """One proposal: per drafted token, the probability that verification accepts it, and the
    drafter's features at that token (NaN where the drafter has none, e.g. n-gram probabilities)."""

    accept_prob: np.ndarray  # [k'] in [0, 1]
    top1_prob: np.ndarray  # [k']
    entropy: np.ndarray  # [k'] nats
    margin: np.ndarray  # [k'] top-1 minus top-2 probability
    ngram_len: int  # matched n-gram length at the draft start (0: none)


# (draft start i, max tokens k) -> Draft with 0..k tokens
ProposeFn = Callable[[int, int], Draft]


@dataclass
class RequestReplay:
    """Outcome of one request: per-draft (start, drafted, accepted) and the trace rows."""

    request: str
    num_tokens: int
    num_steps: int = 0  # target forward passes: prefill, one per draft, one per undrafted token
    drafts: list[tuple[int, int, int]] = field(default_factory=list)
    trace: list[tuple] = field(default_factory=list)

    def summary(self) -> dict:
        drafted = sum(k for _, k, _ in self.drafts)
        accepted = sum(m for _, _, m in self.drafts)
        return {
            "request": self.request, "num_tokens": self.num_tokens, "num_drafts": len(self.drafts),
            "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 6) if drafted else None,
            "mean_accepted_length": round(accepted / len(self.drafts), 6) if self.drafts else None,
            "tokens_per_step": round(self.num_tokens / self.num_steps, 6) if self.num_steps else None,
        }


def replay(request: str, num_tokens: int, k: int, propose: ProposeFn, rng: np.random.Generator,
           num_verifiable: int | None = None) -> RequestReplay:
    """Run the draft/verify schedule over ``num_tokens`` output tokens (see the module docstring);
    ``num_verifiable`` (default ``num_tokens``) is how many trajectory tokens drafts may be checked against."""
    limit = num_tokens if num_verifiable is None else max(num_verifiable, num_tokens)
    out = RequestReplay(request=request, num_tokens=num_tokens, num_steps=1 if num_tokens else 0)
    i = 1
    while i < num_tokens:
        out.num_steps += 1
        draft = propose(i, min(k, limit - i))
        size = len(draft.accept_prob)
        if size == 0:
            i += 1
            continue
        m = 0
        for j in range(size):
            p = float(draft.accept_prob[j])
            ok = p >= 1.0 or (p > 0.0 and rng.random() < p)
            out.trace.append((request, i, j + 1, i + j, float(draft.top1_prob[j]), float(draft.entropy[j]),
                              float(draft.margin[j]), draft.ngram_len, p, int(ok)))
            if not ok:
                break
            m += 1
        out.drafts.append((i, size, m))
        i += m + 1
    return out


def count(replays: list[RequestReplay], k_max: int, **labels: object) -> AcceptanceCounts:
    """Censored per-position counts over all drafts of all requests."""
    counts = AcceptanceCounts(k_max=k_max, **labels)  # type: ignore[arg-type]
    for r in replays:
        for _, size, m in r.drafts:
            counts.observe_draft(size, m)
    return counts


def by_generation_position(replays: list[RequestReplay], k_max: int, bucket_tokens: int) -> list[dict]:
    """Counts per bucket of draft-start index [b * bucket_tokens, (b + 1) * bucket_tokens): the drift
    of acceptance along the generation."""
    buckets: dict[int, AcceptanceCounts] = {}
    for r in replays:
        for start, size, m in r.drafts:
            b = start // bucket_tokens
            buckets.setdefault(b, AcceptanceCounts(k_max=k_max)).observe_draft(size, m)
    return [
        {"gen_start": b * bucket_tokens, "gen_end": (b + 1) * bucket_tokens, "num_drafts": c.num_drafts,
         "reached": c.reached, "accepted": c.accepted, "drafted": c.drafted,
         "rates": [None if x is None else round(x, 6) for x in c.rates()],
         "mean_accepted_length": round(c.mean_accepted_length(), 6)}
        for b, c in sorted(buckets.items())
    ]
