"""What ``tabletune tune`` writes, and the gains it predicts. Core: no torch, no vllm.

A run's folder holds ``step_profile.json``, ``acceptance.json``, ``table.json``
(vLLM's keys), ``speculative_config.json`` (the whole ``--speculative-config``),
``sglang_adaptive_config.json`` (SGLang's ``--speculative-adaptive-config``) and, when the
caller passes a drawing function, ``tune.png``; for a drafter that proposes
only on a match, ``yields.json`` (the per-k yields the table was built from); with a static check,
``static_check.json`` (``static_json``, written after the rest). With several context
lengths each profile gets a ``context-<N>/`` folder and the top holds
``table_by_context.json`` (``tabletune.table.ContextTable``) and ``batch_caps.json`` (``caps_json``:
how many sequences each context held). A context measured only up to
the largest batch it holds (``TuneOutcome.batch_cap``) has its table's last k extended to
``max_num_seqs``. The table comes from ``tabletune.simple_table.smooth_within_noise`` (k changes
only for a gain the points resolve), never from a plot, so the JSON files need no matplotlib; the
PNG is drawn from the same ``TableResult`` (``tabletune.plot.draw_tune_png``).
Every file is first written into a temporary sibling folder; only when all of
them exist are they moved into place, so a failed run leaves nothing half-written.

Predicted gains compare goodput(b) = b * E[tokens | k(b)] / T(b, k(b)) of the
tuned table with (a) the best single fixed k and (b) vLLM's documented example
table ``VLLM_DOCUMENTED_RANGES`` clamped to k_max, as mean and minimum over
b = 1..max_batch of table / other - 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tabletune import fileio
from tabletune.acceptance import AcceptanceProfile
from tabletune.errors import InputError
from tabletune.goodput import DraftYield
from tabletune.optimizer import TableResult, evaluate_table, gain_vs
from tabletune.profile import StepProfile
from tabletune.sglang_config import to_sglang
from tabletune.simple_table import smooth_within_noise
from tabletune.table import VLLM_DOCUMENTED_RANGES, ContextRow, ContextTable, DraftTable
from tabletune.tuner.run import TuneOutcome
from tabletune.tuner.static_check import StaticDecision

SGLANG_FILE = "sglang_adaptive_config.json"  # SGLang's --speculative-adaptive-config (``tabletune.sglang_config``)
JSON_FILES = ("step_profile.json", "acceptance.json", "table.json", "speculative_config.json", SGLANG_FILE)
YIELDS_FILE = "yields.json"
PNG_FILE = "tune.png"
STATIC_FILE = "static_check.json"
BY_CONTEXT_FILE = "table_by_context.json"
CAPS_FILE = "batch_caps.json"
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
    options = outcome.options()
    doc = evaluate_table(outcome.profile, outcome.rates, documented, max_batch, result.ks,
                         draft_share=options.draft_share, yields=options.yields)
    k = result.best_single_k
    return Gains(k, result.gain_vs_fixed(k), documented, gain_vs(result.predictions, [p.goodput for p in doc]))


def write_run(out_dir: str | Path, outcome: TuneOutcome, speculative_config: Callable[[list[list[int]]], dict],
              command: str = "", draw_png: DrawPng | None = None,
              noise_floor: float = 0.0) -> tuple[TableResult, dict[str, Path]]:
    """Optimise (``smooth_within_noise``) and write the JSON files (and ``tune.png`` with ``draw_png``)
    into ``out_dir``, all or nothing."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    names = (*(JSON_FILES if draw_png is None else FILES), *((YIELDS_FILE,) if outcome.yields else ()))
    try:
        result = _write_files(tmp, outcome, speculative_config, command, draw_png, noise_floor)
        _publish(tmp, out, names)
        if not outcome.yields:  # a previous run's yields do not belong to this table
            (out / YIELDS_FILE).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result, {name: out / name for name in names}


def _write_files(folder: Path, outcome: TuneOutcome, speculative_config: Callable[[list[list[int]]], dict],
                 command: str, draw_png: DrawPng | None, noise_floor: float) -> TableResult:
    folder.mkdir(parents=True, exist_ok=True)
    k_max = max(outcome.profile.ks)
    outcome.profile.save(folder / "step_profile.json")
    AcceptanceProfile([outcome.acceptance], model=outcome.profile.fingerprint.model,
                      command=command).save(folder / "acceptance.json")
    if outcome.yields:
        _write_json(folder / YIELDS_FILE, yields_json(outcome))
    result = smooth_within_noise(outcome.profile, outcome.rates, outcome.options(), noise_floor)
    cap = outcome.batch_cap
    if cap is not None and cap.capped:  # measured up to what this context holds: its last k on to max_num_seqs
        result = dataclasses.replace(result, table=result.table.extended_to(cap.max_num_seqs))
    _write_json(folder / "table.json", result.table.to_vllm(k_max))
    _write_json(folder / "speculative_config.json", speculative_config(result.table.as_lists()))
    _write_json(folder / SGLANG_FILE, to_sglang(result.table))
    if draw_png is not None:
        draw_png(outcome.profile, result, folder / PNG_FILE)
    return result


