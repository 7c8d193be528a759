"""``tabletune_*`` series on vLLM's own ``/metrics``.

Where the numbers live and where ``/metrics`` is served are different processes
under ``vllm serve``: the controller runs in the engine core, the HTTP server in
the API server. Of the two hooks vLLM offers, only the registry one can carry
them (checked on vLLM 0.32):

* a stat-logger plugin (entry point group ``vllm.stat_logger_plugins``) runs in
  the API server and receives ``SchedulerStats``, a msgspec-serialised dataclass
  with fixed fields: nothing of ours crosses the process boundary with it;
* the server's Prometheus registry takes any collector: the default registry with
  one API server; with several (``--api-server-count``), a fresh registry around a
  ``MultiProcessCollector`` per scrape, whose output the plugin extends
  (``register_collector``).

So the engine core *publishes* a small JSON snapshot, atomically, at most once a
second (and at every install, pin or refusal) into ``TABLETUNE_METRICS_DIR``
(one file per data-parallel engine, ``engine-<rank>.json``), and a collector
registered in the API server's registry reads the snapshots at each scrape. The
plugin creates the folder and exports the variable in the first process that
loads it (``vllm serve``'s launcher), so every process it starts inherits it;
set it yourself to put the snapshots elsewhere. The same path works with the
engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): there the
publisher and the collector are one process.

Series (label ``engine``: the data-parallel rank):

====================================================  =======  =============================================
``tabletune_k{start_bs,end_bs}``                       gauge    k of each range of the table in force
``tabletune_k_max``                                    gauge    the engine's num_speculative_tokens
``tabletune_acceptance{position}``                     gauge    conditional acceptance estimate a_j (1-based)
``tabletune_draft_rate``                               gauge    share of request-steps that drafted (q)
``tabletune_table_installs_total``                     counter  tables the controller installed
``tabletune_exploration_steps_total``                  counter  steps that drafted k_max to explore
``tabletune_ignored_windows_total{reason}``            counter  observation windows ignored (NaN, ...)
``tabletune_errors_total{kind}``                       counter  fail-open errors (serving went on)
``tabletune_table_honoured``                           gauge    1/0: the engine drafts the table's k (when known)
``tabletune_pinned``                                   gauge    1 while a table file pins the table
``tabletune_table_file_rejected_total``                counter  table-file versions refused
``tabletune_steps_total``, ``tabletune_drafts_total``  counter  steps and verified drafts observed
``tabletune_reached_total{position}``                  counter  drafts that reached position j (censored counts)
``tabletune_accepted_total{position}``                 counter  drafts accepted at position j
``tabletune_undrafted_total``                          counter  request-steps that asked for k >= 1, drafted none
``tabletune_snapshot_age_seconds``                     gauge    seconds since the engine published
====================================================  =======  =============================================

The reached/accepted counters are exact and undecayed, so a sidecar can pool
several replicas (``tabletune control --metrics-url A --metrics-url B``).
"""

from __future__ import annotations

import atexit
import glob
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tabletune import fileio

METRICS_DIR_ENV = "TABLETUNE_METRICS_DIR"
PUBLISH_S = 1.0
logger = logging.getLogger("tabletune.metrics")

_collector = None
_patched = False


def setup_dir() -> Path:
    """The snapshot folder: ``TABLETUNE_METRICS_DIR``, or a new temporary folder exported under that name."""
    folder = os.environ.get(METRICS_DIR_ENV, "").strip()
    if not folder:
        folder = tempfile.mkdtemp(prefix="tabletune-metrics-")
        os.environ[METRICS_DIR_ENV] = folder  # inherited by the engine-core processes vLLM starts next
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # only the creating process removes it
    return Path(folder)


def snapshot_path(folder: str | os.PathLike[str], engine_index: int) -> Path:
    return Path(folder) / f"engine-{engine_index}.json"


def publish(path: Path, snapshot: dict) -> None:
    """Write one engine's snapshot atomically (readers never see half a file)."""
    fileio.write_text(path, json.dumps({**snapshot, "published_s": time.time()}))


