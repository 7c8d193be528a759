"""Prefill cost, and the throughput a closed loop serves when each new request's prompt is prefilled.

The tune's T(b, k) times decode steps only. In serving, each finishing request is replaced by a new
one, and under chunked prefill (vLLM) the new prompt is scheduled in the same step as the other rows'
decode. That step takes longer than a decode step by P ms (the prompt's own work: tokenising,
attention and the layers over its tokens), and its row yields one token (the prompt's first output)
instead of E_k.

A closed loop of b open requests, each of L output tokens and P ms of prefill, at k with E_k tokens a
request-step and decode-only goodput G = b E_k / T(b, k): N requests served take N (L - 1) / E_k decode
row-steps and N prefill row-steps, S = N ((L - 1) / E_k + 1) / b steps of T(b, k) plus N P, so

    served tok/s = N L / (S T(b, k) + N P) = L / ((L - 1 + E_k) / G + P)          (G in tok/ms here)

P does not depend on k, so the k that maximises G at each b is unchanged; it only pulls every k / k=0
ratio toward 1. P is measured as the wall time of a step that prefills one prompt minus a decode
step's, averaged over the workload's prompts at their real lengths. This module imports neither torch
nor vllm.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.errors import InputError


@dataclass(frozen=True)
class PrefillCost:
    """The workload's mean prefill cost on one engine: what one request's prompt adds to its step."""

    prefill_ms: float  # mean over the prompts: prefill step wall ms - decode step wall ms
    num_prompts: int
    mean_prompt_tokens: float
    decode_step_ms: float  # the decode step (one request, k = 0) subtracted from each prefill step

    def __post_init__(self) -> None:
        if not self.prefill_ms >= 0 or self.num_prompts < 1 or not self.decode_step_ms > 0:
            raise ValueError(f"prefill needs prefill_ms >= 0, num_prompts >= 1 and decode_step_ms > 0, got {self}")

    def to_json(self) -> dict:
        return {"prefill_ms": round(self.prefill_ms, 3), "num_prompts": self.num_prompts,
                "mean_prompt_tokens": round(self.mean_prompt_tokens, 2), "decode_step_ms": round(self.decode_step_ms, 3)}

    @classmethod
    def from_json(cls, obj: object, source: str = "<json>") -> PrefillCost:
        """From ``to_json``'s object; anything else is InputError naming the field."""
        if not isinstance(obj, dict):
            raise InputError(source, "prefill", obj, "must be an object")
        values = {}
        for name in ("prefill_ms", "num_prompts", "mean_prompt_tokens", "decode_step_ms"):
            value = obj.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(source, f"prefill.{name}", value, "must be a number")
            values[name] = int(value) if name == "num_prompts" else float(value)
        try:
            return cls(**values)
        except ValueError as exc:
            raise InputError(source, "prefill", obj, str(exc)) from None


def prefill_from_samples(prefill_step_ms: Sequence[float], decode_step_ms: float,
                         prompt_tokens: Sequence[int]) -> PrefillCost:
    """P from one timed prefill step per prompt and the decode step it is measured against
    (a prompt whose step was not slower than a decode step adds 0)."""
    if not prefill_step_ms or len(prefill_step_ms) != len(prompt_tokens):
        raise ValueError(f"need one prefill step per prompt, got {len(prefill_step_ms)} for {len(prompt_tokens)}")
    extra = [max(ms - decode_step_ms, 0.0) for ms in prefill_step_ms]
    return PrefillCost(statistics.fmean(extra), len(extra), statistics.fmean(prompt_tokens), decode_step_ms)


def served_tok_s(goodput_tok_s: float, tokens_per_step: float, output_tokens: float, prefill_ms: float) -> float:
    """Closed-loop output tokens/s with prefill: L / ((L - 1 + E_k) / G + P) (module docstring), G the
    decode-only goodput at (b, k) in tok/s, E_k its tokens a request-step, L output tokens a request."""
    if goodput_tok_s <= 0 or output_tokens < 1 or tokens_per_step < 1 or prefill_ms < 0:
        raise ValueError(f"need goodput > 0, L >= 1, E_k >= 1, P >= 0; got G={goodput_tok_s}, "
                         f"E_k={tokens_per_step}, L={output_tokens}, P={prefill_ms}")
    seconds = (output_tokens - 1 + tokens_per_step) / goodput_tok_s + prefill_ms / 1e3
    return output_tokens / seconds
