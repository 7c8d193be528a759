"""What ``tabletune tune`` writes, and the gains it predicts. Core: no torch, no vllm.

A run's folder holds ``step_profile.json``, ``acceptance.json``, ``table.json``
(vLLM's keys), ``speculative_config.json`` (the whole ``--speculative-config``)
and, when the caller passes a drawing function, ``tune.png``. The table comes
from the optimizer, never from a plot, so the JSON files need no matplotlib; the
PNG is drawn from the same ``TableResult`` (``tabletune.plot.draw_tune_png``).
Every file is first written into a temporary sibling folder; only when all of
them exist are they moved into place, so a failed run leaves nothing half-written.

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
from tabletune.optimizer import OptimizeOptions, TableResult, evaluate_table, gain_vs, optimize_table
from tabletune.profile import StepProfile
from tabletune.table import VLLM_DOCUMENTED_RANGES, DraftTable
from tabletune.tuner.run import TuneOutcome

JSON_FILES = ("step_profile.json", "acceptance.json", "table.json", "speculative_config.json")
PNG_FILE = "tune.png"
FILES = (*JSON_FILES, PNG_FILE)

DrawPng = Callable[[StepProfile, TableResult, Path], None]  # (profile, optimizer's result, path to write)


@dataclass(frozen=True)
class Gains:
    best_fixed_k: int
    vs_best_fixed: tuple[float, float]  # (mean, minimum) over b
    documented: DraftTable  # vLLM's documented table, clamped to k_max
    vs_documented: tuple[float, float]


def predict_gains(outcome: TuneOutcome, result: TableResult) -> Gains:
    k_max = max(result.ks)
    documented = DraftTable(VLLM_DOCUMENTED_RANGES).clamped(k_max)
    max_batch = len(result.predictions)
    doc = evaluate_table(outcome.profile, outcome.rates, documented, max_batch, result.ks,
                         outcome.draft_rate_modelled)
    k = result.best_single_k
    return Gains(k, result.gain_vs_fixed(k), documented, gain_vs(result.predictions, [p.goodput for p in doc]))


def write_run(out_dir: str | Path, outcome: TuneOutcome, speculative_config: Callable[[list[list[int]]], dict],
              command: str = "", draw_png: DrawPng | None = None) -> tuple[TableResult, dict[str, Path]]:
    """Optimise and write the JSON files (and ``tune.png`` with ``draw_png``) into ``out_dir``, all or nothing."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    names = JSON_FILES if draw_png is None else FILES
    try:
        k_max = max(outcome.profile.ks)
        outcome.profile.save(tmp / "step_profile.json")
        AcceptanceProfile([outcome.acceptance], model=outcome.profile.fingerprint.model,
                          command=command).save(tmp / "acceptance.json")
        result = optimize_table(outcome.profile, outcome.rates,
                                OptimizeOptions(k_max=k_max, draft_rate=outcome.draft_rate_modelled))
        _write_json(tmp / "table.json", result.table.to_vllm(k_max))
        _write_json(tmp / "speculative_config.json", speculative_config(result.table.as_lists()))
        if draw_png is not None:
            draw_png(outcome.profile, result, tmp / PNG_FILE)
        _publish(tmp, out, names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result, {name: out / name for name in names}


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _publish(tmp: Path, out: Path, names: tuple[str, ...]) -> None:
    """Rename the folder into place; into an existing folder, replace file by file."""
    if not out.exists():
        os.rename(tmp, out)
        return
    for name in names:
        os.replace(tmp / name, out / name)
