"""Draw a step profile and the optimizer's table: T(b, k) heatmap, goodput per k, chosen k per b.

The figure is drawn from the ``TableResult`` the optimizer returned; nothing here
decides a table. matplotlib is imported only inside ``draw_tune_png``, so
importing this module is cheap and writing the JSON files never needs it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tabletune import fileio
from tabletune.optimizer import TableResult
from tabletune.padding import geometric_batch_sizes
from tabletune.profile import StepProfile


def draw_tune_png(profile: StepProfile, result: TableResult | None, path: str | Path, title: str = "") -> None:
    """Write the PNG atomically: the heatmap, and with a result the goodput and chosen-k panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = 3 if result else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.8), squeeze=False, layout="constrained")
    _heatmap(fig, axes[0][0], profile)
    if result:
        _goodput(axes[0][1], result)
        _chosen_k(axes[0][2], result)
    if title:
        fig.suptitle(title, fontsize=10)
    with fileio.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def _heatmap(fig, ax, profile: StepProfile) -> None:
    import numpy as np

    bs, ks = profile.batch_sizes, profile.ks
    # [num_k, num_batch_sizes]
    grid = np.array([[profile.step_ms(b, k) for b in bs] for k in ks])
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis")
    ax.set_xticks(range(len(bs)), [str(b) for b in bs], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("batch size b")
    ax.set_ylabel("draft length k")
    ax.set_title("step time T(b, k) [ms]", fontsize=10)
    fig.colorbar(im, ax=ax)


def _batch_axis(ax, max_batch: int) -> None:
    """A log2 batch-size axis labelled with plain integers 1, 2, 4, ..., max_batch."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log", base=2)
    ticks = geometric_batch_sizes(max_batch)
    ax.set_xticks(ticks, [str(b) for b in ticks], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("batch size b")


def _goodput(ax, result: TableResult) -> None:
    xs = [p.batch_size for p in result.predictions]
    for k in sorted(result.predictions[0].fixed_goodput):
        ax.plot(xs, [p.fixed_goodput[k] for p in result.predictions], label=f"k={k}", lw=1)
    ax.plot(xs, [p.goodput for p in result.predictions], "k--", lw=2, label="table")
    _batch_axis(ax, xs[-1])
    ax.set_ylabel("goodput [tokens/s]")
    ax.set_title("modelled goodput per k", fontsize=10)
    ax.legend(fontsize=7)


def _chosen_k(ax, result: TableResult) -> None:
    from matplotlib.ticker import MaxNLocator

    xs = [p.batch_size for p in result.predictions]
    ks = sorted(result.predictions[0].fixed_goodput)
    ax.step(xs, [p.k for p in result.predictions], where="post")
    _batch_axis(ax, xs[-1])
    ax.set_ylim(min(ks) - 0.5, max(ks) + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("draft length k")
    ranges = textwrap.fill(str(result.table), width=48)
    ax.set_title(f"chosen k per batch size\n{ranges}", fontsize=8)
