"""Fig 4b: a workload switch (code -> chat at the start of the 4th 60-second window).

An EAGLE-style step profile with the trained head's measured acceptance on HumanEval (``*-code``), then
on MT-Bench chat (``*-chat``), in two switches (``SWITCHES``), each at one load:

* ``eagle``: the 8B profile at load 32 (the code table drafts k = 3, the chat table k = 2; a stale
  table loses only a few %, so the recovered share is a ratio of small differences);
* ``moe``: the 30B-A3B MoE profile at load 8, where the stale table loses most among the measured
  inputs (the code table drafts k = 5, the chat table k = 1; about 8%).

These policies run on the same schedule and seeds (common random numbers: under one seed they serve the
same requests):

* stale: the table tuned on code's measured rates, never changed;
* controller: the same start, adapting online (``tabletune.controller.Controller``), with the
  plugin's default exploration and without it (``CONTROLLERS``);
* oracle: in each window, the table tuned on the rates of the workload in force
  (code before the switch, chat after), i.e. a static table per phase.

Share of the stale table's loss recovered in window w, over the seeds:
(mean controller_w - mean stale_w) / (mean oracle_w - mean stale_w), with a 95% percentile bootstrap
interval over seeds (whole seeds resampled, so the three policies stay paired); reported where the
oracle's gain exceeds 0.5% of its throughput (otherwise there is no loss to recover and we print "-").
The pooled share is the same ratio over the windows after the switch together.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tabletune.experiments.analysis import Section, bootstrap_ci, md_table, save_figure
from tabletune.experiments.provenance import figure_note, inputs_markdown
from tabletune.experiments.runner import Lab
from tabletune.experiments.runner import lab as worker_lab
from tabletune.experiments.settings import SETTINGS
from tabletune.policies import make_policy
from tabletune.sim import Schedule

WINDOW_S = 60.0

#: name -> (setting before the switch, setting after it, load)
SWITCHES = {"eagle": ("eagle-code", "eagle-chat", 32), "moe": ("moe-code", "moe-chat", 8)}


def _windows(task: tuple) -> np.ndarray:
    policy, prior, before, after, load, seed, num_windows, switch_s, window_s = task
    lab = worker_lab()
    first, second = SETTINGS[before], SETTINGS[after]
    schedule = Schedule.switch(first.workload(lab.root), second.workload(lab.root), switch_s)
    sim = lab.simulator(first, load, seed, schedule, duration_s=num_windows * window_s)
    result = sim.run(make_policy(policy, sim.context(prior_rates=prior)))
    return result.window_throughput(window_s)[:num_windows]


#: The controllers compared: the plugin's default, and the same without exploration (its cost is the
#: point: 2% of steps at k_max cost about as much as the few % a code -> chat switch leaves to recover).
CONTROLLERS = ("controller", "controller:explore_fraction=0")


def recovered(stale: np.ndarray, oracle: np.ndarray, ctrl: np.ndarray, windows: Sequence[int],
              min_gap: float = 0.005) -> tuple[float, float, float] | None:
    """(share, low, high) of the stale table's loss recovered over ``windows`` (seeds x windows arrays,
    seeds paired), or None where the oracle gains less than ``min_gap`` of its throughput."""
    w = list(windows)

    def share(idx: np.ndarray) -> float:
        s, o, c = (x[idx][:, w].sum() for x in (stale, oracle, ctrl))
        return (c - s) / (o - s) if o - s > 0 else float("nan")

    all_seeds = np.arange(len(stale))
    o, s = oracle[:, w].sum(), stale[:, w].sum()
    if o - s <= min_gap * o:
        return None
    low, high = bootstrap_ci(share, len(stale))
    return share(all_seeds), low, high


def _pct(r: tuple[float, float, float] | None) -> str:
    return "-" if r is None else f"{100 * r[0]:.0f}% [{100 * r[1]:.0f}, {100 * r[2]:.0f}]"


def fig4b(lab: Lab, out: Path, loads: Sequence[int] = (), seeds: Sequence[int] = (0, 1, 2),
          num_windows: int = 6, switch_window: int = 4, window_s: float = WINDOW_S,
          controllers: Sequence[str] = CONTROLLERS, switches: Sequence[str] = tuple(SWITCHES)) -> Section:
    """Every switch in ``switches`` at its own load, or at each of ``loads`` when given."""
    switch_s = (switch_window - 1) * window_s
    after = list(range(switch_window - 1, num_windows))
    rows, body, pooled, summary, notes, used = [], [], [], {}, [], []
    for name in switches:
        before_name, after_name, own_load = SWITCHES[name]
        used += [before_name, after_name]
        code_rates = lab.measured_rates(SETTINGS[before_name])
        chat_rates = lab.measured_rates(SETTINGS[after_name])
        notes.append(f"`{name}`: stale = table tuned on code {list(code_rates)}; oracle after the switch = table "
                     f"tuned on chat {list(chat_rates)}")
        specs = [("tabletune", code_rates), ("tabletune", chat_rates), *[(c, code_rates) for c in controllers]]
        for load in loads or (own_load,):
            runs = [(p, prior, before_name, after_name, load, s, num_windows, switch_s, window_s)
                    for p, prior in specs for s in seeds]
            n = len(seeds)
            per_seed = np.array(lab.parallel(_windows, runs)).reshape(len(specs), n, num_windows)
            stale, oracle_after, *ctrls = per_seed
            oracle = np.where(np.arange(num_windows)[None, :] < switch_window - 1, stale, oracle_after)
            means = [x.mean(axis=0) for x in (stale, oracle, *ctrls)]
            for w in range(num_windows):
                recs = [recovered(stale, oracle, c, [w]) if w in after else None for c in ctrls]
                row = {"switch": name, "load": load, "window": w + 1, "stale_tok_s": means[0][w],
                       "oracle_tok_s": means[1][w]}
                for c_name, m, rec in zip(controllers, means[2:], recs):
                    row[f"{c_name}_tok_s"] = m[w]
                    row[f"{c_name}_recovered"] = "" if rec is None else rec[0]
                    row[f"{c_name}_recovered_low"] = "" if rec is None else rec[1]
                    row[f"{c_name}_recovered_high"] = "" if rec is None else rec[2]
                rows.append(row)
                body.append([name, load, w + 1, "chat" if w in after else "code", f"{means[0][w]:.0f}",
                             f"{means[1][w]:.0f}", *[f"{m[w]:.0f} ({_pct(r)})" for m, r in zip(means[2:], recs)]])
            gap = 1 - means[0][after].sum() / means[1][after].sum()
            total = [recovered(stale, oracle, c, after) for c in ctrls]
            pooled.append([name, load, f"{100 * gap:.1f}%", *[_pct(r) for r in total]])
            summary[f"{name}/{load}"] = {"stale_loss": gap, **{
                c: [r[f"{c}_recovered"] for r in rows if r["switch"] == name and r["load"] == load]
                for c in controllers}, **{f"{c}_pooled": r for c, r in zip(controllers, total)}}
    note = figure_note(lab, used)
    files = [_csv(out / "fig4b.csv", rows), _plot(out / "fig4b.png", rows, switch_window, note, controllers)]
    md = (inputs_markdown(lab, used) + "\n\n"
          f"Code -> chat at {switch_s:.0f} s (window {switch_window}); throughput per {window_s:.0f} s window, mean of "
          f"{len(seeds)} seeds; " + "; ".join(notes) + ". Controller cells: tok/s (share of the stale table's loss "
          "recovered [95% bootstrap interval over seeds]).\n\n"
          + md_table(["switch", "load", "window", "workload", "stale tok/s", "oracle tok/s",
                      *[f"{c} tok/s" for c in controllers]], body)
          + "\n\nThe windows after the switch together: the stale table's loss to the oracle, and the share of it "
          "each controller recovers [95% interval].\n\n"
          + md_table(["switch", "load", "stale loss", *[f"{c} recovered" for c in controllers]], pooled))
    return Section("fig4b", "Fig 4b: recovery after a workload switch", md, files, summary)


def _csv(path: Path, rows: list[dict]) -> str:
    from tabletune.experiments.analysis import write_csv

    return write_csv(path, rows)


def _plot(path: Path, rows: list[dict], switch_window: int, note: str, controllers: Sequence[str]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cases = list(dict.fromkeys((r["switch"], r["load"]) for r in rows))
    num_cols = min(len(cases), 3)
    num_rows = -(-len(cases) // num_cols)
    fig, axes = plt.subplots(num_rows, num_cols, figsize=(6 * num_cols, 4.5 * num_rows), layout="constrained",
                             squeeze=False)
    for ax in axes.flat[len(cases):]:
        ax.set_visible(False)
    for ax, (name, load) in zip(axes.flat, cases):
        mine = [r for r in rows if r["switch"] == name and r["load"] == load]
        x = [r["window"] for r in mine]
        keys = [("stale_tok_s", ":"), ("oracle_tok_s", "--"), *[(f"{c}_tok_s", "-") for c in controllers]]
        for key, style in keys:
            ax.plot(x, [r[key] for r in mine], style, marker="o", ms=3, label=key[:-6])
        ax.axvline(switch_window - 0.5, color="grey", lw=1)
        ax.set_xlabel("window")
        ax.set_ylabel("output tokens/s")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"Fig 4b: {name}, code -> chat, load {load} (simulated)", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    save_figure(fig, path, note)
    return path.name