def yields_json(outcome: TuneOutcome) -> dict:
    """The per-k yields the table was built from (a drafter that proposes only on a match)."""
    share = outcome.draft_share
    return {"draft_share": share.value, "draft_share_source": share.source, "draft_share_steps": share.fitted_steps,
            "draft_share_level": share.level,
            "yields": [{"k": y.k, "tokens_per_step": y.tokens_per_step, "draft_rate": y.draft_rate}
                       for y in outcome.yields]}


def load_yields(path: str | Path) -> tuple[tuple[DraftYield, ...], float]:
    """(yields, draft share) of a ``yields.json`` that ``yields_json`` wrote; a file that is not one is
    InputError."""
    saved = fileio.read_json(path)
    try:
        return tuple(DraftYield(**y) for y in saved["yields"]), float(saved["draft_share"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(str(path), "yields", type(exc).__name__, f"not a tune's yields.json ({exc})") from None


def static_json(decision: StaticDecision, speculative_config: Callable[[list[list[int]]], dict]) -> dict:
    """The static check's numbers and, when it recommends static, the config to serve (no table)."""
    config = {key: value for key, value in speculative_config([[1, 1, decision.k]]).items()
              if key != "num_speculative_tokens_per_batch_size"}
    config["num_speculative_tokens"] = decision.k
    return {"recommend": "static" if decision.recommend_static else "table", "k": decision.k,
            "mean_vs_static": decision.mean_vs_static, "mean_dynamic_cost": decision.mean_dynamic_cost,
            "mean_table_gain": decision.mean_table_gain, "min_gain": decision.min_gain,
            "points": [dataclasses.asdict(p) for p in decision.points],
            "no_spec": [dataclasses.asdict(p) for p in decision.no_spec], "no_spec_from": decision.no_spec_from,
            "static_speculative_config": config if decision.k > 0 else None}


def caps_json(outcomes: Sequence[TuneOutcome]) -> dict:
    """Each context's ``BatchCap``: the batch it was measured up to, and the free memory that came from."""
    return {"by_context": [{**dataclasses.asdict(o.batch_cap), "capped": o.batch_cap.capped}
                           for o in outcomes if o.batch_cap is not None]}


def write_runs(out_dir: str | Path, outcomes: Sequence[TuneOutcome],
               speculative_config: Callable[[list[list[int]]], dict], command: str = "",
               draw_png: DrawPng | None = None,
               noise_floor: float = 0.0) -> tuple[list[TableResult], dict[str, Path]]:
    """One context: ``write_run``. Several: ``context-<N>/`` per profile (as ``write_run`` writes), and at the top
    ``table_by_context.json`` (``tabletune.table.ContextTable``), ``batch_caps.json`` (``caps_json``) and
    ``speculative_config.json`` with the smallest context's row as vLLM's own table (and SGLang's, which has no
    context axis); all or nothing."""
    if len(outcomes) == 1:
        result, files = write_run(out_dir, outcomes[0], speculative_config, command, draw_png, noise_floor)
        return [result], files
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    names = [BY_CONTEXT_FILE, CAPS_FILE, "speculative_config.json", SGLANG_FILE]
    try:
        results = []
        for outcome in outcomes:
            sub = f"context-{outcome.profile.context_len}"
            results.append(_write_files(tmp / sub, outcome, speculative_config, command, draw_png, noise_floor))
            names.append(sub)
        table = ContextTable(tuple(ContextRow(o.profile.context_len, r.table) for o, r in zip(outcomes, results)))
        _write_json(tmp / BY_CONTEXT_FILE, table.to_json())
        _write_json(tmp / CAPS_FILE, caps_json(outcomes))
        _write_json(tmp / "speculative_config.json", speculative_config(table.rows[0].table.as_lists()))
        _write_json(tmp / SGLANG_FILE, to_sglang(table.rows[0].table))
        _publish_entries(tmp, out, names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = {name: out / name for name in names if not name.startswith("context-")}
    files["table.json"] = out / f"context-{outcomes[0].profile.context_len}" / "table.json"
    return results, files


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _publish_entries(tmp: Path, out: Path, names: Sequence[str]) -> None:
    """Rename the folder into place; into an existing folder, replace entry by entry (folders too)."""
    if not out.exists():
        os.rename(tmp, out)
        return
    for name in names:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
        os.replace(tmp / name, out / name)


def _publish(tmp: Path, out: Path, names: tuple[str, ...]) -> None:
    """Rename the folder into place; into an existing folder, replace file by file."""
    if not out.exists():
        os.rename(tmp, out)
        return
    for name in names:
        os.replace(tmp / name, out / name)
