"""Table-file pinning, the metrics snapshot and its Prometheus series, pooling replicas (no vLLM engine)."""

from __future__ import annotations

import dataclasses
import json
import os

from prometheus_client import CollectorRegistry, generate_latest

from tabletune.controller import Controller, ControllerConfig
from tabletune.controller.estimator import StepObservation
from tabletune.controller.table_file import TableFileWatcher
from tabletune.integrations.prometheus import Sidecar, SpecCounters, parse_metrics
from tabletune.integrations.vllm import metrics
from tabletune.integrations.vllm.controller_hook import ControllerHook
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable

from hook_fakes import make_hook, step
from http_fixture import serve_text

PROFILE = StepProfile(tuple(StepPoint(b, k, (10 + 0.5 * b * (1 + 0.6 * k),))
                            for b in (1, 2, 4, 8, 16, 32, 64) for k in range(5)), context_len=0)
FAST = ControllerConfig(k_max=4, rebuild_interval_s=0, min_install_interval_s=0, rebuild_every_steps=1,
                        explore_fraction=0, prior_weight=1, half_life_tokens=1e9)


def write(path, obj) -> None:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 10**9,) * 2)  # a new mtime even within one clock tick


def test_watcher_pin_refuse_unpin(tmp_path):
    path = tmp_path / "table.json"
    w = TableFileWatcher(path, k_max=4, poll_s=0)
    assert w.poll(0) is None  # no file, nothing pinned
    write(path, {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 64, 1]]})
    event = w.poll(1)
    assert event.kind == "pin" and event.table.as_lists() == [[1, 8, 3], [9, 64, 1]]
    assert w.poll(2) is None  # unchanged
    write(path, "{not json")
    assert w.poll(3) is None and w.rejected == 0  # seen once: perhaps a write in progress
    event = w.poll(4)
    assert event.kind == "invalid" and str(path) in event.problem and w.pinned
    assert w.poll(5) is None  # the same bad version is refused once
    write(path, [[1, 64, 7]])
    assert w.poll(6) is None
    event = w.poll(7)
    assert event.kind == "invalid" and "exceeds num_speculative_tokens=4" in event.problem and w.pinned
    path.unlink()
    assert w.poll(8).kind == "unpin" and not w.pinned
    assert w.poll(9) is None and w.rejected == 2


def test_a_file_read_while_written_in_place_is_not_refused(tmp_path):
    """``Path.write_text`` truncates, then writes: a poll between the two reads an empty file (or, for a
    long write, a partial one). That is the write in progress, not a bad version: the next poll reads the
    whole file and pins it, with nothing refused or logged."""
    path = tmp_path / "table.json"
    w = TableFileWatcher(path, k_max=4, poll_s=0)
    write(path, [[1, 64, 2]])
    assert w.poll(0).kind == "pin"
    for partial in ("", "[[1, 8, 3], [9,"):
        write(path, partial)
        assert w.poll(1) is None
        write(path, [[1, 8, 3], [9, 64, 1]])
        event = w.poll(2)
        assert event.kind == "pin" and event.table.as_lists() == [[1, 8, 3], [9, 64, 1]]
    assert w.rejected == 0


def test_watcher_refuses_k_above_k_max_and_respects_poll_interval(tmp_path):
    path = tmp_path / "t.json"
    write(path, [[1, 64, 7]])
    w = TableFileWatcher(path, k_max=4, poll_s=10)
    assert w.poll(0) is None
    event = w.poll(10)
    assert event.kind == "invalid" and "exceeds num_speculative_tokens=4" in event.problem
    write(path, [[1, 64, 2]])
    assert w.poll(15) is None  # within the poll interval
    assert w.poll(20).kind == "pin"


def test_pinned_controller_observes_but_neither_installs_nor_explores():
    """A pin is the operator's k: the controller keeps its estimate current, drafts no k_max to explore
    (that would serve another k than the pinned one) and installs nothing until unpinned."""
    explorer = dataclasses.replace(FAST, explore_fraction=0.5)
    c = Controller(PROFILE, [0.3] * 4, explorer, table=DraftTable.from_ranges([[1, 64, 1]]))
    c.pin([[1, 64, 2]], 0.0)
    assert not any(c.explore_next(8) for _ in range(50)) and c.explore_steps == 0
    assert [c.k_for(8) for _ in range(10)] == [2] * 10
    good = StepObservation.from_drafts(8, 4, [(4, 4)] * 200, time_s=1.0)
    assert c.observe(good)
    assert c.maybe_rebuild(1.0) is None and c.table.as_lists() == [[1, 64, 2]]
    assert c.estimator.rates()[0] > 0.9  # it kept learning
    bad = StepObservation.from_drafts(8, 4, [(4, 0)] * 2000, time_s=2.0)
    c.observe(bad)
    assert c.maybe_rebuild(2.0) is None and c.state(light=True)["pinned"]
    c.unpin()
    assert c.maybe_rebuild(3.0) is not None and c.table.k_for(8) < 4
    c.set_table([[1, 64, 1]])
    assert sum(c.explore_next(8) for _ in range(10)) >= 4  # unpinned, it explores again


def bare_hook(controller: Controller, watcher=None, snapshot_file=None) -> ControllerHook:
    """The hook through its real constructor on a fake scheduler (``hook_fakes``), with the attach-time options."""
    hook = make_hook(controller)
    hook.watcher, hook.snapshot_file = watcher, snapshot_file
    return hook


