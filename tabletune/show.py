"""Render a step profile: T(b,k) heatmap, goodput per k over b, and the chosen table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tabletune import fileio
from tabletune.optimizer import OptimizeOptions, TableResult, optimize_table
from tabletune.profile import StepProfile


def render_png(profile: StepProfile, rates: Sequence[float] | None, path: str | Path,
               options: OptimizeOptions = OptimizeOptions(), title: str = "") -> TableResult | None:
    """Write the PNG atomically; return the optimizer's result when rates are given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bs, ks = profile.batch_sizes, profile.ks
    result = optimize_table(profile, rates, options) if rates else None
    ncols = 3 if result else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.5), squeeze=False)
    ax = axes[0][0]
    grid = np.array([[profile.step_ms(b, k) for b in bs] for k in ks])
    im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis")
    ax.set_xticks(range(len(bs)), [str(b) for b in bs], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("batch size b")
    ax.set_ylabel("draft length k")
    ax.set_title("step time T(b,k) [ms]")
    fig.colorbar(im, ax=ax)
    if result:
        ax = axes[0][1]
        xs = [p.batch_size for p in result.predictions]
        for k in result.lengths:
            ax.plot(xs, [p.fixed_goodput[k] for p in result.predictions], label=f"k={k}", lw=1)
        ax.plot(xs, [p.goodput for p in result.predictions], "k--", lw=2, label="table")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size b")
        ax.set_ylabel("goodput [tokens/s]")
        ax.set_title("modelled goodput per k")
        ax.legend(fontsize=7)
        ax = axes[0][2]
        ax.step(xs, [p.k for p in result.predictions], where="post")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size b")
        ax.set_ylabel("k")
        ax.set_title("chosen table: " + str(result.table)[:60])
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with fileio.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return result


def summary_lines(profile: StepProfile, result: TableResult | None) -> list[str]:
    fp = profile.fingerprint
    lines = [
        f"profile: {profile.source}",
        f"  engine={fp.engine} {fp.engine_version} device={fp.device or '?'} model={fp.model or '?'} "
        f"dtype={fp.dtype or '?'} drafter={fp.drafter or '?'} context={profile.context_len}",
        f"  batch sizes {profile.batch_sizes[0]}..{profile.max_batch_size} ({len(profile.batch_sizes)} measured), "
        f"k in {profile.ks}",
        f"  T(1,0)={profile.step_ms(1, profile.ks[0]):.3f} ms, "
        f"T({profile.max_batch_size},{profile.ks[-1]})={profile.step_ms(profile.max_batch_size, profile.ks[-1]):.3f} ms",
    ]
    if result:
        k = result.best_single_k
        mean, worst = result.gain_vs_fixed(k)
        lines.append(f"  table: {result.table}")
        lines.append(f"  vs best single fixed k={k}: mean gain {mean:+.1%}, at worst {worst:+.1%}")
    return lines
