"""The ``tabletune`` command line: one function per subcommand, the logic in the library."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from tabletune import fileio
from tabletune.acceptance import load_acceptance
from tabletune.errors import InputError
from tabletune.optimizer import OptimizeOptions, TableResult, optimize_table
from tabletune.profile import StepProfile, parse_int_list

console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def input_errors_exit_2(fn: Callable) -> Callable:
    """Bad input: one clear line on stderr, exit code 2, no traceback."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, ValueError, KeyError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            click.echo(f"tabletune: error: {msg}", err=True)
            sys.exit(2)

    return wrapper


@click.group()
@click.version_option(package_name="tabletune")
def main() -> None:
    """TableTune: measured draft-length tables for speculative decoding."""


def _options(max_batch: int | None, k_max: int | None, lengths: str | None, min_gain: float,
             draft_rate: float = 1.0) -> OptimizeOptions:
    return OptimizeOptions(
        max_batch=max_batch,
        k_max=k_max,
        lengths=tuple(parse_int_list(lengths, "--lengths", "lengths")) if lengths else None,
        min_gain=min_gain,
        draft_rate=draft_rate,
    )


def format_table(result: TableResult, fmt: str) -> str:
    if fmt == "vllm":
        return json.dumps(result.table.to_vllm(max(result.lengths)))
    if fmt == "trtllm":
        return json.dumps(result.table.to_trtllm())
    return json.dumps({
        **result.table.to_vllm(max(result.lengths)),
        "lengths": list(result.lengths),
        "predictions": [
            {"batch_size": p.batch_size, "k": p.k, "goodput_tok_s": round(p.goodput, 3),
             "loss_vs_best_fixed": round(p.loss_vs_best_fixed, 6),
             "fixed_goodput_tok_s": {str(k): round(g, 3) for k, g in p.fixed_goodput.items()}}
            for p in result.predictions
        ],
    }, indent=2)


def print_predictions(result: TableResult) -> None:
    t = Table(title=f"table {result.table}", show_lines=False)
    t.add_column("b", justify="right")
    t.add_column("k", justify="right")
    t.add_column("table tok/s", justify="right")
    for k in result.lengths:
        t.add_column(f"k={k}", justify="right")
    t.add_column("loss vs best", justify="right")
    n = len(result.predictions)
    shown = sorted({1, n} | {b for b in (2 ** i for i in range(12)) if b <= n} |
                   {s for s, _, _ in result.table.ranges} | {e for _, e, _ in result.table.ranges if e <= n})
    for b in shown:
        p = result.predictions[b - 1]
        t.add_row(str(b), str(p.k), f"{p.goodput:.0f}", *[f"{p.fixed_goodput[k]:.0f}" for k in result.lengths],
                  f"{p.loss_vs_best_fixed:.2%}")
    console.print(t)
    k = result.best_single_k
    mean, worst = result.gain_vs_fixed(k)
    console.print(f"best single fixed k={k}: table gains {mean:+.1%} on average, {worst:+.1%} at worst")


@main.command("table")
@click.option("--step-times", required=True, help="CSV (batch_size,k,step_ms) or step_profile.json")
@click.option("--acceptance", required=True, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--workload", default=None, help="entry of acceptance.json to use")
@click.option("--temperature", type=float, default=None, help="entry of acceptance.json to use")
@click.option("--max-batch", type=int, default=None, help="default: largest measured batch size")
@click.option("--k-max", type=int, default=None)
@click.option("--lengths", default=None, help="allowed k only, e.g. 0,1,3")
@click.option("--min-gain", type=float, default=0.0, help="change k between ranges only for this gain")
@click.option("--format", "fmt", type=click.Choice(["vllm", "trtllm", "json"]), default="vllm")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="write here (atomically)")
@click.option("--quiet", is_flag=True, help="print only the table")
@click.option("--model-draft-rate", is_flag=True,
              help="with an acceptance.json: optimise with its draft rate q (linear cost model; opt-in)")
@input_errors_exit_2
def table_cmd(step_times, acceptance, workload, temperature, max_batch, k_max, lengths, min_gain, fmt, output, quiet,
              model_draft_rate):
    """Compute the goodput-optimal draft-length table."""
    profile = StepProfile.load(step_times)
    rates, draft_rate = load_acceptance(acceptance, workload, temperature)
    draft_rate = draft_rate if model_draft_rate else 1.0
    result = optimize_table(profile, rates, _options(max_batch, k_max, lengths, min_gain, draft_rate))
    text = format_table(result, fmt)
    if output:
        fileio.write_text(output, text + "\n")
    if not quiet:
        print_predictions(result)
    click.echo(text)


@main.command("show")
@click.option("--step-times", required=True, help="CSV (batch_size,k,step_ms) or step_profile.json")
@click.option("--acceptance", default=None, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--workload", default=None)
@click.option("--temperature", type=float, default=None)
@click.option("--max-batch", type=int, default=None)
@click.option("--k-max", type=int, default=None)
@click.option("--lengths", default=None)
@click.option("--png", "png", type=click.Path(dir_okay=False), default="tabletune.png", show_default=True)
@click.option("--model-draft-rate", is_flag=True,
              help="with an acceptance.json: optimise with its draft rate q (linear cost model; opt-in)")
@input_errors_exit_2
def show_cmd(step_times, acceptance, workload, temperature, max_batch, k_max, lengths, png, model_draft_rate):
    """Plot T(b,k), goodput per k and the chosen table to a PNG; print a summary."""
    from tabletune.show import render_png, summary_lines

    profile = StepProfile.load(step_times)
    rates, draft_rate = load_acceptance(acceptance, workload, temperature) if acceptance else (None, 1.0)
    draft_rate = draft_rate if model_draft_rate else 1.0
    result = render_png(profile, rates, png, _options(max_batch, k_max, lengths, 0.0, draft_rate),
                        title=Path(step_times).name)
    for line in summary_lines(profile, result):
        click.echo(line)
    click.echo(f"wrote {png}")


# simulator and experiments (issue 5): command code in tabletune/experiments/commands.py
from tabletune.experiments.commands import experiment_cmd, simulate_cmd  # noqa: E402

main.add_command(simulate_cmd)
main.add_command(experiment_cmd)

# `tabletune tune` (issue 3): command code in tabletune/tune_cli.py
from tabletune import tune_cli  # noqa: E402,F401  (registers the command on `main`)

# `tabletune acceptance` (issue 7): command code in tabletune/cli_acceptance.py
from tabletune.cli_acceptance import acceptance_cmd  # noqa: E402

main.add_command(acceptance_cmd)

# `tabletune control` (issue 4): the Prometheus sidecar, command code in tabletune/control_cli.py
from tabletune import control_cli  # noqa: E402,F401  (registers the command on `main`)

