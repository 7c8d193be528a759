"""StepProfile: the measured step-time surface T(b, k), with its fingerprint.

A profile holds every timed sample per (batch_size, k); the median is what the
optimizer uses and the spread says how much to trust it. Profiles are versioned
JSON (``schema``/``version``), in the spirit of pyperf: two profiles merge only
when their fingerprints match, unless the caller says otherwise.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tabletune import fileio
from tabletune.errors import InputError
from tabletune.goodput import interpolate
from tabletune.prefill import PrefillCost

STEP_SCHEMA = "tabletune.step_profile"
STEP_VERSION = 1


@dataclass(frozen=True)
class Fingerprint:
    """Where a profile was measured. Profiles with different fingerprints never merge silently."""

    engine: str = "unknown"  # "vllm", "builtin", "csv"
    engine_version: str = ""
    device: str = ""  # GPU or CPU name
    model: str = ""  # model name or shape preset
    dtype: str = ""
    tp_size: int = 1
    runner: str = ""  # model runner and graph mode, e.g. "v1/cudagraph-per-k"
    drafter: str = ""  # speculative method: ngram, eagle, draft_model, ...
    pp_size: int = 1
    graph_mode: str = ""  # CUDA-graph mode the engine ran with, e.g. vLLM's "PIECEWISE" ("none" on CPU)
    flags: str = ""  # the engine's flags beyond the defaults (vLLM: the args after ``--``; builtin: its knobs)
    command: str = ""  # the command that produced the profile (not compared)

    def mismatches(self, other: Fingerprint) -> list[str]:
        """Fields (other than the command) whose values differ."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if f.name != "command" and getattr(self, f.name) != getattr(other, f.name)
        ]


