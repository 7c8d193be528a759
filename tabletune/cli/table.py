"""``tabletune table``: the draft-length table from a step profile and acceptance rates.

By default the table ``tabletune tune`` writes (``tabletune.simple_table.smooth_within_noise``: k
changes only where the change gains beyond the noise), so that on a tune's own files it writes the
tune's ``table.json``; ``--exact`` writes the exact optimum per batch size
(``tabletune.optimizer.optimize_table``).

Several ``--step-times`` (one StepProfile JSON per context length) give a 2-D table
(``tabletune.table.ContextTable``): each profile's ``context_len`` bounds its row, the
last row is open-ended, and each row holds that profile's 1-D ranges.
"""

from __future__ import annotations

import dataclasses
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
from tabletune.tuner.files import load_yields


@click.command("table")
@click.option("--step-times", required=True, multiple=True,
              help="CSV (batch_size,k,step_ms) or step_profile.json; repeat (profiles of several context lengths) "
                   "for a by-context table")
@click.option("--acceptance", required=True, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--yields", "yields_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="a tune's yields.json (a drafter that proposes only on a match): the table is built from these "
                   "per-k yields, as the tune built it; once, or once per --step-times")
@click.option("--workload", default=None, help="entry of acceptance.json to use")
@click.option("--temperature", type=float, default=None, help="entry of acceptance.json to use")
@click.option("--max-batch", type=click.IntRange(min=1), default=None, help="default: largest measured batch size")
@click.option("--k-max", type=click.IntRange(min=0), default=None)
@click.option("--ks", default=None, help="allowed k only, e.g. 0,1,3")
@click.option("--exact", is_flag=True,
              help="the exact optimum per batch size, every change of k kept however small (default: the table "
                   "tune writes, k changed only where the change gains beyond the noise)")
@click.option("--noise-floor", type=click.FloatRange(min=0), default=DEFAULT_NOISE_FLOOR, show_default=True,
              help="the least gain a change of k must show at some batch size of its range (not with --exact)")
@click.option("--min-gain", type=click.FloatRange(min=0), default=0.0,
              help="with --exact: change k between neighbouring batch sizes only for this gain")
@click.option("--format", "fmt", type=click.Choice(["vllm", "trtllm", "sglang", "json"]), default="vllm",
              help="sglang: SGLang's --speculative-adaptive-config (docs/formats.md)")
@click.option("--sglang-min-step", type=click.IntRange(0, 1), default=0, show_default=True,
              help="with --format sglang: 1 for SGLang releases whose candidate_steps must be >= 1 (no step 0)")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="write here (atomically)")
@click.option("--quiet", is_flag=True, help="print only the table")
@click.option("--model-draft-rate", is_flag=True,
              help="with an acceptance.json: optimise with its draft rate q (linear cost model; opt-in)")
@click.pass_context
def table_cmd(ctx, step_times, acceptance, yields_paths, workload, temperature, max_batch, k_max, ks, exact,
              noise_floor, min_gain, fmt, sglang_min_step, output, quiet, model_draft_rate):
    """The draft-length table tune writes (--exact: the exact optimum); 2-D by context with several --step-times."""
    given = ctx.get_parameter_source("noise_floor") is not click.core.ParameterSource.DEFAULT
    check_mode(exact, min_gain, noise_floor if given else None)
    profiles = [StepProfile.load(path) for path in step_times]
    rates, draft_rate = load_acceptance(acceptance, workload, temperature)
    yields = per_profile_yields(yields_paths, len(profiles), model_draft_rate)
    results = []
    for profile, (measured, share) in zip(profiles, yields):
        options = optimize_options(profile, len(rates), max_batch, k_max, ks, min_gain,
                                   draft_rate if model_draft_rate else 1.0)
        options = dataclasses.replace(options, yields=measured, draft_share=share)
        results.append(optimize_table(profile, rates, options) if exact
                       else smooth_within_noise(profile, rates, options, noise_floor))
    if len(profiles) > 1:
        text = json.dumps(by_context(profiles, results, fmt).to_json())
    else:
        text = format_table(results[0], fmt, sglang_min_step)
    if output:
        fileio.write_text(output, text + "\n")
    if not quiet:
        print_predictions(results[0], stderr_console())
    click.echo(text)


def check_mode(exact: bool, min_gain: float, noise_floor: float | None) -> None:
    """``--min-gain`` belongs to ``--exact`` and ``--noise-floor`` to the default table: refuse a flag that
    would be ignored."""
    if min_gain > 0 and not exact:
        raise InputError("--min-gain", "min_gain", min_gain,
                         "applies to --exact only (the default table changes k only beyond --noise-floor)")
    if exact and noise_floor is not None:
        raise InputError("--noise-floor", "noise_floor", noise_floor, "applies to the default table, not to --exact")


def per_profile_yields(paths, num_profiles: int, model_draft_rate: bool) -> list[tuple[tuple, float | None]]:
    """(yields, draft share) per profile from ``--yields``: none, one for all, or one per ``--step-times``."""
    if not paths:
        return [((), None)] * num_profiles
    if model_draft_rate:
        raise InputError("--model-draft-rate", "model_draft_rate", True, "the --yields replace the draft rate")
    if len(paths) not in (1, num_profiles):
        raise InputError("--yields", "yields", len(paths), f"give one, or one per --step-times ({num_profiles})")
    loaded = [load_yields(path) for path in paths]
    return loaded * num_profiles if len(loaded) == 1 else loaded


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
