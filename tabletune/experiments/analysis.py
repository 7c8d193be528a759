"""Aggregation over seeds, and the outputs every experiment writes (CSV, PNG, markdown).

Share of the best fixed k: for each (setting, load, seed), best = max over fixed k of
that seed's throughput (common random numbers make the pairing tight); a policy's
share = its throughput / best. We report the mean over seeds and the spread (min, max).
Worst loss of a policy over loads = max over loads of 1 - mean share.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.experiments.runner import Point


@dataclass(frozen=True)
class Share:
    setting: str
    policy: str
    load: int
    mean: float  # mean over seeds of throughput / best fixed
    low: float
    high: float
    throughput_tok_s: float  # mean over seeds
    mean_k: float
    best_fixed: str  # the fixed k that was best most often


@dataclass
class Section:
    """One experiment's markdown section and the files it wrote."""

    key: str
    title: str
    markdown: str
    files: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def shares(points: Sequence[Point], fixed: Sequence[str]) -> list[Share]:
    by_key: dict[tuple, dict[str, Point]] = defaultdict(dict)
    for p in points:
        by_key[(p.setting, p.load, p.seed)][p.policy] = p
    per: dict[tuple, list[tuple[float, Point, str]]] = defaultdict(list)
    for (setting, load, seed), row in by_key.items():
        fixed_here = [row[f] for f in fixed if f in row]
        if not fixed_here:
            continue
        best = max(fixed_here, key=lambda p: p.throughput_tok_s)
        for name, p in row.items():
            per[(setting, name, load)].append((p.throughput_tok_s / best.throughput_tok_s, p, best.policy))
    out = []
    for (setting, name, load), items in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        ratios = [r for r, _, _ in items]
        bests = [b for _, _, b in items]
        out.append(Share(setting, name, load, sum(ratios) / len(ratios), min(ratios), max(ratios),
                         sum(p.throughput_tok_s for _, p, _ in items) / len(items),
                         sum(p.mean_k for _, p, _ in items) / len(items), max(set(bests), key=bests.count)))
    return out


def seed_shares(points: Sequence[Point], fixed: Sequence[str]) -> dict[tuple[str, str, int], dict[int, float]]:
    """{(setting, policy, load): {seed: throughput / that seed's best fixed k}} (the per-seed values of ``shares``)."""
    by_key: dict[tuple, dict[str, Point]] = defaultdict(dict)
    for p in points:
        by_key[(p.setting, p.load, p.seed)][p.policy] = p
    out: dict[tuple[str, str, int], dict[int, float]] = defaultdict(dict)
    for (setting, load, seed), row in by_key.items():
        fixed_here = [row[f].throughput_tok_s for f in fixed if f in row]
        if fixed_here:
            for name, p in row.items():
                out[(setting, name, load)][seed] = p.throughput_tok_s / max(fixed_here)
    return dict(out)


def bootstrap_ci(statistic, num_seeds: int, num_resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap over seeds: ``statistic(idx)`` on seed indices drawn with replacement.

    Seeds are the independent replicates (each a different request sample; every policy sees the same one
    under a seed), so a paired statistic (a difference between policies) is resampled by whole seeds."""
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, num_seeds, num_seeds)) for _ in range(num_resamples)])
    tail = (1.0 - level) / 2.0
    return float(np.quantile(values, tail)), float(np.quantile(values, 1.0 - tail))


def worst_loss(rows: Sequence[Share], setting: str, policy: str) -> tuple[float, int]:
    """(max over loads of 1 - mean share, the load where it happens)."""
    mine = [s for s in rows if s.setting == setting and s.policy == policy]
    worst = max(mine, key=lambda s: (1 - s.mean, -s.load))
    return 1 - worst.mean, worst.load


def write_csv(path: Path, rows: Sequence[object]) -> str:
    dicts = [asdict(r) if hasattr(r, "__dataclass_fields__") else dict(r) for r in rows]  # type: ignore[arg-type]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dicts[0]) if dicts else ["empty"])
    writer.writeheader()
    for d in dicts:
        writer.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()})
    fileio.write_text(path, buf.getvalue())
    return path.name


def share_plot(path: Path, rows: Sequence[Share], policies: Sequence[str], title: str,
               ylabel: str = "throughput / best fixed k", note: str = "") -> str:
    """Mean share vs load (log x, integer ticks), one line per policy, spread as error bars; ``note``
    (the provenance) is printed under the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    for name in policies:
        mine = sorted((s for s in rows if s.policy == name), key=lambda s: s.load)
        if not mine:
            continue
        x = [s.load for s in mine]
        y = [s.mean for s in mine]
        err = [[s.mean - s.low for s in mine], [s.high - s.mean for s in mine]]
        ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=name,
                    lw=2.2 if name in ("tabletune", "controller") else 1.0)
    ax.axhline(0.97, color="grey", ls=":", lw=1)
    load_axis(ax, sorted({s.load for s in rows}))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    save_figure(fig, path, note)
    return path.name


def load_axis(ax, loads: Sequence[int]) -> None:
    """A log2 load axis labelled with the loads as plain integers."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks(list(loads), [str(n) for n in loads], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("load (open requests)")


def save_figure(fig, path: Path, note: str = "") -> None:
    """Write the PNG atomically, the provenance note wrapped under the axes; closes the figure."""
    import textwrap

    import matplotlib.pyplot as plt

    if note:
        fig.supxlabel(textwrap.fill(note, 130), fontsize=6, ha="center")
    with fileio.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    plt.close(fig)


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def share_matrix_md(rows: Sequence[Share], policies: Sequence[str], loads: Sequence[int]) -> str:
    """Markdown: one row per policy, one column per load, mean share (spread)."""
    idx = {(s.policy, s.load): s for s in rows}
    body = []
    for name in policies:
        cells = []
        for n in loads:
            s = idx.get((name, n))
            cells.append("" if s is None else f"{100 * s.mean:.1f} ({100 * s.low:.0f}-{100 * s.high:.0f})")
        body.append([name, *cells])
    return md_table(["policy \\ load", *map(str, loads)], body)
