"""Shared set-up for the controller benchmarks (not tests): one in-process vLLM engine per script.

The controller plugin is switched on through the environment before vLLM is imported;
static baselines pause it (``ControllerHook.use_static``) and controller runs start a
fresh one (``use_controller``), so every configuration runs on the same engine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PATTERN = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def configure(profile_dir: str, cap: list[float] | None, options: dict | None = None) -> None:
    """Environment for the plugin; call before importing vllm."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["TABLETUNE_PROFILE"] = str(profile_dir)
    if cap:
        os.environ["TABLETUNE_ACCEPTANCE_CAP"] = ",".join(map(str, cap))
    if options:
        os.environ["TABLETUNE_CONTROLLER"] = json.dumps(options)


def start_engine(model: str, table: list[list[int]], k_max: int, max_num_seqs: int, max_model_len: int = 2048):
    """vLLM with n-gram drafting and a starting table; returns (llm, controller hook)."""
    from vllm import LLM

    from tabletune.integrations.vllm import controller_hook
    from tabletune.integrations.vllm.presets import resolve_model

    controller_hook.install()  # idempotent; vLLM's plugin loading normally does it
    preset = resolve_model(model)
    spec = {"method": "ngram", "num_speculative_tokens": k_max, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
            "num_speculative_tokens_per_batch_size": table}
    llm = LLM(model=preset.path, load_format=preset.load_format, skip_tokenizer_init=preset.skip_tokenizer_init,
              dtype="float32", max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0,
              speculative_config=spec)
    hook = llm.llm_engine.engine_core.engine_core.scheduler._tabletune_hook
    if hook is None:
        sys.exit(f"controller did not attach: {controller_hook._status}")
    return llm, hook


def token_prompts(n: int, length: int = 64) -> list[dict]:
    """Repetitive token-id prompts for the dummy model (n-gram drafts always match; the cap sets acceptance)."""
    return [{"prompt_token_ids": [PATTERN[(i + s) % len(PATTERN)] for i in range(length)]} for s in range(n)]


def worst_share(profile, rates, table, max_batch: int) -> float:
    """min over b of predicted goodput(table) / goodput(optimize_table on these rates)."""
    from tabletune.optimizer import OptimizeOptions, evaluate_table, optimize_table

    opt = optimize_table(profile, rates, OptimizeOptions(max_batch=max_batch, k_max=len(rates)))
    got = evaluate_table(profile, rates, table, max_batch, opt.lengths)
    return min(g.goodput / o.goodput for g, o in zip(got, opt.predictions))


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def write_results(name: str, obj: dict, markdown: str) -> None:
    from tabletune import fileio

    fileio.write_json(RESULTS / f"{name}.json", obj)
    fileio.write_text(RESULTS / f"{name}.md", markdown)
    print(markdown)
    print(f"wrote {RESULTS / name}.json and .md")