def test_hook_applies_the_table_file_to_vllms_lookup(tmp_path):
    path = tmp_path / "table.json"
    c = Controller(PROFILE, [0.3] * 4, FAST, table=DraftTable.from_ranges([[1, 64, 1]]))
    hook = bare_hook(c, TableFileWatcher(path, 4, poll_s=0), tmp_path / "m" / "engine-0.json")
    write(path, [[1, 4, 4], [5, 64, 2]])
    hook.after_window(0.0)
    assert c.pinned and hook.scheduler.dynamic_sd_lookup[1:6] == [4, 4, 4, 4, 2]
    write(path, [[2, 64, 1]])  # does not start at 1
    hook.after_window(1.0)
    hook.after_window(1.5)  # refused when the next poll finds the same version
    assert c.pinned and c.table.as_lists() == [[1, 4, 4], [5, 64, 2]]
    snap = json.loads(hook.snapshot_file.read_text())
    assert snap["pinned"] and snap["table_file_rejected"] == 1 and snap["table"] == [[1, 4, 4], [5, 64, 2]]
    path.unlink()
    hook.after_window(2.0)
    assert not c.pinned


def test_metrics_series_round_trip_through_the_prometheus_parser(tmp_path):
    c = Controller(PROFILE, [0.5] * 4, FAST, table=DraftTable.from_ranges([[1, 8, 3], [9, 64, 1]]))
    hook = bare_hook(c)
    obs = StepObservation.from_drafts(8, 3, [(3, 3), (3, 1), (3, 0)], time_s=1.0, undrafted=2)
    assert c.observe(obs)
    hook.totals.add(obs)
    hook.errors["RuntimeError"] = 3
    path = metrics.snapshot_path(tmp_path, 0)
    metrics.publish(path, hook.snapshot())
    registry = CollectorRegistry()
    registry.register(metrics.SnapshotCollector(tmp_path))
    text = generate_latest(registry).decode()
    assert 'tabletune_k{end_bs="8",engine="0",start_bs="1"} 3.0' in text
    assert 'tabletune_errors_total{engine="0",kind="RuntimeError"} 3.0' in text
    assert 'tabletune_pinned{engine="0"} 0.0' in text
    assert "tabletune_table_honoured" not in text.replace("# HELP tabletune_table_honoured", "").replace(
        "# TYPE tabletune_table_honoured", "")
    counters = parse_metrics(text)
    assert counters.exact == (3.0, (3.0, 2.0, 1.0, 0.0), (2.0, 1.0, 1.0, 0.0), 2.0)


def exact(drafts, reached, accepted) -> SpecCounters:
    return SpecCounters(0, 0, (), 4, exact=(drafts, tuple(reached), tuple(accepted), 0.0))


def test_sidecar_pools_replicas_and_skips_a_reset_source_alone():
    c = Controller(PROFILE, [0.5] * 4, FAST)
    side = Sidecar(c, c.table)
    assert side.feed_all({"a": exact(10, [10, 8, 6, 4], [8, 6, 4, 2]), "b": exact(0, [0] * 4, [0] * 4)}, 0) is None
    obs = side.feed_all({"a": exact(20, [20, 16, 12, 8], [16, 12, 8, 4]),
                         "b": exact(5, [5, 4, 3, 2], [4, 3, 2, 1])}, 1)
    assert obs.num_drafts == 15 and obs.reached == (15, 12, 9, 6) and obs.accepted == (12, 9, 6, 3)
    obs = side.feed_all({"a": exact(1, [1, 1, 1, 1], [1, 1, 1, 1]),  # a restarted
                         "b": exact(6, [6, 5, 4, 3], [5, 4, 3, 2]), "c": None}, 2)
    assert obs.num_drafts == 1 and obs.reached == (1, 1, 1, 1)
    assert c.steps == 2


def test_status_cli_reads_the_series(tmp_path):
    from click.testing import CliRunner

    from tabletune.cli import main

    c = Controller(PROFILE, [0.5] * 4, FAST, table=DraftTable.from_ranges([[1, 8, 3], [9, 64, 1]]))
    c.pin([[1, 64, 2]])
    metrics.publish(metrics.snapshot_path(tmp_path, 0), {**bare_hook(c).snapshot(), "table_honoured": True})
    registry = CollectorRegistry()
    registry.register(metrics.SnapshotCollector(tmp_path))

    with serve_text(lambda path: generate_latest(registry) if path == "/metrics" else b"# nothing\n") as url:
        out = CliRunner().invoke(main, ["status", "--metrics-url", url + "/metrics"])
        assert out.exit_code == 0, out.output
        assert "table [[1, 64, 2]] (pinned), k_max 4" in out.output and "table honoured True" in out.output
        as_json = CliRunner().invoke(main, ["status", "--metrics-url", url + "/metrics", "--json"])
        state = json.loads(as_json.output)[url + "/metrics"]["0"]
        assert state["table"] == [[1, 64, 2]] and state["pinned"] == 1 and len(state["acceptance"]) == 4
        empty = CliRunner().invoke(main, ["status", "--metrics-url", url + "/other"])
        assert empty.exit_code == 2 and "no tabletune_* series" in empty.output
    down = CliRunner().invoke(main, ["status", "--metrics-url", "http://127.0.0.1:9/metrics"])
    assert down.exit_code == 2 and "cannot scrape" in down.output


def test_table_file_is_polled_between_observation_windows(tmp_path):
    """A slow engine completes a window rarely; the file must still take effect within a step."""
    path = tmp_path / "table.json"
    c = Controller(PROFILE, [0.3] * 4, FAST, table=DraftTable.from_ranges([[1, 64, 1]]))
    hook = bare_hook(c, TableFileWatcher(path, 4, poll_s=0))
    write(path, [[1, 64, 3]])
    step(hook, {"a": 1, "b": 1}, 1)
    assert hook.windows == 0 and c.pinned and hook.scheduler.dynamic_sd_lookup[2] == 3
