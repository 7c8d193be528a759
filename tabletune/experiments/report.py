"""Run experiments by name and write their markdown sections, or one report with all of them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabletune import fileio
from tabletune.experiments.analysis import Section
from tabletune.experiments.figures import fig1, fig3, table1
from tabletune.experiments.mistuned import table2
from tabletune.experiments.runner import DEFAULT_LOADS, DEFAULT_SEEDS, Lab
from tabletune.experiments.switch import fig4b
from tabletune.experiments.settings import TABLE1
from tabletune.profile import StepProfile

NAMES = ("fig1", "table1", "fig3", "table2", "fig4b")


@dataclass(frozen=True)
class ExperimentOptions:
    loads: tuple[int, ...] = DEFAULT_LOADS
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    duration_s: float = 20.0
    fig3_settings: tuple[str, ...] = ("eagle",)
    fig4b_loads: tuple[int, ...] = (32,)
    fig4b_window_s: float = 60.0
    per_request: bool = True
    jobs: int = 2  # worker processes

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
    raise ValueError(f"unknown experiment {name!r}; choose one of {[*NAMES, 'all']}")


def section_markdown(section: Section, elapsed_s: float) -> str:
    files = ", ".join(f"`{f}`" for f in section.files)
    return f"## {section.title}\n\n{section.markdown}\n\nFiles: {files}. ({elapsed_s:.0f} s)\n"


def run_experiments(names: Sequence[str], profile_path: str, out: Path, opts: ExperimentOptions) -> list[Section]:
    """Run the named experiments (or 'all'); write one <name>.md each, and report.md for 'all'."""
    profile = StepProfile.load(profile_path)
    lab = Lab(profile, duration_s=opts.duration_s, jobs=opts.jobs)
    todo = list(NAMES) if "all" in names else list(names)
    sections, parts = [], []
    start = time.perf_counter()
    for name in todo:
        t0 = time.perf_counter()
        section = run_one(name, lab, out, opts)
        text = section_markdown(section, time.perf_counter() - t0)
        fileio.write_text(out / f"{name}.md", text)
        sections.append(section)
        parts.append(text)
    if "all" in names:
        head = (f"# TableTune experiments (simulated)\n\nStep times: `{Path(profile_path).name}`; loads "
                f"{list(opts.loads)}; seeds {list(opts.seeds)}; {opts.duration_s:.0f} simulated s per point; "
                f"closed loop. Total {time.perf_counter() - start:.0f} s.\n\n")
        fileio.write_text(out / "report.md", head + "\n".join(parts))
    return sections
