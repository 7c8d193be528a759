"""``tabletune show``: plot T(b, k), goodput per k and the chosen table to a PNG; print a summary."""

from __future__ import annotations

from pathlib import Path

import click

from tabletune.acceptance import load_acceptance
from tabletune.cli.common import optimize_options
from tabletune.optimizer import TableResult
from tabletune.profile import StepProfile
from tabletune.simple_table import smooth_within_noise


@click.command("show")
@click.option("--step-times", required=True, help="CSV (batch_size,k,step_ms) or step_profile.json")
@click.option("--acceptance", default=None, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--workload", default=None)
@click.option("--temperature", type=float, default=None)
@click.option("--max-batch", type=click.IntRange(min=1), default=None)
@click.option("--k-max", type=click.IntRange(min=0), default=None)
@click.option("--ks", default=None, help="allowed k only, e.g. 0,1,3")
@click.option("--png", "png", type=click.Path(dir_okay=False), default="tabletune.png", show_default=True)
@click.option("--model-draft-rate", is_flag=True,
              help="with an acceptance.json: optimise with its draft rate q (linear cost model; opt-in)")
@click.option("--against", default=None, type=click.Path(exists=True, dir_okay=False),
              help="another step_profile.json: print T(b, k) of this one over it, per cell measured in both")
def show_cmd(step_times, acceptance, workload, temperature, max_batch, k_max, ks, png, model_draft_rate, against):
    """Plot T(b,k), goodput per k and the chosen table to a PNG; print a summary."""
    from tabletune.plot import draw_tune_png

    profile = StepProfile.load(step_times)
    result = None
    if acceptance:
        rates, draft_rate = load_acceptance(acceptance, workload, temperature)
        options = optimize_options(profile, len(rates), max_batch, k_max, ks, 0.0,
                                   draft_rate if model_draft_rate else 1.0)
        result = smooth_within_noise(profile, rates, options)  # the table `tabletune table` writes
    draw_tune_png(profile, result, png, title=Path(step_times).name)
    for line in summary_lines(profile, result):
        click.echo(line)
    if against:
        from tabletune.profile_ratio import cell_ratios, ratio_markdown

        other = StepProfile.load(against)
        for line in ratio_markdown(cell_ratios(profile, other), describe(profile), describe(other)):
            click.echo(line)
    click.echo(f"wrote {png}")


def describe(profile: StepProfile) -> str:
    """The engine, its version and the context of a profile, for a comparison's header."""
    fp = profile.fingerprint
    return " ".join(filter(None, (fp.engine or "?", fp.engine_version))) + f" (context {profile.context_len})"


def summary_lines(profile: StepProfile, result: TableResult | None) -> list[str]:
    """Where the profile comes from, its grid and extremes, and the table's gain over the best fixed k."""
    fp = profile.fingerprint
    b_max, k_last = profile.max_batch_size, profile.ks[-1]
    lines = [
        f"profile: {profile.source}",
        f"  engine={fp.engine} {fp.engine_version} device={fp.device or '?'} model={fp.model or '?'} "
        f"dtype={fp.dtype or '?'} drafter={fp.drafter or '?'} context={profile.context_len}",
        f"  batch sizes {profile.batch_sizes[0]}..{b_max} ({len(profile.batch_sizes)} measured), k in {profile.ks}",
        f"  T(1,{profile.ks[0]})={profile.step_ms(1, profile.ks[0]):.3f} ms, "
        f"T({b_max},{k_last})={profile.step_ms(b_max, k_last):.3f} ms",
    ]
    if result:
        k = result.best_single_k
        mean, worst = result.gain_vs_fixed(k)
        lines.append(f"  table: {result.table}")
        lines.append(f"  vs best single fixed k={k}: mean gain {mean:+.1%}, at worst {worst:+.1%}")
    return lines
