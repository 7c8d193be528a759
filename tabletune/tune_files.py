"""What ``tabletune tune`` writes, and the gains it predicts. Core: no torch, no vllm.

A run's folder holds ``step_profile.json``, ``acceptance.json``, ``table.json``
(vLLM's keys), ``speculative_config.json`` (the whole ``--speculative-config``)
and ``tune.png``. Every file is first written into a temporary sibling folder;
only when all of them exist are they moved into place, so a failed run leaves
nothing half-written.

Predicted gains compare goodput(b) = b * E[tokens | k(b)] / T(b, k(b)) of the
tuned table with (a) the best single fixed k and (b) vLLM's documented example
table ``VLLM_DOCUMENTED_RANGES`` clamped to k_max, as mean and minimum over
b = 1..max_batch of table / other - 1.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tabletune.acceptance import AcceptanceProfile
from tabletune.optimizer import OptimizeOptions, TableResult, evaluate_table, gain_vs
from tabletune.show import render_png
from tabletune.table import VLLM_DOCUMENTED_RANGES, DraftTable
from tabletune.tuner import TuneOutcome

FILES = ("step_profile.json", "acceptance.json", "table.json", "speculative_config.json", "tune.png")


@dataclass(frozen=True)
class Gains:
    best_fixed_k: int
    vs_best_fixed: tuple[float, float]  # (mean, minimum) over b
    documented: DraftTable  # vLLM's documented table, clamped to k_max
    vs_documented: tuple[float, float]


def predict_gains(outcome: TuneOutcome, result: TableResult) -> Gains:
    k_max = max(result.lengths)
    documented = DraftTable(VLLM_DOCUMENTED_RANGES).clamped(k_max)
    max_batch = len(result.predictions)
    doc = evaluate_table(outcome.profile, outcome.rates, documented, max_batch, result.lengths,
                         outcome.draft_rate_modelled)
    k = result.best_single_k
    return Gains(k, result.gain_vs_fixed(k), documented, gain_vs(result.predictions, [p.goodput for p in doc]))


def write_run(out_dir: str | Path, outcome: TuneOutcome, speculative_config: Callable[[list[list[int]]], dict],
              command: str = "", title: str = "") -> tuple[TableResult, dict[str, Path]]:
    """Optimise, render and write the five files into ``out_dir`` (all or nothing)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        k_max = max(outcome.profile.ks)
        outcome.profile.save(tmp / "step_profile.json")
        AcceptanceProfile([outcome.acceptance], model=outcome.profile.fingerprint.model,
                          command=command).save(tmp / "acceptance.json")
        options = OptimizeOptions(k_max=k_max, draft_rate=outcome.draft_rate_modelled)
        result = render_png(outcome.profile, outcome.rates, tmp / "tune.png", options,
                            title=title)
        assert result is not None
        table_json = result.table.to_vllm(k_max)
        (tmp / "table.json").write_text(json.dumps(table_json, indent=2) + "\n")
        config = speculative_config(result.table.as_lists())
        (tmp / "speculative_config.json").write_text(json.dumps(config, indent=2) + "\n")
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result, {name: out / name for name in FILES}


def _publish(tmp: Path, out: Path) -> None:
    """Rename the folder into place; into an existing folder, replace file by file."""
    if not out.exists():
        os.rename(tmp, out)
        return
    for name in FILES:
        os.replace(tmp / name, out / name)
