"""Per-position acceptance counts, censoring-correct, and the profile that holds them.

Conventions (position j counts from 1; list index j-1):

* A draft of length k whose first m tokens were accepted *reached* positions
  1..min(m+1, k) and *accepted* positions 1..m. Position j is only tested when
  positions < j were accepted, so the data are censored.
* ``reached[j-1]`` / ``accepted[j-1]`` are those counts. The conditional rate is
  a_j = accepted_j / reached_j: the drafts that got to j, and of those, how many
  passed it.
* ``drafted[j-1]`` counts drafts of length >= j, whatever happened before j. This
  is vLLM's ``SpecDecodingStats.num_draft_tokens_per_pos``; vLLM's
  ``num_accepted_tokens_per_pos`` is our ``accepted``. Their ratio
  accepted_j / drafted_j estimates the *survival* S_j = prod_{i<=j} a_i, not a_j.

``from_vllm_counts`` converts vLLM's (drafted, accepted) per position into
reached counts: exact when every draft had the same length, and otherwise it
assumes draft length and acceptance are independent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.errors import InputError
from tabletune.profile import _as_float, _as_int, _check_schema, _expect_dict

ACCEPT_SCHEMA = "tabletune.acceptance_profile"
ACCEPT_VERSION = 1


@dataclass
class AcceptanceCounts:
    """Censored per-position counts for one (drafter, workload, temperature)."""

    k_max: int
    workload: str = "default"
    temperature: float = 0.0
    drafter: str = ""
    num_drafts: int = 0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    undrafted: int = 0  # decode request-steps with k >= 1 asked for in which the drafter proposed nothing

    def __post_init__(self) -> None:
        for name in ("reached", "accepted", "drafted"):
            values = getattr(self, name)
            if not values:
                setattr(self, name, [0] * self.k_max)
            elif len(values) != self.k_max:
                raise ValueError(f"{name} has {len(values)} positions, k_max is {self.k_max}")

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified draft of length k with m accepted tokens (m <= k)."""
        k, m = num_draft_tokens, num_accepted_tokens
        if k <= 0:
            return
        k = min(k, self.k_max)
        m = min(m, k)
        self.num_drafts += 1
        for j in range(k):
            self.drafted[j] += 1
        for j in range(min(m + 1, k)):
            self.reached[j] += 1
        for j in range(m):
            self.accepted[j] += 1

    def observe_drafts(self, ks: np.ndarray, ms: np.ndarray) -> None:
        """``observe_draft`` for many drafts at once: k and m per draft (arrays of one length)."""
        k = np.minimum(np.asarray(ks, np.int64), self.k_max)
        m = np.minimum(np.asarray(ms, np.int64), k)[k > 0]
        k = k[k > 0]
        self.num_drafts += len(k)
        for name, upto in (("drafted", k), ("reached", np.minimum(m + 1, k)), ("accepted", m)):
            at_least = np.bincount(upto, minlength=self.k_max + 1)[::-1].cumsum()[::-1]  # [j]: drafts with >= j
            counts = getattr(self, name)
            for j in range(self.k_max):
                counts[j] += int(at_least[j + 1])

    def observe_undrafted(self, count: int = 1) -> None:
        """Count request-steps that verified no draft although k >= 1 was asked (no n-gram match)."""
        self.undrafted += count

    @property
    def draft_rate(self) -> float:
        """q = drafts / (drafts + undrafted request-steps): the share of request-steps that draft.

        1.0 for drafters that always propose (a draft model, EAGLE) or when nothing was counted;
        below 1 for prompt-lookup (n-gram) drafting, which proposes only on a match.
        """
        total = self.num_drafts + self.undrafted
        return self.num_drafts / total if total else 1.0

    def rates(self) -> list[float | None]:
        """a_j = accepted_j / reached_j; None where no draft reached position j."""
        return [a / r if r > 0 else None for a, r in zip(self.accepted, self.reached)]

    def survival(self) -> list[float | None]:
        """vLLM's per-position ratio accepted_j / drafted_j, an estimate of prod_{i<=j} a_i."""
        return [a / d if d > 0 else None for a, d in zip(self.accepted, self.drafted)]

    def known_rates(self) -> list[float]:
        """The leading run of positions with evidence, as conditional rates."""
        out: list[float] = []
        for r in self.rates():
            if r is None:
                break
            out.append(r)
        return out

    def mean_accepted_length(self) -> float:
        """Mean accepted tokens per draft, bonus token excluded."""
        return sum(self.accepted) / self.num_drafts if self.num_drafts else 0.0

    @classmethod
    def from_vllm_counts(
        cls,
        num_drafts: int,
        drafted: Sequence[int],
        accepted: Sequence[int],
        **labels: object,
    ) -> AcceptanceCounts:
        """Build censored counts from vLLM's per-position drafted/accepted counts.

        reached_1 = drafted_1 (every draft tests its first token); for j >= 2 the
        drafts that reached j are those that accepted j-1 and were long enough to
        have a j-th token: accepted_{j-1} * drafted_j / drafted_{j-1}. With one
        draft length throughout, drafted_j == drafted_{j-1} and this is exact.
        """
        k_max = len(drafted)
        reached = [0] * k_max
        for j in range(k_max):
            if j == 0:
                reached[j] = drafted[0]
            elif drafted[j - 1] > 0:
                reached[j] = round(accepted[j - 1] * drafted[j] / drafted[j - 1])
        return cls(k_max=k_max, num_drafts=num_drafts, reached=reached, accepted=list(accepted),
                   drafted=list(drafted), **labels)  # type: ignore[arg-type]


