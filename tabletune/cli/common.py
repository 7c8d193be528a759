"""What several subcommands share: the stderr console, the command line, optimizer flags, the table print-out."""

from __future__ import annotations

import json
import shlex
import sys

from rich.console import Console
from rich.table import Table

from tabletune.errors import InputError
from tabletune.optimizer import OptimizeOptions, TableResult
from tabletune.padding import geometric_batch_sizes
from tabletune.profile import StepProfile, parse_int_list
from tabletune.sglang_config import to_sglang
from tabletune.simple_table import verdict


def stderr_console() -> Console:
    """Progress and reports go to stderr; stdout carries only the result (JSON)."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def command_line() -> str:
    """The command as typed, recorded in the files a run writes."""
    return "tabletune " + shlex.join(sys.argv[1:])


def optimize_options(profile: StepProfile, num_rates: int, max_batch: int | None, k_max: int | None,
                     ks: str | None, min_gain: float = 0.0, draft_rate: float = 1.0) -> OptimizeOptions:
    """OptimizeOptions from flags, with the flags that do not fit the profile refused as InputError.

    The flags' own ranges (``--max-batch`` >= 1, ...) are click types; here: ``--ks`` must be
    measured, some k must remain allowed (measured, <= k_max, with a rate), and a draft rate
    below 1 needs T(b, 0).
    """
    allowed = tuple(parse_int_list(ks, "--ks", "ks")) if ks else None
    if allowed is not None:
        if not allowed:
            raise InputError("--ks", "ks", ks, "no draft length given")
        missing = sorted(set(allowed) - set(profile.ks))
        if missing:
            raise InputError("--ks", "ks", missing, f"no step-time measurements for these k (measured k: {profile.ks})")
    usable = [k for k in profile.ks if k <= num_rates and (k_max is None or k <= k_max)
              and (allowed is None or k in allowed)]
    if not usable:
        raise InputError("--ks", "ks", list(allowed or profile.ks),
                         f"no k is measured, <= --k-max={k_max} and covered by the {num_rates} acceptance rates")
    if draft_rate < 1 and 0 not in profile.ks:
        raise InputError(profile.source, "k", profile.ks, "a draft rate below 1 needs T(b, 0) measured")
    return OptimizeOptions(max_batch=max_batch, k_max=k_max, ks=allowed, min_gain=min_gain,
                           draft_rate=draft_rate)


def format_table(result: TableResult, fmt: str, sglang_min_step: int = 0) -> str:
    """The table as vLLM's keys (``vllm``), TensorRT-LLM's schedule (``trtllm``), SGLang's adaptive config
    (``sglang``, ``tabletune.sglang_config``) or with predictions (``json``)."""
    k_max = max(result.ks)
    if fmt == "sglang":
        return json.dumps(to_sglang(result.table, sglang_min_step))
    if fmt == "vllm":
        return json.dumps(result.table.to_vllm(k_max))
    if fmt == "trtllm":
        return json.dumps(result.table.to_trtllm())
    return json.dumps({
        **result.table.to_vllm(k_max),
        "ks": list(result.ks),
        "predictions": [
            {"batch_size": p.batch_size, "k": p.k, "goodput_tok_s": round(p.goodput, 3),
             "loss_vs_best_fixed": round(p.loss_vs_best_fixed, 6),
             "fixed_goodput_tok_s": {str(k): round(g, 3) for k, g in p.fixed_goodput.items()}}
            for p in result.predictions
        ],
    }, indent=2)


def print_predictions(result: TableResult, console: Console) -> None:
    """Goodput of the table and of every fixed k at the geometric batch sizes and the range edges."""
    t = Table(title=f"table {result.table}", show_lines=False)
    for name in ("b", "k", "table tok/s", *(f"k={k}" for k in result.ks), "loss vs best"):
        t.add_column(name, justify="right")
    n = len(result.predictions)
    edges = {s for s, _, _ in result.table.ranges} | {e for _, e, _ in result.table.ranges if e <= n}
    for b in sorted(set(geometric_batch_sizes(n)) | edges):
        p = result.predictions[b - 1]
        t.add_row(str(b), str(p.k), f"{p.goodput:.0f}", *[f"{p.fixed_goodput[k]:.0f}" for k in result.ks],
                  f"{p.loss_vs_best_fixed:.2%}")
    console.print(t)
    k = result.best_single_k
    mean, worst = result.gain_vs_fixed(k)
    console.print(f"best single fixed k={k}: table gains {mean:+.1%} on average, {worst:+.1%} at worst")
    if result.tolerance:  # a table smoothed within noise: is it worth using over the best fixed k?
        console.print(verdict(result).summary())

