"""What the tuner's timed vLLM requests look like: the workload's text, its context, full drafts.

* Text: each of the b timed requests carries its own prompt of the workload
  (``tabletune.tuner.workload.timing_rows``: a prompt of the set, preceded by others when shorter
  than the window), so n-gram drafting searches real text and no prefix is shared.
* Context: the steps of a request run at contexts prompt .. prompt + refresh, after which the
  batch restarts (``timing_window``); their mean is the grid's ``context_len``.
* Full drafts: T(b, k) is the time of a step in which every request verifies k draft tokens.
  On real text the n-gram proposer often finds no match and proposes fewer; ``FullDrafts`` lets
  it search (its real cost, on real text) and then pads each row's proposal to the step's k by
  repeating the row's last token. A padded token the target rejects is lossless like any
  rejected draft. It is on only while the grid is timed (``measure_step``), never while
  acceptance is measured or requests are served.

Imports no vllm at module level.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tabletune.tuner.budget import BatchCap, largest_batch
from tabletune.tuner.workload import byte_token_ids

REFRESH_TOKENS = 384  # the most tokens a timing batch generates before it restarts (bounds context drift)
MIN_REFRESH_TOKENS = 32


def timing_window(context_len: int) -> tuple[int, int]:
    """(prompt tokens, refresh tokens) of timing requests whose steps average ``context_len`` tokens of context.

    refresh = clamp(context_len, MIN_REFRESH_TOKENS, REFRESH_TOKENS), prompt = max(1, context_len - refresh // 2):
    a request's steps run at contexts prompt .. prompt + refresh, on average context_len.
    """
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    refresh = min(max(context_len, MIN_REFRESH_TOKENS), REFRESH_TOKENS)
    return max(1, context_len - refresh // 2), refresh


def pad_drafts(drafts: Sequence[Sequence[int]], sampled: Sequence[Sequence[int]], k: int) -> list[list[int]]:
    """Each row that sampled a token (its draft is due) gets exactly k draft tokens: its own proposal
    (cut to k), then its last proposed token, or its last sampled one, repeated. Other rows stay empty."""
    out = []
    for draft, got in zip(drafts, sampled):
        draft = list(draft)[:k]
        if got and k > 0:
            draft += [draft[-1] if draft else got[-1]] * (k - len(draft))
        out.append(draft)
    return out


class FullDrafts:
    """Wraps an n-gram proposer's ``propose``: while ``on``, every due row's draft is padded to the step's k."""

    def __init__(self, drafter) -> None:
        self.on = False
        self._propose = drafter.propose
        drafter.propose = self.propose

    def propose(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs):
        drafts = self._propose(num_speculative_tokens, sampled_token_ids, *args, **kwargs)
        return pad_drafts(drafts, sampled_token_ids, num_speculative_tokens) if self.on else drafts


def full_drafts(core, method: str) -> FullDrafts | None:
    """The padding hook on the engine core's n-gram proposer; None for a drafter that always proposes
    k tokens (a model) or one this hook cannot reach (e.g. vLLM's GPU n-gram proposer)."""
    if method != "ngram":
        return None
    try:
        drafter = core.model_executor.driver_worker.worker.model_runner.drafter
    except AttributeError:
        return None
    if type(drafter).__name__ != "NgramProposer":
        return None
    return FullDrafts(drafter)


def model_token_ids(model_path: str, skip_tokenizer_init: bool, texts: Sequence[str]) -> list[list[int]]:
    """The model's token ids of each text: its tokenizer, or, without one (dummy weights), the UTF-8 bytes
    mod its vocabulary (from its config.json)."""
    if skip_tokenizer_init:
        vocab = json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]
        return [byte_token_ids(t, vocab) for t in texts]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return [list(tok(t).input_ids) for t in texts]


def kv_batch_cap(have_tokens: int | None, max_batch_size: int, k_max: int, context_len: int, prompt_tokens: int,
                 refresh_tokens: int, block_size: int, shared_prompt: bool) -> BatchCap:
    """The largest batch b <= max_batch_size whose timing requests fit vLLM's KV cache of ``have_tokens``:

        need(b) = [shared] p + b * (refresh + 8 (k_max + 1) + block_size + [not shared] p) <= have

    b requests of p = ``prompt_tokens`` prompt tokens each decode up to refresh + 8 (k_max + 1) tokens
    (plus a partly filled block) before the batch restarts (``timing_requests.timing_window``); a prompt
    they share is cached once under prefix caching, else each request holds its own. ``have_tokens``
    None or 0: vLLM did not say, every batch size fits.
    """
    n = max_batch_size
    if not have_tokens:
        return BatchCap(context_len, n, n)
    shared = prompt_tokens if shared_prompt else 0
    per_request = refresh_tokens + 8 * (k_max + 1) + block_size + prompt_tokens - shared
    b = largest_batch(have_tokens, shared, per_request, n)
    numbers = (f"{n} requests need ~{shared + n * per_request} KV tokens but vLLM's cache holds {have_tokens}; "
               "give vLLM more KV memory with -- --gpu-memory-utilization ... (on CPU VLLM_CPU_KVCACHE_SPACE)"
               if b < n else "")
    return BatchCap(context_len, b, n, numbers)
