"""Fig 4b: a workload switch (code -> chat at the start of the 4th 60-second window).

The 8B EAGLE-style step profile with the trained head's measured acceptance on HumanEval
(``eagle-code``), then on MT-Bench chat (``eagle-chat``). These policies run on the same
schedule and seeds:

* stale: the table tuned on code's measured rates, never changed;
* controller: the same start, adapting online (``tabletune.controller.Controller``), with the
  plugin's default exploration and without it (``CONTROLLERS``);
* oracle: in each window, the table tuned on the rates of the workload in force
  (code before the switch, chat after), i.e. a static table per phase.

Share of the stale table's loss recovered in window w:
(controller_w - stale_w) / (oracle_w - stale_w), reported where oracle_w - stale_w
exceeds 0.5% of oracle_w (otherwise there is no loss to recover and we print "-").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tabletune.experiments.analysis import Section, md_table, save_figure
from tabletune.experiments.provenance import figure_note, inputs_markdown
from tabletune.experiments.runner import Lab
from tabletune.experiments.runner import lab as worker_lab
from tabletune.experiments.settings import SETTINGS
from tabletune.policies import make_policy
from tabletune.sim import Schedule

WINDOW_S = 60.0


def _windows(task: tuple) -> np.ndarray:
    policy, prior, load, seed, num_windows, switch_s, window_s = task
    lab = worker_lab()
    code, chat = SETTINGS["eagle-code"], SETTINGS["eagle-chat"]
    schedule = Schedule.switch(code.workload(lab.root), chat.workload(lab.root), switch_s)
    sim = lab.simulator(code, load, seed, schedule, duration_s=num_windows * window_s)
    result = sim.run(make_policy(policy, sim.context(prior_rates=prior)))
    return result.window_throughput(window_s)[:num_windows]


#: The controllers compared: the plugin's default, and the same without exploration (its cost is the
#: point: 2% of steps at k_max cost about as much as the few % a code -> chat switch leaves to recover).
CONTROLLERS = ("controller", "controller:explore_fraction=0")


def fig4b(lab: Lab, out: Path, loads: Sequence[int] = (32,), seeds: Sequence[int] = (0, 1, 2),
          num_windows: int = 6, switch_window: int = 4, window_s: float = WINDOW_S,
          controllers: Sequence[str] = CONTROLLERS) -> Section:
    switch_s = (switch_window - 1) * window_s
    code_rates = lab.measured_rates(SETTINGS["eagle-code"])
    chat_rates = lab.measured_rates(SETTINGS["eagle-chat"])
    specs = [("tabletune", code_rates), ("tabletune", chat_rates), *[(c, code_rates) for c in controllers]]
    rows, body, summary = [], [], {}
    for load in loads:
        runs = [(p, prior, load, s, num_windows, switch_s, window_s) for p, prior in specs for s in seeds]
        windows = lab.parallel(_windows, runs)
        n = len(seeds)
        stale, oracle_after, *ctrls = (np.mean(windows[i * n:(i + 1) * n], axis=0) for i in range(len(specs)))
        oracle = np.where(np.arange(num_windows) < switch_window - 1, stale, oracle_after)
        for w in range(num_windows):
            gap = oracle[w] - stale[w]
            recs = [(c[w] - stale[w]) / gap if gap > 0.005 * oracle[w] else None for c in ctrls]
            row = {"load": load, "window": w + 1, "stale_tok_s": stale[w], "oracle_tok_s": oracle[w]}
            for name, c, rec in zip(controllers, ctrls, recs):
                row[f"{name}_tok_s"] = c[w]
                row[f"{name}_recovered"] = rec if rec is not None else ""
            rows.append(row)
            body.append([load, w + 1, "chat" if w >= switch_window - 1 else "code", f"{stale[w]:.0f}",
                         f"{oracle[w]:.0f}", *[f"{c[w]:.0f} ({'-' if r is None else f'{100 * r:.0f}%'})"
                                               for c, r in zip(ctrls, recs)]])
        summary[load] = {name: [r[f"{name}_recovered"] for r in rows if r["load"] == load] for name in controllers}
    note = figure_note(lab, ["eagle-code", "eagle-chat"])
    files = [_csv(out / "fig4b.csv", rows), _plot(out / "fig4b.png", rows, loads, switch_window, note, controllers)]
    md = (inputs_markdown(lab, ["eagle-code", "eagle-chat"]) + "\n\n"
          f"Code -> chat at {switch_s:.0f} s (window {switch_window}); throughput per {window_s:.0f} s window, mean of "
          f"{len(seeds)} seeds; stale = table tuned on code {list(code_rates)}; oracle after the switch = table "
          f"tuned on chat {list(chat_rates)}. Controller cells: tok/s (share of the stale table's loss recovered)."
          "\n\n" + md_table(["load", "window", "workload", "stale tok/s", "oracle tok/s",
                               *[f"{c} tok/s" for c in controllers]], body))
    return Section("fig4b", "Fig 4b: recovery after a workload switch", md, files, summary)


def _csv(path: Path, rows: list[dict]) -> str:
    from tabletune.experiments.analysis import write_csv

    return write_csv(path, rows)


def _plot(path: Path, rows: list[dict], loads: Sequence[int], switch_window: int, note: str,
          controllers: Sequence[str]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for load in loads:
        mine = [r for r in rows if r["load"] == load]
        x = [r["window"] for r in mine]
        keys = [("stale_tok_s", ":"), ("oracle_tok_s", "--"), *[(f"{c}_tok_s", "-") for c in controllers]]
        for key, style in keys:
            ax.plot(x, [r[key] for r in mine], style, marker="o", ms=3, label=f"{key[:-6]} (load {load})")
    ax.axvline(switch_window - 0.5, color="grey", lw=1)
    ax.set_xlabel("window")
    ax.set_ylabel("output tokens/s")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Fig 4b: code -> chat switch (simulated)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, path, note)
    return path.name