def read_snapshots(folder: str | os.PathLike[str]) -> list[dict]:
    """Every engine's latest snapshot; unreadable files are skipped (a scrape must not fail)."""
    out = []
    for path in sorted(Path(folder).glob("engine-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def families(snapshots: list[dict], now_s: float | None = None) -> Iterator:
    """Prometheus metric families from engine snapshots (see the module docstring)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    now_s = time.time() if now_s is None else now_s
    g = {name: GaugeMetricFamily(f"tabletune_{name}", doc, labels=["engine", *extra])
         for name, doc, extra in (
             ("k", "draft length k of each batch-size range of the table in force", ["start_bs", "end_bs"]),
             ("k_max", "largest k the engine can draft (num_speculative_tokens)", []),
             ("acceptance", "conditional acceptance estimate at draft position j (1-based)", ["position"]),
             ("draft_rate", "share of request-steps that drafted", []),
             ("table_honoured", "1 when the engine drafts the table's k, 0 when not", []),
             ("pinned", "1 while a table file pins the table", []),
             ("snapshot_age_seconds", "seconds since the engine published this snapshot", []))}
    c = {name: CounterMetricFamily(f"tabletune_{name}", doc, labels=["engine", *extra])
         for name, doc, extra in (
             ("table_installs", "tables the controller installed", []),
             ("exploration_steps", "steps that drafted k_max to explore", []),
             ("ignored_windows", "observation windows ignored", ["reason"]),
             ("errors", "fail-open errors; serving went on with the last good table", ["kind"]),
             ("table_file_rejected", "table-file versions refused", []),
             ("steps", "engine steps observed", []),
             ("drafts", "verified drafts observed", []),
             ("reached", "drafts that reached draft position j (censored counts)", ["position"]),
             ("accepted", "drafts accepted at draft position j", ["position"]),
             ("undrafted", "request-steps that asked for k >= 1 and verified no draft", []))}
    for snap in snapshots:
        e = str(snap.get("engine", 0))
        for start, end, k in snap.get("table", []):
            g["k"].add_metric([e, str(start), str(end)], k)
        g["k_max"].add_metric([e], snap.get("k_max", 0))
        for j, rate in enumerate(snap.get("acceptance", []), 1):
            g["acceptance"].add_metric([e, str(j)], rate)
        g["draft_rate"].add_metric([e], snap.get("draft_rate", 1.0))
        if snap.get("table_honoured") is not None:
            g["table_honoured"].add_metric([e], 1.0 if snap["table_honoured"] else 0.0)
        g["pinned"].add_metric([e], 1.0 if snap.get("pinned") else 0.0)
        g["snapshot_age_seconds"].add_metric([e], max(now_s - snap.get("published_s", now_s), 0.0))
        c["table_installs"].add_metric([e], snap.get("installs", 0))
        c["exploration_steps"].add_metric([e], snap.get("explore_steps", 0))
        for reason, n in snap.get("ignored", {}).items():
            c["ignored_windows"].add_metric([e, reason], n)
        for kind, n in snap.get("errors", {}).items():
            c["errors"].add_metric([e, kind], n)
        c["table_file_rejected"].add_metric([e], snap.get("table_file_rejected", 0))
        c["steps"].add_metric([e], snap.get("steps", 0))
        c["drafts"].add_metric([e], snap.get("drafts", 0))
        for j, (r, a) in enumerate(zip(snap.get("reached_total", []), snap.get("accepted_total", [])), 1):
            c["reached"].add_metric([e, str(j)], r)
            c["accepted"].add_metric([e, str(j)], a)
        c["undrafted"].add_metric([e], snap.get("undrafted_total", 0))
    yield from g.values()
    yield from c.values()


class CumulativeDrafts:
    """Undecayed censored counts of every observation the controller accepted (for the metrics)."""

    def __init__(self, k_max: int) -> None:
        self.reached = [0] * k_max
        self.accepted = [0] * k_max
        self.undrafted = 0

    def add(self, obs) -> None:
        for j in range(min(len(obs.reached), len(self.reached))):
            self.reached[j] += round(obs.reached[j])
            self.accepted[j] += round(obs.accepted[j])
        self.undrafted += round(obs.undrafted)

    def as_dict(self) -> dict:
        return {"reached_total": list(self.reached), "accepted_total": list(self.accepted),
                "undrafted_total": self.undrafted}


class SnapshotCollector:
    """A prometheus_client collector over the snapshot folder (read at every scrape)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def collect(self) -> Iterator:
        try:
            snapshots = read_snapshots(self.folder)
        except OSError:
            snapshots = []
        yield from families(snapshots)

    def describe(self) -> list:
        return []  # names are fixed, but describing nothing keeps registration free of a first collect


def sized_db_files(path: str) -> list[str]:
    """The multiprocess ``.db`` files of a folder that already have their header (size > 0)."""
    out = []
    for name in sorted(glob.glob(os.path.join(path, "*.db"))):
        try:
            if os.path.getsize(name) > 0:
                out.append(name)
        except OSError:  # removed since the glob (a dead process's live gauge): merge skips it too
            continue
    return out


def register_collector(folder: Path) -> None:
    """Export the snapshots on /metrics in both of vLLM's registry modes (idempotent).

    One API server: ``/metrics`` serves Prometheus' default registry, where the collector is
    registered. Several (``--api-server-count N``): ``PROMETHEUS_MULTIPROC_DIR`` is set and both
    the route vLLM mounts and prometheus-fastapi-instrumentator's handler (which answers first)
    build a fresh registry around a ``MultiProcessCollector`` per scrape; there the
    collector's families are appended to ``MultiProcessCollector.collect`` in this process.

    The replacement also skips empty ``.db`` files. prometheus-client creates a process's file
    before sizing it, so a scrape that lands in between (an API server touching a metric type
    for the first time, at its first request) fails as a whole with ``struct.error`` and
    ``/metrics`` answers 500 (prometheus/client_python#1199). An empty file holds no samples,
    so skipping it loses none.
    """
    global _collector, _patched
    from prometheus_client import REGISTRY, multiprocess

    if _collector is None:
        _collector = SnapshotCollector(folder)
        REGISTRY.register(_collector)
    if _patched:
        return
    original = multiprocess.MultiProcessCollector.collect

    def collect(self):
        yield from self.merge(sized_db_files(self._path), accumulate=True)
        yield from _collector.collect()

    collect.__wrapped__ = original  # type: ignore[attr-defined]
    multiprocess.MultiProcessCollector.collect = collect
    _patched = True
