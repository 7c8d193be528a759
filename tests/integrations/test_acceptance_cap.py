"""The acceptance cap on vLLM's rejection-sampler output (no engine: tensors by hand)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from margins import binomial_margin  # noqa: E402

from tabletune.integrations.vllm import acceptance_cap  # noqa: E402
from tabletune.integrations.vllm.acceptance_cap import cap_output  # noqa: E402

P = -1  # vLLM's PLACEHOLDER_TOKEN_ID


def test_rate_one_changes_nothing():
    out = torch.tensor([[11, 12, 13], [21, P, P]], dtype=torch.int32)
    cap_output(out, [2, 2], [1.0, 1.0])
    assert out.tolist() == [[11, 12, 13], [21, P, P]]


def test_forced_rejection_keeps_prefix_and_target_token():
    # rates (1, tiny): position 2 is always rejected. Row 0 accepted both drafts (11, 12) plus
    # bonus 13: keep 1 accepted draft + the target's token at position 2 (12 under greedy).
    # Row 1 was already rejected at position 1 by vLLM: untouched. Row 2 drafted only 1 token.
    out = torch.tensor([[11, 12, 13], [21, P, P], [31, 32, P]], dtype=torch.int32)
    cap_output(out, [2, 2, 1], [1.0, 1e-9])
    assert out.tolist() == [[11, 12, P], [21, P, P], [31, 32, P]]


def test_positions_beyond_the_rates_are_rejected():
    out = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
    cap_output(out, [3], [1.0])
    assert out.tolist() == [[1, 2, P, P]]


def test_conditional_rates_are_reproduced():
    n = 20000
    out = torch.arange(1, 4, dtype=torch.int32).repeat(n, 1)  # every draft of k=2 fully accepted
    cap_output(out, [2] * n, [0.8, 0.5], torch.Generator().manual_seed(1))
    accepted = (out != P).sum(dim=1) - 1  # tokens minus the bonus/target token
    reached_2 = (accepted >= 1).float().sum().item()
    a1, a2 = reached_2 / n, (accepted >= 2).float().sum().item() / reached_2
    assert abs(a1 - 0.8) <= binomial_margin(0.8, n)  # a share of n draws
    assert abs(a2 - 0.5) <= binomial_margin(0.5, reached_2)  # of the drafts that reached position 2


def test_set_rates_validates_and_turns_off():
    with pytest.raises(ValueError):
        acceptance_cap.set_rates([0.5, 1.5])
    acceptance_cap.set_rates([0.9])
    assert acceptance_cap.get_rates() == (0.9,)
    acceptance_cap.set_rates(None)
    assert acceptance_cap.get_rates() is None
