"""The partial profile: every measured point appended to disk as it is measured, for ``--resume``.

``points.jsonl`` in the checkpoint folder holds one JSON object per line:

* ``{"kind": "start", "settings": {...}}``: what the run measures (engine spec and grid);
  a resume refuses a folder whose settings differ;
* ``{"kind": "acceptance", "counts": {...}, "steps": [...]}``: the acceptance pass;
* ``{"kind": "yield", "k": k, "counts": {...}, "steps": [...]}``: the acceptance run at one shorter k,
  for a drafter that proposes only on a match (``tabletune.tuner.yields``); ``steps`` are the decode
  steps the engine recorded during a run, ``[batch_size, k_top, k_bar, measured_ms]`` each;
* ``{"kind": "point", "context_len": N, "batch_size": b, "k": k, "samples_ms": [...],
  "scheduled_tokens": [...]}``: one grid point, appended (and fsync'd) as soon as
  its batch size is measured.

A torn last line (a crash mid-write) is ignored; any other line that is not a record
(not JSON, or missing fields) is refused, naming the file and the line (exit 2). The finished run's outputs
are still written all or nothing (``tabletune.tuner.files``); the checkpoint
folder is removed only after they are in place. Core: no torch, no vllm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from tabletune.acceptance import AcceptanceCounts
from tabletune.cost import MixedStep
from tabletune.tuner.yields import AcceptanceRun
from tabletune.errors import InputError
from tabletune.profile import StepPoint

FILE = "points.jsonl"


class Checkpoint:
    """Append-only record of one tune; ``open`` starts or resumes it."""

    def __init__(self, folder: Path, settings: dict) -> None:
        self.folder = folder
        self.settings = settings
        self.acceptance: AcceptanceRun | None = None  # the pass at k_max
        self.yield_runs: dict[int, AcceptanceRun] = {}  # k -> the run at that shorter k
        self.points: dict[int, dict[tuple[int, int], StepPoint]] = {}  # context_len -> (b, k) -> point
        self._fresh = False

    @classmethod
    def open(cls, folder: str | Path, settings: dict, resume: bool) -> Checkpoint:
        """A fresh checkpoint in ``folder``, or (``resume``) the one there, whose settings must match."""
        path = Path(folder) / FILE
        cp = cls(Path(folder), settings)
        if not resume:
            if path.exists():
                raise InputError(str(path), "<file>", str(folder),
                                 "an interrupted tune is here: pass --resume with it, or delete it")
            cp._fresh = True  # the folder and its start record appear with the first measurement
            return cp
        if not path.is_file():
            raise InputError("--resume", "folder", str(folder), f"no {FILE} here")
        cp._replay(path)
        return cp

    def _replay(self, path: Path) -> None:
        lines = path.read_text().splitlines()
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break  # torn last line: the crash interrupted this write
                raise InputError(str(path), f"line {i + 1}", line[:40], "not JSON") from None
        if not records or records[0].get("kind") != "start":
            raise InputError(str(path), "line 1", lines[:1], "expected the start record")
        old = records[0].get("settings", {})
        for key in sorted(set(old) | set(self.settings)):
            if old.get(key) != self.settings.get(key):
                raise InputError(str(path), f"settings.{key}", old.get(key),
                                 f"this run has {self.settings.get(key)!r}; resume with the same options")
        for i, rec in enumerate(records[1:], 2):
            try:
                self._restore(rec)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise InputError(str(path), f"line {i}", lines[i - 1][:40],
                                 f"not a checkpoint record ({type(exc).__name__}: {exc})") from None

    def _restore(self, rec: dict) -> None:
        """One replayed record (a malformed one raises KeyError, TypeError or ValueError)."""
        if rec.get("kind") == "acceptance":
            self.acceptance = _run(rec)
        elif rec.get("kind") == "yield":
            self.yield_runs[int(rec["k"])] = _run(rec)
        elif rec.get("kind") == "point":
            p = StepPoint(int(rec["batch_size"]), int(rec["k"]), tuple(map(float, rec["samples_ms"])),
                          tuple(rec.get("scheduled_tokens", ())))
            self.points.setdefault(int(rec["context_len"]), {})[(p.batch_size, p.k)] = p

    def _append(self, record: dict) -> None:
        if self._fresh:
            self._fresh = False
            self.folder.mkdir(parents=True, exist_ok=True)
            self._append({"kind": "start", "settings": self.settings})
        with open(self.folder / FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def save_acceptance(self, run: AcceptanceRun) -> None:
        self.acceptance = run
        self._append({"kind": "acceptance", **_record(run)})

    def save_yield_run(self, k: int, run: AcceptanceRun) -> None:
        self.yield_runs[k] = run
        self._append({"kind": "yield", "k": k, **_record(run)})

    def save_points(self, context_len: int, points: Iterable[StepPoint]) -> None:
        for p in points:
            self.points.setdefault(context_len, {})[(p.batch_size, p.k)] = p
            self._append({"kind": "point", "context_len": context_len, "batch_size": p.batch_size, "k": p.k,
                          "samples_ms": list(p.samples_ms), "scheduled_tokens": list(p.scheduled_tokens)})

    def done_points(self, context_len: int) -> dict[tuple[int, int], StepPoint]:
        return dict(self.points.get(context_len, {}))

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _record(run: AcceptanceRun) -> dict:
    return {"counts": dataclasses.asdict(run.counts),
            "steps": [[s.batch_size, s.k_top, s.k_bar, s.measured_ms] for s in run.steps]}


def _run(rec: dict) -> AcceptanceRun:
    steps = tuple(MixedStep(int(b), int(k_top), float(k_bar), float(ms)) for b, k_top, k_bar, ms in rec.get("steps", ()))
    return AcceptanceRun(AcceptanceCounts(**rec["counts"]), steps)
