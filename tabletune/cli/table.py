"""``tabletune table``: the goodput-optimal draft-length table from a step profile and acceptance rates.

Several ``--step-times`` (one StepProfile JSON per context length) give a 2-D table
(``tabletune.table.ContextTable``): each profile's ``context_len`` bounds its row, the
last row is open-ended, and each row holds that profile's 1-D optimal ranges.
"""

from __future__ import annotations

import json

import click

from tabletune import fileio
from tabletune.acceptance import load_acceptance
from tabletune.cli.common import format_table, optimize_options, print_predictions, stderr_console
from tabletune.errors import InputError
from tabletune.optimizer import optimize_table
from tabletune.profile import StepProfile
from tabletune.simple_table import DEFAULT_NOISE_FLOOR, smooth_within_noise
from tabletune.table import ContextRow, ContextTable


@click.command("table")
@click.option("--step-times", required=True, multiple=True,
              help="CSV (batch_size,k,step_ms) or step_profile.json; repeat (profiles of several context lengths) "
                   "for a by-context table")
@click.option("--acceptance", required=True, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--workload", default=None, help="entry of acceptance.json to use")
@click.option("--temperature", type=float, default=None, help="entry of acceptance.json to use")
@click.option("--max-batch", type=click.IntRange(min=1), default=None, help="default: largest measured batch size")
@click.option("--k-max", type=click.IntRange(min=0), default=None)
@click.option("--ks", default=None, help="allowed k only, e.g. 0,1,3")
@click.option("--min-gain", type=click.FloatRange(min=0), default=0.0,
              help="change k between ranges only for this gain")
@click.option("--format", "fmt", type=click.Choice(["vllm", "trtllm", "sglang", "json"]), default="vllm",
              help="sglang: SGLang's --speculative-adaptive-config (docs/formats.md)")
@click.option("--sglang-min-step", type=click.IntRange(0, 1), default=0, show_default=True,
              help="with --format sglang: 1 for SGLang releases whose candidate_steps must be >= 1 (no step 0)")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="write here (atomically)")
@click.option("--quiet", is_flag=True, help="print only the table")
@click.option("--model-draft-rate", is_flag=True,
              help="with an acceptance.json: optimise with its draft rate q (linear cost model; opt-in)")
@click.option("--within-noise", is_flag=True,
              help="change k between batch sizes only for a difference the points resolve (as tune does)")
@click.option("--noise-floor", type=click.FloatRange(min=0), default=DEFAULT_NOISE_FLOOR, show_default=True,
              help="with --within-noise: the least gain a change of k must show at some batch size of its range")
def table_cmd(step_times, acceptance, workload, temperature, max_batch, k_max, ks, min_gain, fmt, sglang_min_step,
              output, quiet, model_draft_rate, within_noise, noise_floor):
    """Compute the goodput-optimal draft-length table (2-D by context with several --step-times)."""
    profiles = [StepProfile.load(path) for path in step_times]
    rates, draft_rate = load_acceptance(acceptance, workload, temperature)
    results = []
    for profile in profiles:
        options = optimize_options(profile, len(rates), max_batch, k_max, ks, min_gain,
                                   draft_rate if model_draft_rate else 1.0)
        results.append(smooth_within_noise(profile, rates, options, noise_floor) if within_noise
                       else optimize_table(profile, rates, options))
    if len(profiles) > 1:
        text = json.dumps(by_context(profiles, results, fmt).to_json())
    else:
        text = format_table(results[0], fmt, sglang_min_step)
    result = results[0]
    if output:
        fileio.write_text(output, text + "\n")
    if not quiet:
        print_predictions(result, stderr_console())
    click.echo(text)


def by_context(profiles, results, fmt: str) -> ContextTable:
    """Rows sorted by the profiles' context_len, which must be >= 1 and distinct."""
    if fmt != "vllm":
        raise InputError("--format", "format", fmt, "a by-context table is written in the vllm format only")
    seen: dict[int, str] = {}
    for p in profiles:
        diff = profiles[0].fingerprint.mismatches(p.fingerprint)
        if diff:
            raise InputError(p.source, "fingerprint", diff, f"differs from {profiles[0].source}")
        if p.context_len < 1:
            raise InputError(p.source, "context_len", p.context_len, "a by-context table needs context_len >= 1")
        if p.context_len in seen:
            raise InputError(p.source, "context_len", p.context_len, f"same as {seen[p.context_len]}")
        seen[p.context_len] = p.source
    rows = sorted(((p.context_len, r.table) for p, r in zip(profiles, results)), key=lambda row: row[0])
    return ContextTable(tuple(ContextRow(n, t) for n, t in rows))
