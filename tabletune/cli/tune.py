"""``tabletune tune``: measure T(b, k) and acceptance on a real engine, write the table.

Engines are adapter modules with ``validate(spec)``, ``start(spec) -> Engine``
and optionally ``speculative_config(spec, ranges)``:

* ``--engine vllm``: ``tabletune.integrations.vllm.tuner_engine`` (offline vLLM);
* ``--engine builtin``: ``tabletune.engine.tuner_adapter`` (the reference engine).

vLLM's own logs show at ERROR level unless ``--verbose``: the environment that
says so is set here, at the entry, before any adapter imports vLLM.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import warnings
from pathlib import Path
from types import ModuleType

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tabletune import fileio
from tabletune.acceptance import parse_rates
from tabletune.cli.common import command_line, print_predictions, stderr_console
from tabletune.errors import InputError
from tabletune.optimizer import TableResult
from tabletune.padding import geometric_batch_sizes
from tabletune.profile import StepProfile, parse_int_list
from tabletune.sglang_config import SGLANG_ADAPTIVE_METHODS, launch_flags
from tabletune.simple_table import DEFAULT_NOISE_FLOOR, smooth_within_noise
from tabletune.tuner import EngineSpec, TunePlan, check_grid
from tabletune.tuner.checkpoint import Checkpoint
from tabletune.tuner.files import SGLANG_FILE, STATIC_FILE, DrawPng, predict_gains, static_json, write_runs
from tabletune.tuner.run import batch_caps, measure_static, run_contexts
from tabletune.tuner import workload as workload_shape
from tabletune.tuner.static_check import check_batch_sizes, decide_static

ADAPTERS = {"vllm": "tabletune.integrations.vllm.tuner_engine", "builtin": "tabletune.engine.tuner_adapter"}


def load_adapter(engine: str) -> ModuleType:
    """The adapter module of ``--engine``; an adapter that is not installed is bad input."""
    name = ADAPTERS[engine]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise InputError("--engine", "engine", engine, f"adapter module {name} is not available") from None
        raise


def engine_log_env(verbose: bool) -> dict[str, str]:
    """Environment for the engines' own logs: empty with ``verbose`` (their defaults, e.g. vLLM's INFO);
    otherwise vLLM at ERROR and torch's C++ warnings (e.g. NUMA binding) at ERROR."""
    return {} if verbose else {"VLLM_LOGGING_LEVEL": "ERROR", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def quiet_engine_logs(verbose: bool) -> None:
    """At the CLI entry, before vLLM or torch is imported: apply ``engine_log_env`` and, unless
    ``verbose``, set the ``vllm`` logger to ERROR too (vLLM logs while it imports, before it reads
    ``VLLM_LOGGING_LEVEL``) and hide the deprecation warnings the engines' own modules raise."""
    os.environ.update(engine_log_env(verbose))
    if not verbose:
        logging.getLogger("vllm").setLevel(logging.ERROR)
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category, module=r"(vllm|torch|transformers)(\.|$)")


def load_prompt_texts(spec: str, limit: int) -> tuple[str, list[str]]:
    """(workload name, prompt texts) from a prompt set name or a .jsonl file."""
    from tabletune import assets

    prompts = assets.load_prompts(spec, limit=limit)
    return prompts[0].workload, [p.text for p in prompts]


def build_spec(model, method, draft_model, k_max, max_num_seqs, batch_sizes, synthetic, context_len, seed,
               policy=None, engine_args=()):
    """The engine to start and the batch sizes to measure, from the flags; bad values are InputError."""
    sizes = tuple(parse_int_list(batch_sizes, "--batch-sizes", "batch_sizes")) if batch_sizes else None
    max_num_seqs = max_num_seqs or (max(sizes) if sizes else 64)
    sizes = sizes or geometric_batch_sizes(max_num_seqs)
    check_grid(sizes, k_max, max_num_seqs)
    rates = tuple(parse_rates(synthetic, "--synthetic-acceptance")) if synthetic else None
    if rates is not None and len(rates) < k_max:
        raise InputError("--synthetic-acceptance", "rates", list(rates), f"give at least k_max={k_max} rates")
    spec = EngineSpec(model=model, method=method, k_max=k_max, max_batch_size=max_num_seqs, draft_model=draft_model,
                      synthetic_acceptance=rates, context_len=context_len, seed=seed, policy=policy,
                      engine_args=tuple(engine_args))
    return spec, tuple(sorted(set(sizes)))


