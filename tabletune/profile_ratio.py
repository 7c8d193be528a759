"""How well one step-time surface stands in for another: T_a(b, k) / T_b(b, k) per measured cell.

The built-in engine is the testbed for every policy; this says how far its step times are from vLLM's on the
same card, model shape and drafter (``tabletune show --against``). Only cells measured in both profiles
count (no interpolation). Core: no torch, no vllm.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tabletune.profile import StepProfile


@dataclass(frozen=True)
class CellRatio:
    batch_size: int
    k: int
    step_ms: float  # the profile shown
    against_ms: float  # the profile it is compared with

    @property
    def ratio(self) -> float:
        return self.step_ms / self.against_ms


def cell_ratios(profile: StepProfile, against: StepProfile) -> tuple[CellRatio, ...]:
    """One ratio per (b, k) measured in both, in (b, k) order; empty when no cell is shared."""
    mine = {(p.batch_size, p.k): p.median_ms for p in profile.points}
    theirs = {(p.batch_size, p.k): p.median_ms for p in against.points}
    return tuple(CellRatio(b, k, mine[b, k], theirs[b, k]) for b, k in sorted(mine.keys() & theirs.keys()))


def ratio_markdown(cells: tuple[CellRatio, ...], name: str, against_name: str) -> list[str]:
    """A markdown grid of the ratios (rows b, columns k) and one line with their median and range."""
    if not cells:
        return [f"{name} and {against_name} share no measured (b, k) cell"]
    ks = sorted({c.k for c in cells})
    by_cell = {(c.batch_size, c.k): c.ratio for c in cells}
    lines = [f"T(b, k) of {name} / T(b, k) of {against_name}, per cell measured in both", "",
             "| b | " + " | ".join(f"k={k}" for k in ks) + " |", "|---:|" + "---:|" * len(ks)]
    for b in sorted({c.batch_size for c in cells}):
        row = [f"{by_cell[b, k]:.2f}" if (b, k) in by_cell else "" for k in ks]
        lines.append(f"| {b} | " + " | ".join(row) + " |")
    ratios = [c.ratio for c in cells]
    lines += ["", f"{len(cells)} cells: median {statistics.median(ratios):.2f}, "
                  f"range {min(ratios):.2f}-{max(ratios):.2f}"]
    return lines