@dataclass(frozen=True)
class StepPoint:
    """All timed samples of one (batch_size, k) point, in ms."""

    batch_size: int
    k: int
    samples_ms: tuple[float, ...]
    # tokens the engine actually scheduled in each timed step, when known
    scheduled_tokens: tuple[int, ...] = ()

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 with fewer than 4 samples)."""
        if len(self.samples_ms) < 4:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples_ms, n=4)
        return (q3 - q1) / self.median_ms


@dataclass(frozen=True)
class StepProfile:
    points: tuple[StepPoint, ...]
    context_len: int
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    source: str = "<memory>"  # file it came from, for error messages
    prefill: PrefillCost | None = None  # the workload's prefill cost on this engine (None: not measured)

    def __post_init__(self) -> None:
        validate_step_profile(self)
        curves: dict[int, tuple[list[int], list[float]]] = {}
        for p in sorted(self.points, key=lambda p: (p.k, p.batch_size)):
            bs, ms = curves.setdefault(p.k, ([], []))
            bs.append(p.batch_size)
            ms.append(p.median_ms)
        object.__setattr__(self, "_curves", curves)
        object.__setattr__(self, "_dense", {})

    @property
    def ks(self) -> list[int]:
        return sorted(self._curves)  # type: ignore[attr-defined]

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({p.batch_size for p in self.points})

    @property
    def max_batch_size(self) -> int:
        return max(p.batch_size for p in self.points)

    def step_ms(self, batch_size: float, k: int) -> float:
        """T(b, k): the measured median, linear in b between measured batch sizes."""
        if k not in self._curves:  # type: ignore[attr-defined]
            raise KeyError(f"k={k} was not measured (measured: {self.ks})")
        bs, ms = self._curves[k]  # type: ignore[attr-defined]
        return interpolate(bs, ms, batch_size)

    def dense_step_ms(self, max_batch: int, k: int) -> tuple[float, ...]:
        """(T(1,k), ..., T(max_batch,k)), computed once per (max_batch, k) and cached."""
        key = (max_batch, k)
        if key not in self._dense:  # type: ignore[attr-defined]
            self._dense[key] = tuple(self.step_ms(b, k) for b in range(1, max_batch + 1))  # type: ignore[attr-defined]
        return self._dense[key]  # type: ignore[attr-defined]

    def merged(self, other: StepProfile, *, force: bool = False) -> StepProfile:
        """Pool the samples of two profiles; refuses differing fingerprints unless forced."""
        diff = self.fingerprint.mismatches(other.fingerprint)
        if self.context_len != other.context_len:
            diff.append("context_len")
        if diff and not force:
            raise InputError(other.source, "fingerprint", diff, f"differs from {self.source}; pass force to merge anyway")
        pooled: dict[tuple[int, int], StepPoint] = {(p.batch_size, p.k): p for p in self.points}
        for p in other.points:
            key = (p.batch_size, p.k)
            if key in pooled:
                q = pooled[key]
                p = StepPoint(p.batch_size, p.k, q.samples_ms + p.samples_ms, q.scheduled_tokens + p.scheduled_tokens)
            pooled[key] = p
        return dataclasses.replace(self, points=tuple(pooled.values()))

    # ---- JSON ---------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "schema": STEP_SCHEMA,
            "version": STEP_VERSION,
            "context_len": self.context_len,
            "fingerprint": dataclasses.asdict(self.fingerprint),
            "points": [
                {
                    "batch_size": p.batch_size,
                    "k": p.k,
                    "median_ms": round(p.median_ms, 6),
                    "spread": round(p.spread, 6),
                    "samples_ms": list(p.samples_ms),
                    **({"scheduled_tokens": list(p.scheduled_tokens)} if p.scheduled_tokens else {}),
                }
                for p in sorted(self.points, key=lambda p: (p.batch_size, p.k))
            ],
            **({"prefill": self.prefill.to_json()} if self.prefill is not None else {}),
        }

    def save(self, path: str | Path) -> None:
        fileio.write_json(path, self.to_json())

    @classmethod
    def from_json(cls, obj: object, source: str = "<json>") -> StepProfile:
        d = _expect_dict(obj, source, "<root>")
        _check_schema(d, source, STEP_SCHEMA, STEP_VERSION)
        fp = _expect_dict(d.get("fingerprint", {}), source, "fingerprint")
        known = {f.name for f in dataclasses.fields(Fingerprint)}
        unknown = sorted(set(fp) - known)
        if unknown:
            raise InputError(source, f"fingerprint.{unknown[0]}", fp[unknown[0]], "unknown fingerprint field")
        raw_points = d.get("points")
        if not isinstance(raw_points, list) or not raw_points:
            raise InputError(source, "points", raw_points, "must be a non-empty list")
        points = []
        for i, rp in enumerate(raw_points):
            rp = _expect_dict(rp, source, f"points[{i}]")
            samples = rp.get("samples_ms")
            if not isinstance(samples, list) or not samples:
                raise InputError(source, f"points[{i}].samples_ms", samples, "must be a non-empty list of ms")
            points.append(
                StepPoint(
                    batch_size=_as_int(rp.get("batch_size"), source, f"points[{i}].batch_size"),
                    k=_as_int(rp.get("k"), source, f"points[{i}].k"),
                    samples_ms=tuple(_as_float(s, source, f"points[{i}].samples_ms") for s in samples),
                    scheduled_tokens=tuple(
                        _as_int(t, source, f"points[{i}].scheduled_tokens") for t in rp.get("scheduled_tokens", [])
                    ),
                )
            )
        for name, value in fp.items():
            want = int if name in ("tp_size", "pp_size") else str
            if not isinstance(value, want) or isinstance(value, bool):
                raise InputError(source, f"fingerprint.{name}", value, f"must be {want.__name__}")
        fingerprint = Fingerprint(**fp)
        return cls(
            points=tuple(points),
            context_len=_as_int(d.get("context_len"), source, "context_len"),
            fingerprint=fingerprint,
            source=source,
            prefill=PrefillCost.from_json(d["prefill"], source) if d.get("prefill") is not None else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> StepProfile:
        """Load a profile JSON, or a CSV with columns batch_size,k,step_ms."""
        if str(path).lower().endswith(".csv"):
            return step_profile_from_csv(path)
        return cls.from_json(fileio.read_json(path), source=str(path))


def validate_step_profile(profile: StepProfile) -> None:
    src = profile.source
    if profile.context_len < 0:
        raise InputError(src, "context_len", profile.context_len, "must be >= 0")
    if not profile.points:
        raise InputError(src, "points", [], "no measurements")
    seen: set[tuple[int, int]] = set()
    for p in profile.points:
        if p.batch_size < 1:
            raise InputError(src, "batch_size", p.batch_size, "must be >= 1")
        if p.k < 0:
            raise InputError(src, "k", p.k, "must be >= 0")
        if not p.samples_ms:
            raise InputError(src, "step_ms", [], f"no samples for batch_size={p.batch_size}, k={p.k}")
        for s in p.samples_ms:
            if not math.isfinite(s) or s <= 0:
                raise InputError(src, "step_ms", s, f"must be a positive number (batch_size={p.batch_size}, k={p.k})")
        if (p.batch_size, p.k) in seen:
            raise InputError(src, "points", (p.batch_size, p.k), "duplicate (batch_size, k) point")
        seen.add((p.batch_size, p.k))


def step_profile_from_csv(
    path: str | Path, fingerprint: Fingerprint | None = None, context_len: int = 0
) -> StepProfile:
    """Read ``batch_size,k,step_ms`` rows; several rows per (b, k) are samples."""
    src = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(src, "<file>", src, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(src, "<file>", src, "not UTF-8 text") from None
    return step_profile_from_csv_text(text, src, fingerprint, context_len)


def step_profile_from_csv_text(
    text: str, source: str, fingerprint: Fingerprint | None = None, context_len: int = 0
) -> StepProfile:
    reader = csv.DictReader(io.StringIO(text))
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise InputError(source, "<csv>", str(exc), "malformed CSV") from None
    header = [h.strip() for h in (reader.fieldnames or [])]
    for col in ("batch_size", "k", "step_ms"):
        if col not in header:
            raise InputError(source, col, header, "missing column")
    samples: dict[tuple[int, int], list[float]] = {}
    for line, row in enumerate(rows, start=2):
        row = {(key or "").strip(): (val or "").strip() if isinstance(val, str) else val for key, val in row.items()}
        b = _as_int(row.get("batch_size"), source, f"batch_size (line {line})")
        k = _as_int(row.get("k"), source, f"k (line {line})")
        ms = _as_float(row.get("step_ms"), source, f"step_ms (line {line})")
        if ms <= 0:
            raise InputError(source, f"step_ms (line {line})", ms, "must be positive")
        if b < 1:
            raise InputError(source, f"batch_size (line {line})", b, "must be >= 1")
        if k < 0:
            raise InputError(source, f"k (line {line})", k, "must be >= 0")
        samples.setdefault((b, k), []).append(ms)
    if not samples:
        raise InputError(source, "step_ms", None, "no data rows")
    points = tuple(StepPoint(b, k, tuple(v)) for (b, k), v in sorted(samples.items()))
    fp = fingerprint or Fingerprint(engine="csv", command=f"imported from {Path(source).name}")
    return StepProfile(points=points, context_len=context_len, fingerprint=fp, source=source)


# ---- small parsing helpers shared by the JSON readers ------------------------


def _expect_dict(obj: object, source: str, field: str) -> dict:
    if not isinstance(obj, dict):
        raise InputError(source, field, obj if not isinstance(obj, (list, str)) else type(obj).__name__, "must be an object")
    return obj


def _check_schema(d: dict, source: str, schema: str, version: int) -> None:
    if d.get("schema") != schema:
        raise InputError(source, "schema", d.get("schema"), f"expected '{schema}'")
    if d.get("version") != version:
        raise InputError(source, "version", d.get("version"), f"unknown schema version (this tabletune reads {version})")


def _as_int(value: object, source: str, field: str) -> int:
    if isinstance(value, bool):
        raise InputError(source, field, value, "must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise InputError(source, field, value, "must be an integer")


def _as_float(value: object, source: str, field: str) -> float:
    if isinstance(value, bool):
        raise InputError(source, field, value, "must be a number")
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(source, field, value, "must be a number") from None
    if not math.isfinite(out):
        raise InputError(source, field, value, "must be finite")
    return out


def parse_int_list(text: str, source: str, field: str) -> list[int]:
    """Parse '0,1,3' into [0, 1, 3]."""
    return [_as_int(t, source, field) for t in text.split(",") if t.strip()]


def as_float_list(values: Sequence[object], source: str, field: str) -> list[float]:
    return [_as_float(v, source, f"{field}[{i}]") for i, v in enumerate(values)]
