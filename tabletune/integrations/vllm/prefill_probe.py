"""Time the workload's prefill on an in-process vLLM engine (``tabletune.prefill.PrefillCost``).

Each prompt, at its real length, is added alone and prefilled in one step (``max_tokens=1``); the wall
time runs from ``add_request`` (tokenising, as a served request is) to the step that finishes it, the
same span a closed loop's window times for a new request. The prefix cache is reset before each
prompt, so every prompt is prefilled in full, as a prompt served once is. A decode step of one
request at k = 0 is timed in the same run and subtracted (the step's own overhead, which a prefill
shares with the decode rows of its step in serving). Call with no other request open.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from tabletune.prefill import PrefillCost, prefill_from_samples

DECODE_STEPS = 16  # decode steps timed for the reference


def _finish(engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def _prefill_ms(llm, req_id: str, prompt, params) -> float:
    """Wall ms from ``add_request`` to the end of the step that prefilled it (its only token)."""
    engine = llm.llm_engine
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    engine.add_request(req_id, prompt, params)
    _finish(engine)
    return (time.perf_counter() - t0) * 1e3


def decode_step_ms(llm, prompt, params_for) -> float:
    """Median wall ms of one request's decode steps (after its prefill)."""
    engine = llm.llm_engine
    engine.add_request("prefill-probe-decode", prompt, params_for(DECODE_STEPS + 1))
    engine.step()  # its prefill
    times = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure_prefill(llm, prompts: Sequence, prompt_tokens: Sequence[int]) -> PrefillCost:
    """``PrefillCost`` of ``prompts`` (text or ``{"prompt_token_ids": ...}``) with ``prompt_tokens`` tokens
    each, on ``llm`` (a ``vllm.LLM`` with no request open, drafting k = 0)."""
    from vllm import SamplingParams

    def params_for(n: int):
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    _prefill_ms(llm, "prefill-probe-warmup", prompts[0], params_for(1))  # first-shape compile
    decode_ms = decode_step_ms(llm, prompts[0], params_for)
    steps = [_prefill_ms(llm, f"prefill-probe-{i}", p, params_for(1)) for i, p in enumerate(prompts)]
    return prefill_from_samples(steps, decode_ms, prompt_tokens)
