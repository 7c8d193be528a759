"""Run experiments by name and write their markdown sections; ``build_report`` writes the whole report.

``build_report`` runs every simulated experiment (fig1, table1, fig3, table2, fig4b, moe) on the measured
inputs of ``experiments/settings.py``, collects the measured results (``experiments/collected.py``) and
writes ``report.md`` with the PNGs embedded. ``REPORT_FULL`` is sized to finish within 10 minutes on a
shared 2-core machine, ``REPORT_QUICK`` within about one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabletune import fileio
from tabletune.experiments.analysis import Section
from tabletune.experiments.collected import controller_timeline, engine_draft_share, policy_grid
from tabletune.experiments.figures import fig1, fig3, moe, table1
from tabletune.experiments.mistuned import table2
from tabletune.experiments.runner import DEFAULT_LOADS, DEFAULT_SEEDS, Lab
from tabletune.experiments.settings import TABLE1
from tabletune.experiments.switch import fig4b

NAMES = ("fig1", "table1", "fig3", "table2", "fig4b", "moe")


@dataclass(frozen=True)
class ExperimentOptions:
    loads: tuple[int, ...] = DEFAULT_LOADS
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    duration_s: float = 20.0
    fig3_settings: tuple[str, ...] = ("eagle",)
    fig4b_loads: tuple[int, ...] = ()  # empty: each switch at its own load (``switch.SWITCHES``)
    fig4b_window_s: float = 60.0
    per_request: bool = True
    jobs: int = 2  # worker processes
    profiles: str = "profiles"  # the folder the settings' files are relative to
    results: str = "benchmarks/results"  # measured results: the H200 mixed-step check, collected sections

    def __post_init__(self) -> None:
        if not self.loads or min(self.loads) < 1 or max(self.loads) > 128:
            raise ValueError(f"loads must lie in 1..128, got {self.loads}")
        if not self.seeds:
            raise ValueError("at least one seed")
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        unknown = [s for s in self.fig3_settings if s not in TABLE1]
        if unknown:
            raise ValueError(f"unknown fig3 settings {unknown}; choose from {list(TABLE1)}")


#: ``tabletune report``: the loads that show the shape, 2 seeds, all six settings in fig3.
REPORT_FULL = ExperimentOptions(loads=DEFAULT_LOADS, seeds=DEFAULT_SEEDS, duration_s=10.0,
                                fig3_settings=TABLE1, fig4b_window_s=30.0, per_request=False)
#: ``tabletune report --quick``: three loads, one seed, short runs.
REPORT_QUICK = ExperimentOptions(loads=(1, 16, 128), seeds=(0,), duration_s=2.0, fig3_settings=("eagle",),
                                 fig4b_window_s=4.0, per_request=False)


def make_lab(opts: ExperimentOptions) -> Lab:
    """The Lab over the profiles folder, with the engine's measured draft share when the H200 check exists."""
    measured = engine_draft_share(Path(opts.results))
    share, source = measured if measured else (1.0, "no mixed-step measurement found; the engine's padding rule: "
                                                    "a ragged step runs the graph of max k_i, rows padded")
    return Lab(Path(opts.profiles), draft_share=share, draft_share_source=source, duration_s=opts.duration_s,
               jobs=opts.jobs)


def run_one(name: str, lab: Lab, out: Path, opts: ExperimentOptions) -> Section:
    if name == "fig1":
        return fig1(lab, out, opts.loads, opts.seeds)
    if name == "table1":
        return table1(lab, out, opts.loads, opts.seeds)
    if name == "fig3":
        return fig3(lab, out, opts.loads, opts.seeds, opts.fig3_settings, opts.per_request)
    if name == "table2":
        return table2(lab, out, opts.loads, opts.seeds)
    if name == "fig4b":
        return fig4b(lab, out, opts.fig4b_loads, opts.seeds, window_s=opts.fig4b_window_s)
    if name == "moe":
        return moe(lab, out, opts.loads, opts.seeds)
    raise ValueError(f"unknown experiment {name!r}; choose one of {[*NAMES, 'all']}")


def section_markdown(section: Section, elapsed_s: float | None = None) -> str:
    images = "".join(f"\n![{f}]({f})\n" for f in section.files if f.endswith(".png"))
    data = ", ".join(f"`{f}`" for f in section.files if not f.endswith(".png"))
    tail = (f"\n\nFiles: {data}." if data else "") + (f" ({elapsed_s:.0f} s)" if elapsed_s is not None else "")
    return f"## {section.title}\n\n{section.markdown}{tail}\n{images}"


def run_experiments(names: Sequence[str], out: Path, opts: ExperimentOptions) -> list[Section]:
    """Run the named experiments (or 'all'); write one <name>.md each."""
    lab = make_lab(opts)
    todo = list(NAMES) if "all" in names else list(names)
    sections = []
    for name in todo:
        t0 = time.perf_counter()
        section = run_one(name, lab, out, opts)
        fileio.write_text(out / f"{name}.md", section_markdown(section, time.perf_counter() - t0))
        sections.append(section)
    return sections


def build_report(out: Path, opts: ExperimentOptions, command: str, names: Sequence[str] = NAMES) -> list[Section]:
    """The experiments (every one unless ``names`` says otherwise) and the collected results, rendered into
    ``out/report.md`` with the PNGs beside it."""
    start = time.perf_counter()
    sections = run_experiments(list(names), out, opts)
    results = Path(opts.results)
    sections += [policy_grid(results), controller_timeline(results, out)]
    head = (f"# TableTune report\n\nCommand: `{command}`. Simulated sections: loads {list(opts.loads)}, seeds "
            f"{list(opts.seeds)}, {opts.duration_s:g} simulated s per point, closed loop. Every section names its "
            f"provenance. Total {time.perf_counter() - start:.0f} s.\n\n")
    fileio.write_text(out / "report.md", head + "\n".join(section_markdown(s) for s in sections))
    return sections