def parse_context_lens(context_len: int | None, context_lens: str | None, prompt_tokens=lambda: (),
                       output_tokens: int = 0) -> tuple[int, ...]:
    """``--context-lens 512,p50,p90`` (tokens, or quantiles of the prompts' lengths + output_tokens // 2;
    ascending, each >= 1), else ``--context-len`` alone, else the workload's: the prompts' median +
    output_tokens // 2 (``tabletune.tuner.workload``). ``prompt_tokens()`` counts the prompts' tokens,
    called only when a quantile needs them."""
    if context_lens:
        quantiles = any(workload_shape.QUANTILE.match(s.strip()) for s in context_lens.split(","))
        return workload_shape.context_lens(context_lens, prompt_tokens() if quantiles else (), output_tokens)
    if context_len:
        return (context_len,)
    return workload_shape.context_lens(None, prompt_tokens(), output_tokens)


@click.command("tune", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", "engine_name", type=click.Choice(sorted(ADAPTERS)), default="vllm", show_default=True)
@click.option("--model", required=True,
              help="vllm: a hub id org/name, a local HF folder or .gguf, or tiny-llama / smollm2-135m; builtin: a "
                   "shape preset or a local HF folder")
@click.option("--method", default="ngram", show_default=True, help="speculative method: ngram, draft_model, eagle3, ...")
@click.option("--draft-model", default=None, help="draft model or speculator (folder or hub id)")
@click.option("--k-max", type=int, default=4, show_default=True)
@click.option("--batch-sizes", default=None, help="e.g. 1,2,4,8 (default: 1,2,4,... max-num-seqs)")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None,
              help="engine's max batch (default: largest batch size, or 64)")
@click.option("--prompts", "prompt_set", default="code", show_default=True, help="code, chat, ... or a .jsonl file")
@click.option("--num-prompts", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--synthetic-acceptance", default=None, help="a1,a2,...: controlled acceptance (measurement aid)")
@click.option("--point-budget-s", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="wall time per (b, k) point")
@click.option("--no-refine", is_flag=True, help="skip refining batch sizes where the chosen k changes")
@click.option("--close-call-margin", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True,
              help="re-measure k whose predicted goodput is within this share of the best (0: off)")
@click.option("--draft-share", type=click.FloatRange(0, 1), default=None,
              help="for a drafter that proposes only on a match (measured at every k when its draft rate is "
                   "below 0.95): the share f of the longest draft's cost a step pays whatever its other rows "
                   "draft (1: rows padded; default: fitted to the acceptance runs' steps where the engine "
                   "records them, else 1)")
@click.option("--context-len", type=click.IntRange(min=1), default=None,
              help="mean context (tokens) of the timed steps (default: the prompts' median length + half of "
                   "--output-tokens)")
@click.option("--context-lens", default=None,
              help="e.g. 512,2048,8192 or p10,p50,p90 (quantiles of the prompts' lengths + half of --output-tokens): "
                   "one profile per context length and a by-context table (overrides --context-len)")
@click.option("--output-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="tokens a request of the workload generates: the acceptance runs' length, and half of it is "
                   "added to the prompts' lengths for the grid's default context")
@click.option("--noise-floor", type=click.FloatRange(min=0), default=DEFAULT_NOISE_FLOOR, show_default=True,
              help="change k between batch sizes only where the change gains at least this at some batch size "
                   "of its range, and more than the points resolve")
@click.option("--static-check/--no-static-check", default=True, show_default=True,
              help="also time the best fixed k with the table mechanism off, and recommend static or dynamic")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), default=None,
              help="continue an interrupted tune from its checkpoint folder (OUT.partial); same options")
@click.option("--seed", type=int, default=0)
@click.option("--policy", default=None,
              help="builtin engine: the policy that picks draft lengths while acceptance is measured, as in "
                   "`tabletune simulate --policy` (default: every request drafts k-max)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/tune", show_default=True)
