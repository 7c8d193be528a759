"""Scenarios for tests/integrations/test_vllm_controller.py, each run in its own process.

vLLM cannot start a second engine in one process, so the test runs:

* ``controller``: controller on (TABLETUNE_PROFILE set by the test) with the acceptance cap.
  (a) closed loop at load 16 from a mistuned table, recording every installed table;
  (b) the cap's rates switch mid-run (``acceptance_cap.set_rates``), recording again;
  (c) an exception injected into the controller, then NaN observations, while generating;
  (d) greedy outputs with the controller on.
* ``plain``: the same speculative config, no tabletune plugin loaded at all; greedy outputs.
* ``nospec``: speculation off; greedy outputs.
* ``online``: ``AsyncLLM`` with the engine core in its own process (the ``vllm serve`` path):
  ``call_utility_async("tabletune_state")`` and ``("tabletune_set_table", ...)``.

Usage: TT_TEST_MODEL_DIR=<folder with TEST_MODEL as config.json> python vllm_controller_scenarios.py SCENARIO OUT.json
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

K_MAX = 4
MAX_NUM_SEQS = 64
START_TABLE = [[1, 4, 4], [5, 8, 4], [9, 16, 3], [17, 32, 1], [33, 512, 0]]  # documented / 4, clamped to 4
TRUE_RATES = [0.9, 0.85, 0.8, 0.75]
SWITCH_RATES = [0.5, 0.4, 0.35, 0.3]
LOAD = 16
STEPS_A = 120
STEPS_B = 250
GREEDY_TOKENS = 48
PATTERN = [11, 12, 13, 14, 15, 16, 17, 18]


def prompts(n: int, length: int = 32) -> list[dict]:
    """Repetitive token-id prompts (n-gram drafts always match on the dummy model), one rotation each."""
    return [{"prompt_token_ids": [PATTERN[(i + s) % len(PATTERN)] for i in range(length)]} for s in range(n)]


#: smaller than the tiny-llama preset (hidden 512, 4 layers) to keep the test fast
TEST_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
              "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
              "tie_word_embeddings": False}


def start(spec: bool):
    from vllm import LLM

    model_dir = os.environ["TT_TEST_MODEL_DIR"]
    speculative = {"method": "ngram", "num_speculative_tokens": K_MAX, "prompt_lookup_min": 2,
                   "prompt_lookup_max": 4, "num_speculative_tokens_per_batch_size": START_TABLE}
    return LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True, dtype="float32",
               max_model_len=1024, max_num_seqs=MAX_NUM_SEQS, enforce_eager=True, seed=0,
               speculative_config=speculative if spec else None)


class VllmSteps:
    """What vLLM's scheduler itself used, per step: read from ``schedule()``'s output, not from our hook.

    Each entry: [batch_size, k scheduled (``num_spec_tokens_to_schedule``, looked up in
    ``scheduler.dynamic_sd_lookup``), the longest draft verified in this step (proposed after the
    previous step with that step's k), the lookup as ranges (None on an all-k_max exploration step)].
    """

    def __init__(self, scheduler) -> None:
        from tabletune.table import DraftTable

        self.entries: list[list] = []
        schedule = scheduler.schedule

        def recorded_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            n = len(out.num_scheduled_tokens)
            if n:
                lookup = scheduler.dynamic_sd_lookup[1:]
                ranges = None if all(k == K_MAX for k in lookup) else DraftTable.from_dense(lookup).as_lists()
                longest = max((len(v) for v in out.scheduled_spec_decode_tokens.values()), default=0)
                self.entries.append([n, out.num_spec_tokens_to_schedule, longest, ranges])
            return out

        scheduler.schedule = recorded_schedule

    def tables(self, start: int) -> list:
        """[[step, ranges], ...] each time the lookup vLLM scheduled with changed (exploration skipped)."""
        out: list = []
        for i, (_, _, _, ranges) in enumerate(self.entries[start:], start):
            if ranges is not None and (not out or out[-1][1] != ranges):
                out.append([i, ranges])
        return out


def record_tables(steps_log: VllmSteps, steps: int, loop) -> list:
    start = len(steps_log.entries)
    loop.run(steps)
    return steps_log.tables(start)


def controller_scenario() -> dict:
    from tabletune.controller.estimator import StepObservation
    from tabletune.integrations.vllm import acceptance_cap
    from tabletune.integrations.vllm.closed_loop import ClosedLoop, generate_greedy

    acceptance_cap.set_rates(TRUE_RATES)
    llm = start(spec=True)
    core = llm.llm_engine.engine_core
    hook = core.engine_core.scheduler._tabletune_hook
    steps_log = VllmSteps(core.engine_core.scheduler)
    result: dict = {"state_start": core.call_utility("tabletune_state")}
    loop = ClosedLoop(llm, prompts(LOAD), LOAD, mean_tokens=400)
    tables_a = record_tables(steps_log, STEPS_A, loop)
    result.update(tables_a=tables_a, state_a=core.call_utility("tabletune_state"), totals_a=hook.totals.as_dict())
    acceptance_cap.set_rates(SWITCH_RATES)
    result["switch_step"] = len(steps_log.entries)
    tables_b = [[len(steps_log.entries), tables_a[-1][1]]] + record_tables(steps_log, STEPS_B, loop)
    loop.close()
    result.update(tables_b=tables_b, state_b=core.call_utility("tabletune_state"), vllm_steps=steps_log.entries)

    # (c) faults: the controller raises on every step; the engine must keep serving
    good_lookup = list(hook.table_lookup)

    def boom(*args, **kwargs):
        raise RuntimeError("injected fault")

    hook.controller.observe = boom
    windows = hook.windows
    result["outputs_fault"] = generate_greedy(llm, prompts(8), GREEDY_TOKENS)
    result["windows_fault"] = hook.windows - windows
    result["lookup_kept"] = core.engine_core.scheduler.dynamic_sd_lookup == good_lookup
    del hook.controller.observe
    result["state_fault"] = core.call_utility("tabletune_state")

    # NaN observations are ignored, not learned
    table_before = hook.controller.table.as_lists()
    rates_before = hook.controller.estimator.rates()
    nan = math.nan
    hook.make_observation = lambda b, k, now: StepObservation(b, k, 1, (1.0,) * K_MAX, (nan,) * K_MAX,
                                                               (1.0,) * K_MAX, now)
    windows = hook.windows
    result["outputs_nan"] = generate_greedy(llm, prompts(8), GREEDY_TOKENS)
    result["windows_nan"] = hook.windows - windows
    del hook.make_observation
    result.update(nan_table_kept=hook.controller.table.as_lists() == table_before,
                  nan_rates_kept=hook.controller.estimator.rates() == rates_before,
                  state_nan=core.call_utility("tabletune_state"))

    # (d) the controller on, working, with the cap on and firing (forced rejections)
    acceptance_cap.set_rates(TRUE_RATES)
    forced = acceptance_cap.forced_rejections()
    result["outputs_on"] = generate_greedy(llm, prompts(8), GREEDY_TOKENS)
    result["forced_rejections_on"] = acceptance_cap.forced_rejections() - forced
    acceptance_cap.set_rates(None)
    result["set_table"] = core.call_utility("tabletune_set_table", [[1, 8, 2], [9, 512, 1]])
    result["state_end"] = core.call_utility("tabletune_state")
    return result


async def online_scenario() -> dict:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    speculative = {"method": "ngram", "num_speculative_tokens": K_MAX, "prompt_lookup_min": 2,
                   "prompt_lookup_max": 4, "num_speculative_tokens_per_batch_size": START_TABLE}
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=os.environ["TT_TEST_MODEL_DIR"], load_format="dummy", skip_tokenizer_init=True, dtype="float32",
        max_model_len=1024, max_num_seqs=MAX_NUM_SEQS, enforce_eager=True, seed=0, speculative_config=speculative))
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True, detokenize=False)
    outputs = []
    for i, prompt in enumerate(prompts(4)):
        async for out in engine.generate(prompt, params, request_id=f"online-{i}"):
            final = out
        outputs.append(list(final.outputs[0].token_ids))
    state = await engine.engine_core.call_utility_async("tabletune_state")
    set_table = await engine.engine_core.call_utility_async("tabletune_set_table", [[1, 2, 3], [3, 512, 1]])
    state_after = await engine.engine_core.call_utility_async("tabletune_state")
    engine.shutdown()
    return {"outputs": outputs, "state": state, "set_table": set_table, "state_after": state_after,
            "pid_test": os.getpid()}


def main(scenario: str, out_path: str) -> None:
    if scenario == "online":
        import asyncio

        result = asyncio.run(online_scenario())
    elif scenario == "controller":
        result = controller_scenario()
    else:
        from tabletune.integrations.vllm.closed_loop import generate_greedy

        llm = start(spec=scenario == "plain")
        result = {"outputs": generate_greedy(llm, prompts(8), GREEDY_TOKENS)}
    with open(out_path, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's teardown: the result is written, and exit can be slow on a busy machine


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
