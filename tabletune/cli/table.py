"""``tabletune table``: the goodput-optimal draft-length table from a step profile and acceptance rates."""

from __future__ import annotations

import click

from tabletune import fileio
from tabletune.acceptance import load_acceptance
from tabletune.cli.common import format_table, optimize_options, print_predictions, stderr_console
from tabletune.optimizer import optimize_table
from tabletune.profile import StepProfile


@click.command("table")
@click.option("--step-times", required=True, help="CSV (batch_size,k,step_ms) or step_profile.json")
@click.option("--acceptance", required=True, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--workload", default=None, help="entry of acceptance.json to use")
@click.option("--temperature", type=float, default=None, help="entry of acceptance.json to use")
@click.option("--max-batch", type=click.IntRange(min=1), default=None, help="default: largest measured batch size")
@click.option("--k-max", type=click.IntRange(min=0), default=None)
@click.option("--ks", default=None, help="allowed k only, e.g. 0,1,3")
@click.option("--min-gain", type=click.FloatRange(min=0), default=0.0,
              help="change k between ranges only for this gain")
@click.option("--format", "fmt", type=click.Choice(["vllm", "trtllm", "json"]), default="vllm")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="write here (atomically)")
@click.option("--quiet", is_flag=True, help="print only the table")
@click.option("--model-draft-rate", is_flag=True,
              help="with an acceptance.json: optimise with its draft rate q (linear cost model; opt-in)")
def table_cmd(step_times, acceptance, workload, temperature, max_batch, k_max, ks, min_gain, fmt, output, quiet,
              model_draft_rate):
    """Compute the goodput-optimal draft-length table."""
    profile = StepProfile.load(step_times)
    rates, draft_rate = load_acceptance(acceptance, workload, temperature)
    options = optimize_options(profile, len(rates), max_batch, k_max, ks, min_gain,
                               draft_rate if model_draft_rate else 1.0)
    result = optimize_table(profile, rates, options)
    text = format_table(result, fmt)
    if output:
        fileio.write_text(output, text + "\n")
    if not quiet:
        print_predictions(result, stderr_console())
    click.echo(text)
