"""Shared set-up for the controller benchmarks (not tests): one in-process vLLM engine per script.

Throughput is reported per second of engine CPU time (``LoopResult.throughput_cpu_tok_s``,
one OpenMP thread) because this 2-core machine is shared; wall-clock throughput is kept too.
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
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # one OpenMP thread bound to one core: throughput per engine CPU second is then the engine's own
    # work even on a shared machine (as `tabletune tune --timing cpu` measures step times)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(sorted(os.sched_getaffinity(0))[-1]))
    os.environ["TABLETUNE_PROFILE"] = str(profile_dir)
    if cap:
        os.environ["TABLETUNE_ACCEPTANCE_CAP"] = ",".join(map(str, cap))
    if options:
        os.environ["TABLETUNE_CONTROLLER"] = json.dumps(options)


def start_engine(model: str, table: list[list[int]], k_max: int, max_num_seqs: int, max_model_len: int = 2048,
                 rates: list[float] | None = None, **llm_kwargs):
    """vLLM with n-gram drafting and a starting table; returns (llm, controller hook). On a GPU, ``rates``
    force acceptance through vLLM's synthetic sampler (``configure``'s cap does it on the CPU)."""
    from vllm import LLM

    from tabletune.integrations.vllm import controller_hook, engine_args, versions
    from tabletune.integrations.vllm.presets import resolve_model

    controller_hook.install()  # idempotent; vLLM's plugin loading normally does it
    preset = resolve_model(model)
    spec = {"method": "ngram", "num_speculative_tokens": k_max, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
            "num_speculative_tokens_per_batch_size": table}
    on_cpu = engine_args.on_cpu()
    if rates and not on_cpu:
        spec.update(versions.forced_acceptance(rates, k_max, on_cpu=False)[0])
    llm = LLM(model=preset.path, load_format=preset.load_format, skip_tokenizer_init=preset.skip_tokenizer_init,
              dtype="float32" if on_cpu else "auto", max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0,
              speculative_config=spec, **llm_kwargs)
    hook = llm.llm_engine.engine_core.engine_core.scheduler._tabletune_hook
    if hook is None:
        sys.exit(f"controller did not attach: {controller_hook._status}")
    return llm, hook


def token_prompts(n: int, length: int = 64) -> list[dict]:
    """Repetitive token-id prompts for the dummy model (n-gram drafts always match; the cap sets acceptance)."""
    return [{"prompt_token_ids": [PATTERN[(i + s) % len(PATTERN)] for i in range(length)]} for s in range(n)]


def worst_share(profile, rates, table, max_batch: int, draft_rate: float = 1.0) -> float:
    """min over b of predicted goodput(table) / goodput(optimize_table on these rates and draft rate)."""
    from tabletune.optimizer import OptimizeOptions, evaluate_table, optimize_table

    opt = optimize_table(profile, rates, OptimizeOptions(max_batch=max_batch, k_max=len(rates), draft_rate=draft_rate))
    got = evaluate_table(profile, rates, table, max_batch, opt.ks, draft_rate)
    return min(g.goodput / o.goodput for g, o in zip(got, opt.predictions))


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def write_results(name: str, obj: dict, markdown: str) -> None:
    from tabletune import fileio

    fileio.write_json(RESULTS / f"{name}.json", obj)
    fileio.write_text(RESULTS / f"{name}.md", markdown)
    print(markdown)
    print(f"wrote {RESULTS / name}.json and .md")


def fit_linear_profile(src_dir: str, dst_dir: str) -> str:
    """A smoothed copy of a ``tabletune tune`` folder: T(b, k) = c0 + c1 b + c2 b k, fitted by least
    absolute deviations (iteratively reweighted) to every sample, at the measured grid points.

    On this shared 2-core machine single (b, k) medians are too noisy to rank k (they are not even
    monotone in k); the three-parameter fit keeps what the samples agree on: a per-step cost, a
    per-request cost and a per-draft-token cost. Writes step_profile.json and acceptance.json to dst_dir.
    """
    import dataclasses
    import shutil

    import numpy as np

    from tabletune.profile import StepPoint, StepProfile

    src = StepProfile.load(f"{src_dir}/step_profile.json")
    rows = [([1.0, p.batch_size, p.batch_size * p.k], s) for p in src.points for s in p.samples_ms]
    x, y = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    weights = np.ones(len(y))
    for _ in range(50):
        root = np.sqrt(weights)
        coef, *_ = np.linalg.lstsq(x * root[:, None], y * root, rcond=None)
        weights = 1.0 / np.maximum(np.abs(y - x @ coef), 1e-3)
    points = tuple(StepPoint(p.batch_size, p.k, (float(coef @ [1.0, p.batch_size, p.batch_size * p.k]),))
                   for p in src.points)
    command = f"{src.fingerprint.command} | linear L1 fit T = {coef[0]:.2f} + {coef[1]:.3f} b + {coef[2]:.3f} b k ms"
    fitted = StepProfile(points, src.context_len, dataclasses.replace(src.fingerprint, command=command))
    Path(dst_dir).mkdir(parents=True, exist_ok=True)
    fitted.save(f"{dst_dir}/step_profile.json")
    shutil.copy(f"{src_dir}/acceptance.json", f"{dst_dir}/acceptance.json")
    print(command)
    return dst_dir
