"""What the tuner needs from an engine: the ``Engine`` protocol and the ``EngineSpec`` to start one.

An adapter module (vLLM: ``tabletune.integrations.vllm.tuner_engine``; the
reference engine: ``tabletune.engine.tuner_adapter``) exposes
``validate(spec)`` (raise InputError, cheap, no engine), ``start(spec) -> Engine``
and optionally ``speculative_config(spec, ranges)`` and ``prompt_token_ids(spec, texts)`` (the
model's token ids of each text, no engine: the CLI sizes the grid's context from them,
``tabletune.tuner.workload``). This module imports
neither torch nor vllm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tabletune.acceptance import AcceptanceCounts
from tabletune.profile import Fingerprint


@dataclass(frozen=True)
class StepSamples:
    """What one ``Engine.measure_step`` call timed.

    ``samples_ms[i]`` is the wall time of one steady-state decode step (no
    prefill in it) with exactly ``batch_size`` requests, each verifying a draft
    of the requested k; ``scheduled_tokens[i]`` is the number of tokens that
    step actually scheduled (b * (k + 1) when every request drafted k tokens).
    """

    samples_ms: tuple[float, ...]
    scheduled_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.scheduled_tokens and len(self.scheduled_tokens) != len(self.samples_ms):
            raise ValueError("scheduled_tokens must have one entry per sample")


@runtime_checkable
class Engine(Protocol):
    """A speculative-decoding engine the tuner can measure. Engine-agnostic.

    The engine is started once (with every k up to ``k_max`` usable) and
    measured many times; the tuner never restarts it.

    * ``fingerprint()``: where the numbers come from (engine, version, device,
      model, dtype, runner, drafter); stored in the StepProfile.
    * ``measure_step(batch_size, k, num_steps)``: keep exactly ``batch_size``
      requests decoding with draft length ``k`` (forced, whatever table the
      engine was started with), let the first steps after a change of k or of
      the batch go untimed, and return ``num_steps`` timed steady-state decode
      steps. Steps containing a prefill are never timed.
    * ``measure_acceptance(prompts, k, max_tokens)``: decode every prompt (text)
      for up to ``max_tokens`` tokens drafting ``k`` tokens per step, and return
      the censored per-position counts (see ``tabletune.acceptance``).
    * ``close()``: free the engine.
    * optional ``set_context_len(n)``: time the next steps at a mean context of n tokens (needed for
      ``tune --context-lens`` with more than one length; the engine starts at the largest).
    * optional ``batch_cap(n) -> tabletune.tuner.budget.BatchCap``: the largest batch the engine holds at
      context n now (its memory or KV cache); the tune refuses before measuring anything when a context
      holds none, and asks again for each context after its ``set_context_len(n)`` (which releases what the
      previous context held), measuring it up to that. Without it every context holds ``max_batch_size``.
    * optional ``take_mixed_steps()``: the decode steps of the last ``measure_acceptance`` as
      ``tabletune.cost.MixedStep`` (batch size, longest and mean draft of its rows, wall ms), from
      which the tuner fits the draft share of a drafter that proposes only on a match.

    An adapter module may also offer ``start_static(spec, k)`` (an engine with the table
    mechanism off, for ``tabletune.tuner.static_check``) and ``static_same_as_dynamic(spec)``
    (why timing it would measure nothing new, or None).

    Attributes: ``max_batch_size`` (largest b it can hold, e.g. vLLM's
    max_num_seqs), ``k_max`` (largest k it can draft), ``context_len`` (the
    typical context length of timed steps, in tokens).
    """

    max_batch_size: int
    k_max: int
    context_len: int

    def fingerprint(self) -> Fingerprint: ...

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples: ...

    def measure_acceptance(self, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceCounts: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSpec:
    """What to start: the CLI's options, checked before any engine starts."""

    model: str
    method: str
    k_max: int
    max_batch_size: int
    draft_model: str | None = None
    synthetic_acceptance: tuple[float, ...] | None = None  # conditional rates, a controlled run
    context_len: int = 128
    seed: int = 0
    # the policy (``tabletune simulate --policy`` spellings) that picks draft lengths while acceptance is measured;
    # None: every request drafts k_max (engines that take only that reject any other)
    policy: str | None = None
    # the engine's own flags, verbatim (vLLM: the ``vllm serve`` engine flags after ``--``, parsed by vLLM)
    engine_args: tuple[str, ...] = ()
    # the workload's prompt texts: the timed requests carry their tokens (``tabletune.tuner.workload.timing_rows``),
    # so a drafter that searches the context searches real text; empty: the engine's own filler
    timing_prompts: tuple[str, ...] = ()
