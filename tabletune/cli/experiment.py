"""``tabletune experiment``: the paper's experiments, simulated from measured inputs (``tabletune.experiments``)."""

from __future__ import annotations

from pathlib import Path

import click

from tabletune.errors import InputError
from tabletune.profile import parse_int_list


@click.command("experiment")
@click.argument("name", type=click.Choice(["fig1", "table1", "fig3", "table2", "fig4b", "moe", "all"]))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="output folder")
@click.option("--profiles", "profiles_dir", default="profiles", show_default=True,
              type=click.Path(file_okay=False), help="folder with the settings' h200/, acceptance/ and traces/ files")
@click.option("--results", "results_dir", default="benchmarks/results", show_default=True,
              type=click.Path(file_okay=False), help="measured results (the H200 mixed-step check sets the draft share)")
@click.option("--loads", default="1,2,4,8,16,32,64,96,128", show_default=True)
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True, help="number of seeds")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="simulated seconds per point")
@click.option("--fig3-settings", default="eagle", show_default=True, help="comma-separated Table 1 settings")
@click.option("--fig4b-loads", default="", help="loads for every fig4b switch (default: each switch's own load)")
@click.option("--no-per-request", is_flag=True, help="skip the per-request policies in fig3")
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="worker processes")
def experiment_cmd(name, out_dir, profiles_dir, results_dir, loads, seeds, duration, fig3_settings, fig4b_loads,
                   no_per_request, jobs):
    """Run one of the paper's experiments (or all), simulated from measured inputs: CSV, PNG and markdown to --out.

    ``tabletune report`` runs them all and renders one report."""
    from tabletune.experiments.report import ExperimentOptions, run_experiments

    from tabletune.experiments.settings import TABLE1

    settings = tuple(s.strip() for s in fig3_settings.split(",") if s.strip())
    unknown = [s for s in settings if s not in TABLE1]
    if unknown or not settings:
        raise InputError("--fig3-settings", "fig3_settings", fig3_settings, f"choose from {list(TABLE1)}")
    opts = ExperimentOptions(loads=_loads(loads, "--loads"), seeds=tuple(range(seeds)), duration_s=duration,
                             fig3_settings=settings, fig4b_loads=_loads(fig4b_loads, "--fig4b-loads") if fig4b_loads else (),
                             per_request=not no_per_request, jobs=jobs, profiles=profiles_dir, results=results_dir)
    check_inputs(opts)
    out = Path(out_dir)
    sections = run_experiments([name], out, opts)
    for section in sections:
        click.echo(f"{section.key}: wrote {', '.join(section.files)} and {section.key}.md to {out}")


def check_inputs(opts) -> None:
    """Every setting's input file must exist: a missing one is bad input (one line, exit 2)."""
    from tabletune.experiments.settings import SETTINGS

    root = Path(opts.profiles)
    for setting in SETTINGS.values():
        for field in ("profile", "acceptance", "ngram_trace"):
            rel = getattr(setting, field)
            if rel is not None and not (root / rel).is_file():
                raise InputError("--profiles", f"{setting.name}.{field}", str(root / rel), "file not found")


def _loads(text: str, flag: str) -> tuple[int, ...]:
    """Closed-loop loads: the experiments' engine holds at most 128 requests."""
    loads = tuple(parse_int_list(text, flag, "loads"))
    if not loads or min(loads) < 1 or max(loads) > 128:
        raise InputError(flag, "loads", list(loads), "must lie in 1..128")
    return loads
