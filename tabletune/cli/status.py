"""``tabletune status``: the live state of the plugin's controller, read from vLLM's ``/metrics``."""

from __future__ import annotations

import json
from http.client import HTTPException

import click

from tabletune.errors import InputError


def fetch_state(url: str) -> dict[str, dict]:
    """The ``tabletune_*`` series of one server, per engine; an unreachable or plugin-less URL is bad input."""
    from tabletune.integrations.prometheus import parse_tabletune, scrape

    try:
        text = scrape(url)
    except (OSError, HTTPException) as exc:
        raise InputError("--metrics-url", "url", url, f"cannot scrape: {exc}") from None
    try:
        engines = parse_tabletune(text)
    except ValueError as exc:
        raise InputError("--metrics-url", "url", url, f"not a Prometheus exposition: {exc}") from None
    if not engines:
        raise InputError("--metrics-url", "url", url,
                         "no tabletune_* series (is the plugin installed and TABLETUNE_PROFILE set?)")
    return engines


def describe(url: str, engine: str, e: dict) -> list[str]:
    honoured = e.get("table_honoured")
    rates = " ".join(f"{r:.3f}" for r in e["acceptance"])
    return [
        f"{url} engine {engine}: table {json.dumps(e['table'])}{' (pinned)' if e.get('pinned') else ''}"
        f", k_max {int(e.get('k_max', 0))}",
        f"  acceptance a_j {rates}; draft rate {e.get('draft_rate', 1.0):.3f}",
        f"  steps {int(e.get('steps', 0))}, drafts {int(e.get('drafts', 0))}"
        f", installs {int(e.get('table_installs', 0))}, exploration steps {int(e.get('exploration_steps', 0))}",
        f"  ignored windows {e.get('ignored_windows', {})}, fail-open errors {e.get('errors', {})}"
        f", table-file versions refused {int(e.get('table_file_rejected', 0))}",
        f"  table honoured {'unknown' if honoured is None else bool(honoured)}"
        f", snapshot age {e.get('snapshot_age_seconds', 0.0):.1f} s",
    ]


@click.command("status")
@click.option("--metrics-url", "urls", required=True, multiple=True,
              help="vLLM's Prometheus endpoint, e.g. http://127.0.0.1:8000/metrics (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object {url: {engine: state}}")
def status_cmd(urls, as_json):
    """Print the live table, acceptance estimate and counters of the plugin's controller."""
    states = {url: fetch_state(url) for url in urls}
    if as_json:
        click.echo(json.dumps(states))
        return
    for url, engines in states.items():
        for engine, e in sorted(engines.items()):
            for line in describe(url, engine, e):
                click.echo(line)
