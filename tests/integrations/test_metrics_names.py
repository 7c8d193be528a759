"""The ``tabletune_*`` series an operator scrapes: every family of the table in docs/formats.md, exported
with its labels and its value, from a hook built through its real constructor (no vLLM, no server)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tabletune.controller import Controller, ControllerConfig
from tabletune.controller.estimator import StepObservation
from tabletune.controller.table_file import TableFileWatcher
from tabletune.integrations.vllm import metrics
from tabletune.profile import StepPoint, StepProfile
from tabletune.table import DraftTable

from hook_fakes import make_hook, step

FORMATS = Path(__file__).resolve().parents[2] / "docs" / "formats.md"
PROFILE = StepProfile(tuple(StepPoint(b, k, (10 + 0.5 * b * (1 + 0.6 * k),))
                            for b in (1, 2, 4, 8, 16, 32, 64) for k in range(5)), context_len=0)


def documented_series() -> dict[str, set[str]]:
    """Series name -> its labels besides ``engine``, from the table under "The `tabletune_*` metrics"."""
    text = FORMATS.read_text()
    section = text[text.index("## The `tabletune_*` metrics"):]
    section = section[:section.find("\n## ", 4)] if "\n## " in section[4:] else section
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        if line.startswith("| `tabletune_"):
            first = line.split("|")[1]
            for name, labels in re.findall(r"`(tabletune_\w+)(?:\{([^}]*)\})?`", first):
                out[name] = set(labels.split(",")) if labels else set()
    return out


def scrape(tmp_path, snapshot: dict) -> dict[str, list]:
    """Publish one engine's snapshot and scrape it as the API server's collector does."""
    folder = tmp_path / "metrics"
    metrics.publish(metrics.snapshot_path(folder, 0), snapshot)
    registry = CollectorRegistry()
    registry.register(metrics.SnapshotCollector(folder))
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples.setdefault(s.name, []).append(s)
    return samples


def served_hook(tmp_path):
    """40 engine steps on a fake scheduler: in each, request a verifies 2 drafts (1 accepted) and b, c none."""
    cfg = ControllerConfig(k_max=4, observe_every_steps=8, explore_fraction=0.25, min_gain=1e9, prior_weight=0,
                           half_life_tokens=1e12)
    c = Controller(PROFILE, [0.5] * 4, cfg, table=DraftTable.from_ranges([[1, 64, 2]]))
    hook = make_hook(c)
    hook.watcher = TableFileWatcher(tmp_path / "table.json", 4, poll_s=0)
    step(hook, {"a": 1, "b": 1, "c": 1}, 2)
    for _ in range(39):
        step(hook, {"a": 3, "b": 1, "c": 1}, 2, drafts={"a": (2, 1)})
    (tmp_path / "table.json").write_text("{not json")  # one refused version (at the second poll that finds it)
    step(hook, {"a": 1}, 2)
    step(hook, {"a": 1}, 2)
    hook.after_step(object())  # a step the hook cannot read: fail open, counted
    c.observe(StepObservation(8, 2, 1, (math.nan, 0.0), (0.0, 0.0), (1.0, 0.0)))  # an ignored window
    hook.set_table([[1, 64, 3]])  # an install
    return hook


def test_every_documented_series_is_exported_with_its_labels(tmp_path):
    documented = documented_series()
    assert len(documented) == 17 and "tabletune_ignored_windows_total" in documented
    samples = scrape(tmp_path, served_hook(tmp_path).snapshot())
    for name, labels in documented.items():
        assert name in samples, f"docs/formats.md lists {name}, /metrics does not export it"
        for s in samples[name]:
            assert set(s.labels) == {"engine", *labels}, (name, s.labels)
    assert set(samples) <= set(documented), f"undocumented series: {set(samples) - set(documented)}"


def test_series_values_are_the_engines_own(tmp_path):
    hook = served_hook(tmp_path)
    c = hook.controller
    samples = scrape(tmp_path, hook.snapshot())

    def value(name: str, **labels) -> float:
        (s,) = [s for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        return s.value

    # 5 windows of 8 steps observed; 39 steps in them drafted once (a) and left two requests undrafted (b, c)
    assert value("tabletune_steps_total") == 40 and value("tabletune_drafts_total") == 39
    assert value("tabletune_undrafted_total") == 78
    assert value("tabletune_draft_rate") == round(39 / (39 + 78), 6)  # prior weight 0: drafts / request-steps
    assert value("tabletune_reached_total", position="1") == 39 and value("tabletune_accepted_total",
                                                                         position="1") == 39
    assert value("tabletune_reached_total", position="2") == 39 and value("tabletune_accepted_total",
                                                                         position="2") == 0
    assert value("tabletune_acceptance", position="1") == 1.0 and value("tabletune_acceptance", position="2") == 0.001
    assert value("tabletune_table_installs_total") == 1 and value("tabletune_k", start_bs="1", end_bs="64") == 3
    assert value("tabletune_exploration_steps_total") == c.explore_steps > 0
    assert value("tabletune_ignored_windows_total", reason="nan") == 1
    assert value("tabletune_errors_total", kind="AttributeError") == 1
    assert value("tabletune_table_file_rejected_total") == 1 and value("tabletune_pinned") == 0
    assert value("tabletune_table_honoured") == 1 and value("tabletune_k_max") == 4
    assert 0 <= value("tabletune_snapshot_age_seconds") < 60


def test_the_draft_rate_follows_the_drafts(tmp_path):
    """Two engines with different draft rates export different values (no constant gauge)."""
    cfg = ControllerConfig(k_max=4, prior_weight=0, half_life_tokens=1e12)
    rates = []
    for undrafted in (0, 3):
        c = Controller(PROFILE, [0.5] * 4, cfg, table=DraftTable.from_ranges([[1, 64, 2]]))
        c.observe(StepObservation.from_drafts(4, 2, [(2, 1)], time_s=1.0, undrafted=undrafted))
        rates.append(value_of(scrape(tmp_path / str(undrafted), make_hook(c).snapshot()), "tabletune_draft_rate"))
    assert rates == [1.0, 0.25]


def value_of(samples: dict[str, list], name: str) -> float:
    (s,) = samples[name]
    return s.value


def test_a_scrape_in_several_api_servers_survives_a_file_not_yet_sized(tmp_path, monkeypatch):
    """``--api-server-count N``: a process's ``.db`` file exists at 0 bytes for a moment after it is
    created; the patched ``MultiProcessCollector`` still answers, with every sample and ours."""
    from prometheus_client import REGISTRY, multiprocess
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    prom, snaps = tmp_path / "prom", tmp_path / "snaps"
    prom.mkdir()
    snaps.mkdir()
    written = MmapedDict(str(prom / "counter_101.db"))
    written.write_value(mmap_key("vllm:requests", "vllm:requests_total", [], [], "requests"), 7.0, 0.0)
    written.close()
    (prom / "histogram_102.db").touch()  # created, not yet sized
    metrics.publish(metrics.snapshot_path(snaps, 0), {"engine": 0, "k_max": 4, "table": [[1, 64, 3]]})

    monkeypatch.setattr(metrics, "_collector", None)
    monkeypatch.setattr(metrics, "_patched", False)
    monkeypatch.setattr(multiprocess.MultiProcessCollector, "collect", multiprocess.MultiProcessCollector.collect)
    metrics.register_collector(snaps)
    try:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(prom))
        text = generate_latest(registry).decode()
    finally:
        REGISTRY.unregister(metrics._collector)
    assert "vllm:requests_total 7.0" in text
    assert 'tabletune_k{end_bs="64",engine="0",start_bs="1"} 3.0' in text