@dataclass
class AcceptanceProfile:
    """Acceptance counts per (drafter, workload, temperature), plus where they came from."""

    entries: list[AcceptanceCounts]
    model: str = ""
    command: str = ""
    source: str = "<memory>"

    def select(self, workload: str | None = None, temperature: float | None = None) -> AcceptanceCounts:
        """The single entry matching the filters; an error if none or several match."""
        found = [
            e for e in self.entries
            if (workload is None or e.workload == workload) and (temperature is None or e.temperature == temperature)
        ]
        if len(found) != 1:
            choices = [(e.workload, e.temperature) for e in self.entries]
            raise InputError(self.source, "entries", {"workload": workload, "temperature": temperature},
                             f"matches {len(found)} entries; choose one of {choices}")
        return found[0]

    def to_json(self) -> dict:
        return {
            "schema": ACCEPT_SCHEMA,
            "version": ACCEPT_VERSION,
            "model": self.model,
            "command": self.command,
            "entries": [
                {**dataclasses.asdict(e), "rates": [None if r is None else round(r, 6) for r in e.rates()],
                 "draft_rate": round(e.draft_rate, 6)}
                for e in self.entries
            ],
        }

    def save(self, path: str | Path) -> None:
        fileio.write_json(path, self.to_json())

    @classmethod
    def from_json(cls, obj: object, source: str = "<json>") -> AcceptanceProfile:
        d = _expect_dict(obj, source, "<root>")
        _check_schema(d, source, ACCEPT_SCHEMA, ACCEPT_VERSION)
        raw = d.get("entries")
        if not isinstance(raw, list) or not raw:
            raise InputError(source, "entries", raw, "must be a non-empty list")
        entries = []
        for i, e in enumerate(raw):
            e = _expect_dict(e, source, f"entries[{i}]")
            k_max = _as_int(e.get("k_max"), source, f"entries[{i}].k_max")
            if k_max < 1:
                raise InputError(source, f"entries[{i}].k_max", k_max, "must be >= 1")
            lists = {}
            for name in ("reached", "accepted", "drafted"):
                values = e.get(name, [])
                if not isinstance(values, list) or (values and len(values) != k_max):
                    raise InputError(source, f"entries[{i}].{name}", values, f"must be a list of {k_max} counts")
                lists[name] = [_as_int(v, source, f"entries[{i}].{name}") for v in values]
                if any(v < 0 for v in lists[name]):
                    raise InputError(source, f"entries[{i}].{name}", values, "counts must be >= 0")
            for j, (a, r) in enumerate(zip(lists["accepted"], lists["reached"] or lists["accepted"])):
                if a > r:
                    raise InputError(source, f"entries[{i}].accepted[{j}]", a, f"exceeds reached[{j}]={r}")
            entries.append(AcceptanceCounts(
                k_max=k_max,
                workload=str(e.get("workload", "default")),
                temperature=_as_float(e.get("temperature", 0.0), source, f"entries[{i}].temperature"),
                drafter=str(e.get("drafter", "")),
                num_drafts=_as_int(e.get("num_drafts", 0), source, f"entries[{i}].num_drafts"),
                undrafted=_nonnegative(_as_int(e.get("undrafted", 0), source, f"entries[{i}].undrafted"),
                                       source, f"entries[{i}].undrafted"),
                **lists,
            ))
        return cls(entries=entries, model=str(d.get("model", "")), command=str(d.get("command", "")), source=source)

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceProfile:
        return cls.from_json(fileio.read_json(path), source=str(path))


def _nonnegative(value: int, source: str, field: str) -> int:
    if value < 0:
        raise InputError(source, field, value, "must be >= 0")
    return value


def validate_rates(rates: Sequence[float], source: str, field: str = "acceptance") -> list[float]:
    """Conditional rates must lie in (0, 1]."""
    out = []
    for i, r in enumerate(rates):
        if not isinstance(r, (int, float)) or isinstance(r, bool) or math.isnan(r) or not 0 < r <= 1:
            raise InputError(source, f"{field}[{i}]", r, "acceptance rates must lie in (0, 1]")
        out.append(float(r))
    if not out:
        raise InputError(source, field, list(rates), "no rates given")
    return out


def parse_rates(text: str, source: str = "--acceptance") -> list[float]:
    """Parse 'a1,a2,...' into conditional rates in (0, 1]."""
    values = [_as_float(t, source, "acceptance") for t in text.split(",") if t.strip()]
    return validate_rates(values, source)


def load_acceptance(spec: str, workload: str | None = None,
                    temperature: float | None = None) -> tuple[list[float], float]:
    """(rates, draft rate q) from 'a1,a2,...' (q = 1) or from an AcceptanceProfile JSON file."""
    if Path(spec).suffix == ".json" or Path(spec).exists():
        entry = AcceptanceProfile.load(spec).select(workload, temperature)
        rates = validate_rates([max(r, 1e-6) for r in entry.known_rates()], spec, "rates")
        return rates, entry.draft_rate
    return parse_rates(spec), 1.0


def load_rates(spec: str, workload: str | None = None, temperature: float | None = None) -> list[float]:
    """Rates from 'a1,a2,...' or from an AcceptanceProfile JSON file."""
    return load_acceptance(spec, workload, temperature)[0]