@click.option("--verbose", is_flag=True, help="show the engine's own logs (vLLM: INFO); default: errors only")
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def tune_cmd(engine_name, model, method, draft_model, k_max, batch_sizes, max_num_seqs, prompt_set, num_prompts,
             synthetic_acceptance, point_budget_s, no_refine, close_call_margin, draft_share, context_len,
             context_lens, output_tokens, noise_floor, static_check, resume_dir, seed, policy, out_dir, verbose,
             engine_args):
    """Measure step times and acceptance on a real engine; write the table and speculative config.

    Engine flags go after ``--``: with --engine vllm, any ``vllm serve`` engine flag
    (e.g. -- --tensor-parallel-size 2 --gpu-memory-utilization 0.85), parsed by vLLM itself.
    """
    quiet_engine_logs(verbose)
    spec, sizes = build_spec(model, method, draft_model, k_max, max_num_seqs, batch_sizes, synthetic_acceptance,
                             context_len or 1, seed, policy, engine_args)
    if policy and engine_name != "builtin":
        raise InputError("--policy", "engine", engine_name, "only the builtin engine measures under a policy")
    if engine_args and engine_name != "vllm":
        raise InputError("engine flags after --", "engine", engine_name, "only --engine vllm takes engine flags")
    adapter = load_adapter(engine_name)
    adapter.validate(spec)
    workload, prompts = load_prompt_texts(prompt_set, num_prompts)
    lens = parse_context_lens(context_len, context_lens, lambda: prompt_token_counts(adapter, spec, prompts),
                              output_tokens)
    spec = dataclasses.replace(spec, context_len=max(lens), timing_prompts=tuple(prompts))
    plan = TunePlan(batch_sizes=sizes, ks=tuple(range(k_max + 1)), point_budget_s=point_budget_s, refine=not no_refine,
                    close_call_margin=close_call_margin, draft_share=draft_share, acceptance_max_tokens=output_tokens)
    spec_settings = {key: v for key, v in dataclasses.asdict(spec).items() if key != "timing_prompts"}
    settings = {"engine": engine_name, "spec": spec_settings, "batch_sizes": list(sizes),
                "context_lens": list(lens), "prompts": prompt_set, "num_prompts": num_prompts,
                "output_tokens": output_tokens}
    checkpoint = Checkpoint.open(resume_dir or f"{Path(out_dir)}.partial", json.loads(json.dumps(settings)),
                                 resume=bool(resume_dir))
    command = command_line()
    console = stderr_console()
    engine = adapter.start(spec)
    try:
        caps = batch_caps(engine, lens)  # refuses before anything is measured when a context holds no sequence
        for cap in caps:
            if cap.capped:
                console.print(cap.describe())
        console.print(f"checkpoint: {checkpoint.folder} (after an interruption: the same command with --resume "
                      f"{checkpoint.folder})")
        outcomes = _measure(engine, plan, prompts, workload, command, console, lens, checkpoint)
    finally:
        engine.close()
    make_config = getattr(adapter, "speculative_config", None)

    def config(ranges):
        if make_config:
            return make_config(spec, ranges)
        return {"method": method, "num_speculative_tokens": k_max, "num_speculative_tokens_per_batch_size": ranges}

    title = f"{engine_name} {model} {method}"
    results, files = write_runs(out_dir, outcomes, config, command=command, draw_png=_png_drawer(title),
                                noise_floor=noise_floor)
    checkpoint.remove()
    # after the tables are written: a failing static-mode engine loses none of them
    decision = _static_check(adapter, spec, plan, outcomes[0], lens[0], noise_floor, console) if static_check else None
    if decision is not None:
        files[STATIC_FILE] = Path(out_dir) / STATIC_FILE
        fileio.write_json(files[STATIC_FILE], static_json(decision, config))
    for outcome, result in zip(outcomes, results):
        if len(outcomes) > 1:
            console.print(f"context {outcome.profile.context_len}:")
        _report(outcome, result, console)
    if decision is not None:
        console.print(decision.summary())
    for path in files.values():
        console.print(f"wrote {path}")
    if method in SGLANG_ADAPTIVE_METHODS:  # SGLang's adaptive steps serve EAGLE/EAGLE3 only
        sglang_file = files[SGLANG_FILE]
        console.print("on SGLang: python -m sglang.launch_server --model-path MODEL --speculative-algorithm EAGLE3 "
                      "--speculative-draft-model-path DRAFT "
                      f"{launch_flags(json.loads(sglang_file.read_text()), str(sglang_file))}")
    main_table = files.get("table_by_context.json", files["table.json"])
    click.echo(json.dumps(json.loads(main_table.read_text())))
    if "tune.png" in files:
        click.echo(f"png: {files['tune.png']}")


def prompt_token_counts(adapter: ModuleType, spec: EngineSpec, prompts: list[str]) -> list[int]:
    """Tokens of each prompt in the model's tokenizer (the adapter's ``prompt_token_ids``), else its UTF-8 bytes."""
    count = getattr(adapter, "prompt_token_ids", None)
    if count is None:
        return [len(p.encode()) for p in prompts]
    return [len(ids) for ids in count(spec, prompts)]


