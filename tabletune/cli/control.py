"""``tabletune control``: the controller as a sidecar over vLLM's Prometheus endpoint.

It prints, every interval, the acceptance estimate and the recommended table, and
with ``--output`` writes it as a table file (point the replicas' ``TABLETUNE_TABLE_FILE``
at it to pin it). Several ``--metrics-url`` pool the replicas' counters into one estimate.
See ``tabletune.integrations.prometheus`` for the counters it reads.
"""

from __future__ import annotations

import json
import sys
import time
from http.client import HTTPException
from pathlib import Path

import click

from tabletune import fileio
from tabletune.controller import load_controller
from tabletune.errors import InputError
from tabletune.table import DraftTable


def table_in_force(spec: str | None, profile_dir: Path) -> DraftTable | None:
    """--table as JSON ranges or a table file; default: DIR/table.json if ``tabletune tune`` wrote one."""
    if spec is None:
        default = profile_dir / "table.json"
        return DraftTable.load(default) if default.exists() else None
    if Path(spec).exists():
        return DraftTable.load(spec)
    try:
        ranges = json.loads(spec)
    except json.JSONDecodeError:
        raise InputError("--table", "table", spec, "neither a file nor JSON ranges like [[1,8,3],[9,64,1]]") from None
    return DraftTable.from_ranges(ranges, source="--table")


@click.command("control")
@click.option("--metrics-url", "urls", required=True, multiple=True,
              help="vLLM's Prometheus endpoint, e.g. http://127.0.0.1:8000/metrics; repeat it to pool replicas")
@click.option("--profile", "profile_dir", required=True, type=click.Path(file_okay=False),
              help="folder written by `tabletune tune` (step_profile.json, acceptance.json)")
@click.option("--table", "table", default=None, help="the table vLLM runs (JSON ranges or file); default DIR/table.json")
@click.option("--k-max", type=click.IntRange(min=1), default=None,
              help="vLLM's num_speculative_tokens (default: the profile's)")
@click.option("--max-batch", type=click.IntRange(min=1), default=None,
              help="vLLM's max_num_seqs (default: the profile's)")
@click.option("--options", default="", help="controller options as JSON, e.g. '{\"half_life_s\": 120}'")
@click.option("--interval-s", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True)
@click.option("--iterations", type=int, default=0, help="stop after N scrapes (0: run until interrupted)")
@click.option("--output", type=click.Path(dir_okay=False), default=None,
              help="write the recommendation here (vLLM format, atomically) at start and on every change")
def control_cmd(urls, profile_dir, table, k_max, max_batch, options, interval_s, iterations, output):
    """Estimate acceptance from vLLM's counters and print the recommended table over time."""
    from tabletune.integrations.prometheus import Sidecar

    start = table_in_force(table, Path(profile_dir))
    try:  # one observation per scrape window: rebuild after any window unless told otherwise
        options = json.dumps({"rebuild_every_steps": 1, **json.loads(options or "{}")})
    except (json.JSONDecodeError, TypeError):
        raise InputError("--options", "options", options, "must be a JSON object") from None
    controller = load_controller(profile_dir, options, start, k_max, max_batch, source="--options")
    sidecar = Sidecar(controller, start or controller.table)
    click.echo(f"table in force {sidecar.table_in_force}; k_max {controller.k_max}; prior {controller.estimator.prior}")
    if output:
        fileio.write_json(output, controller.table.to_vllm(controller.k_max))
    n = 0
    while iterations <= 0 or n < iterations:
        n += 1
        now = time.monotonic()
        obs = sidecar.feed_all({url: scrape_counters(url) for url in urls}, now)
        new = controller.maybe_rebuild(now)
        rates = [round(r, 3) for r in controller.estimator.rates()]
        drafts = obs.num_drafts if obs else 0
        click.echo(f"[{n}] drafts {drafts} acceptance {rates} recommended {controller.table}"
                   + (" (changed)" if new is not None else ""))
        if output and new is not None:
            fileio.write_json(output, controller.table.to_vllm(controller.k_max))
        sys.stdout.flush()
        if iterations <= 0 or n < iterations:
            time.sleep(interval_s)


def scrape_counters(url: str):
    """One replica's counters, or None (an unreachable or garbled endpoint skips one window)."""
    from tabletune.integrations.prometheus import parse_metrics, scrape

    try:
        return parse_metrics(scrape(url))
    except (OSError, ValueError, HTTPException) as exc:
        click.echo(f"scrape of {url} failed: {exc}", err=True)
        return None
