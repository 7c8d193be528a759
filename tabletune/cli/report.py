"""``tabletune report``: every experiment and measured result in one ``report.md`` with its PNGs."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from tabletune.cli.experiment import check_inputs


@click.command("report")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="output folder")
@click.option("--quick", is_flag=True, help="a one-minute version (fewer loads, one seed, short runs)")
@click.option("--profiles", "profiles_dir", default="profiles", show_default=True,
              type=click.Path(file_okay=False), help="folder with the settings' h200/, acceptance/ and traces/ files")
@click.option("--results", "results_dir", default="benchmarks/results", show_default=True,
              type=click.Path(file_okay=False), help="measured results to collect (H200 policy grid, controller)")
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="worker processes")
def report_cmd(out_dir, quick, profiles_dir, results_dir, jobs):
    """Run or collect every experiment and render OUT/report.md (at most ~10 minutes on 2 cores; --quick ~1)."""
    from tabletune.experiments.report import REPORT_FULL, REPORT_QUICK, build_report

    opts = dataclasses.replace(REPORT_QUICK if quick else REPORT_FULL, profiles=profiles_dir, results=results_dir,
                               jobs=jobs)
    check_inputs(opts)
    out = Path(out_dir)
    command = "tabletune report " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["report"] else "tabletune report"
    sections = build_report(out, opts, command)
    click.echo(f"report: {out / 'report.md'} ({len(sections)} sections)")