def _static_check(adapter, spec, plan, outcome, context_len, noise_floor, console: Console):
    """Time the best fixed k with the table mechanism off at the smallest context (an engine of its own,
    started after the tuning engine closed), then plain decoding (k = 0, another engine); None when the
    adapter's engine has one mode."""
    start_static = getattr(adapter, "start_static", None)
    result = smooth_within_noise(outcome.profile, outcome.rates, outcome.options(), noise_floor)
    k = result.best_single_k
    reason = getattr(adapter, "static_same_as_dynamic", lambda s: None)(spec)
    if start_static is None or reason:
        console.print(f"static check: skipped ({reason or 'this engine has no separate static mode'})")
        return None
    checked = check_batch_sizes(outcome.profile.batch_sizes)
    sizes, points = _time_static(start_static, spec, plan, k, checked, outcome.profile.batch_sizes, context_len,
                                 console)
    if not points:
        return None
    plain = _time_static(start_static, spec, plan, 0, checked, outcome.profile.batch_sizes, context_len,
                         console)[1] if k > 0 else []
    return decide_static(result, points, {b: outcome.profile.step_ms(b, k) for b in sizes}, no_spec_points=plain)


def _time_static(start_static, spec, plan, k: int, sizes, measured, context_len: int, console: Console):
    """T_static(b, k) on an engine of its own without the table, at the sizes its KV cache holds."""
    engine = start_static(spec, k)
    try:
        if hasattr(engine, "set_context_len"):
            engine.set_context_len(context_len)
        if hasattr(engine, "batch_cap"):
            sizes = static_sizes(sizes, measured, engine.batch_cap(context_len), console)
        return sizes, (measure_static(engine, plan, k, sizes) if sizes else [])
    finally:
        engine.close()


def static_sizes(sizes: tuple[int, ...], measured: tuple[int, ...], cap, console: Console) -> tuple[int, ...]:
    """The static check's batch sizes that the static engine's KV cache holds (it starts with the memory the
    tuning engine left): the measured sizes up to its cap stand in for those beyond it."""
    if all(b <= cap.batch_size for b in sizes):
        return sizes
    fits = tuple(b for b in measured if b <= cap.batch_size)
    kept = tuple(sorted({b for b in sizes if b <= cap.batch_size} | ({max(fits)} if fits else set())))
    console.print(f"static check: the static engine holds b <= {cap.batch_size} at context {cap.context_len}; "
                  + (f"checked at b = {', '.join(map(str, kept))}" if kept else "skipped"))
    return kept


def _png_drawer(title: str) -> DrawPng:
    def draw(profile: StepProfile, result: TableResult, path: Path) -> None:
        from tabletune.plot import draw_tune_png  # matplotlib only to draw

        draw_tune_png(profile, result, path, title)

    return draw


def _measure(engine, plan, prompts, workload, command, console: Console, context_lens, checkpoint):
    columns = (TextColumn("{task.description:<32}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("tuning", total=1000)
        return run_contexts(engine, plan, prompts, context_lens, workload=workload, command=command,
                            progress=lambda text, frac: bar.update(task, description=text,
                                                                   completed=round(1000 * frac)),
                            checkpoint=checkpoint)


def _report(outcome, result, console: Console) -> None:
    print_predictions(result, console)
    if outcome.batch_cap is not None and outcome.batch_cap.capped:
        console.print(outcome.batch_cap.describe())
    gains = predict_gains(outcome, result)
    rates = ", ".join(f"{r:.3f}" for r in outcome.rates)
    console.print(f"measured acceptance a_j: {rates} ({outcome.acceptance.num_drafts} drafts)")
    if outcome.yields:
        per_k = ", ".join(f"k={y.k} {y.tokens_per_step:.3f} tok/step (q {y.draft_rate:.2f})" for y in outcome.yields)
        share = outcome.draft_share
        how = {"fitted": f"fitted to {share.fitted_steps} steps", "given": "given"}.get(share.source, "padded default")
        console.print(f"draft rate {outcome.acceptance.draft_rate:.2f} at k={max(outcome.profile.ks)}: the table is "
                      f"built from the yield measured at every k, draft share f={share.value:.2f} ({how}): {per_k}")
    if outcome.refined_batch_sizes:
        console.print(f"refined batch sizes: {list(outcome.refined_batch_sizes)}")
    for call in outcome.close_calls:
        console.print(f"close call at b={call.batch_size}: k {list(call.ks)} within {call.edge:.1%} (re-measured)")
    console.print(f"predicted gain vs best fixed k={gains.best_fixed_k}: {gains.vs_best_fixed[0]:+.1%} mean, "
                  f"{gains.vs_best_fixed[1]:+.1%} worst b")
    console.print(f"predicted gain vs vLLM's documented table {gains.documented}: {gains.vs_documented[0]:+.1%} mean, "
                  f"{gains.vs_documented[1]:+.1%} worst b")
