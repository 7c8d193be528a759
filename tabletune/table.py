"""DraftTable: vLLM's ``num_speculative_tokens_per_batch_size`` ranges.

A table is a list of inclusive ranges ``[[start_bs, end_bs, k], ...]``. vLLM's
rules (``vllm/v1/spec_decode/dynamic/utils.py``): each entry is a triple,
start >= 1, start <= end, k >= 0, ranges do not overlap, the first range starts
at 1, and every k is <= ``num_speculative_tokens``. vLLM expands the ranges into
a dense lookup indexed by batch size: a gap between ranges takes the previous
range's k, and beyond the last range the last k applies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabletune import fileio
from tabletune.errors import InputError

Range = tuple[int, int, int]

#: The example table in vLLM's documentation for dynamic speculative decoding.
VLLM_DOCUMENTED_RANGES: tuple[Range, ...] = ((1, 16, 5), (17, 32, 4), (33, 64, 3), (65, 128, 1), (129, 512, 0))
#: The documented table with every range bound divided by 4 (a mistuned start).
VLLM_DOCUMENTED_DIV4_RANGES: tuple[Range, ...] = ((1, 4, 5), (5, 8, 4), (9, 16, 3), (17, 32, 1), (33, 512, 0))


@dataclass(frozen=True)
class DraftTable:
    """Validated, sorted ranges. Build with ``from_ranges`` or ``from_dense``."""

    ranges: tuple[Range, ...]

    @classmethod
    def from_ranges(
        cls, ranges: object, num_speculative_tokens: int | None = None, source: str = "table"
    ) -> DraftTable:
        """Validate ranges by vLLM's rules; errors name the offending entry."""
        if not isinstance(ranges, (list, tuple)) or not ranges:
            raise InputError(source, "num_speculative_tokens_per_batch_size", ranges, "must be a non-empty list")
        parsed: list[Range] = []
        for i, entry in enumerate(ranges):
            field = f"num_speculative_tokens_per_batch_size[{i}]"
            if not isinstance(entry, (list, tuple)) or len(entry) != 3:
                raise InputError(source, field, entry, "must be a triple [start_bs, end_bs, k]")
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in entry):
                raise InputError(source, field, entry, "entries must be integers")
            start, end, k = entry
            if start < 1:
                raise InputError(source, field, list(entry), "start_bs must be >= 1")
            if start > end:
                raise InputError(source, field, list(entry), "start_bs must be <= end_bs")
            if k < 0:
                raise InputError(source, field, list(entry), "k must be >= 0")
            if num_speculative_tokens is not None and k > num_speculative_tokens:
                raise InputError(source, field, list(entry), f"k exceeds num_speculative_tokens={num_speculative_tokens}")
            parsed.append((start, end, k))
        parsed.sort()
        prev_end = 0
        for start, end, k in parsed:
            if start <= prev_end:
                raise InputError(source, "num_speculative_tokens_per_batch_size", [start, end, k],
                                 f"overlaps the range ending at {prev_end}")
            prev_end = end
        if parsed[0][0] != 1:
            raise InputError(source, "num_speculative_tokens_per_batch_size", list(parsed[0]), "first range must start at 1")
        return cls(tuple(parsed))

    @classmethod
    def from_dense(cls, ks: Sequence[int]) -> DraftTable:
        """Compress ``ks[b-1]`` (the k for batch size b) into ranges."""
        if not ks:
            raise ValueError("empty dense table")
        ranges: list[Range] = []
        start = 1
        for b in range(2, len(ks) + 2):
            if b == len(ks) + 1 or ks[b - 1] != ks[b - 2]:
                ranges.append((start, b - 1, int(ks[b - 2])))
                start = b
        return cls.from_ranges(ranges)

    @classmethod
    def fixed(cls, k: int, max_batch: int = 1) -> DraftTable:
        return cls(((1, max_batch, k),))

    @property
    def k_max(self) -> int:
        return max(k for _, _, k in self.ranges)

    def dense(self, max_batch: int, num_speculative_tokens: int | None = None) -> list[int]:
        """vLLM's expansion: index b (1..max_batch) holds k; index 0 is unused (0).

        Gaps take the previous k; past the last range the last k applies; every
        k is clamped to ``num_speculative_tokens`` as vLLM does.
        """
        cap = self.k_max if num_speculative_tokens is None else num_speculative_tokens
        out = [0] * (max_batch + 1)
        b = 1
        for start, end, k in self.ranges:
            if b > max_batch:
                break
            prev = out[b - 1] if b > 1 else k
            for bb in range(b, min(start, max_batch + 1)):
                out[bb] = prev
            for bb in range(max(start, b), min(end, max_batch) + 1):
                out[bb] = min(k, cap)
            b = max(b, end + 1)
        last = min(self.ranges[-1][2], cap)
        for bb in range(b, max_batch + 1):
            out[bb] = last
        return out

    def k_for(self, batch_size: int) -> int:
        """The k vLLM schedules at this batch size."""
        for start, end, k in reversed(self.ranges):
            if batch_size >= start:
                return k
        raise ValueError(f"batch_size {batch_size} < 1")

    def extended_to(self, max_batch: int) -> DraftTable:
        """The same table with its last range reaching ``max_batch`` (the last k held beyond what was measured)."""
        *head, (start, end, k) = self.ranges
        return DraftTable((*head, (start, max(end, max_batch), k)))

    def clamped(self, k_max: int) -> DraftTable:
        return DraftTable(tuple((s, e, min(k, k_max)) for s, e, k in self.ranges))

    # ---- output formats -----------------------------------------------------

    def as_lists(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]

    def to_vllm(self, num_speculative_tokens: int | None = None) -> dict:
        """The keys to merge into vLLM's ``--speculative-config``."""
        n = self.k_max if num_speculative_tokens is None else num_speculative_tokens
        return {"num_speculative_tokens": max(n, 1), "num_speculative_tokens_per_batch_size": self.as_lists()}

    def to_trtllm(self) -> dict:
        """TensorRT-LLM's ``draft_len_schedule``: {end_bs: k}; beyond the last key k is 0.

        Trailing k=0 ranges are implicit there. A last range with k > 0 is open-ended
        in vLLM but ends at its ``end_bs`` in TensorRT-LLM.
        """
        ranges = list(self.ranges)
        while ranges and ranges[-1][2] == 0:
            ranges.pop()
        return {"draft_len_schedule": {str(end): k for _, end, k in ranges}}

    @classmethod
    def load(cls, path: str | Path) -> DraftTable:
        """A table file: vLLM format (object with the ranges key), or a bare list of ranges."""
        obj = fileio.read_json(path)
        if isinstance(obj, dict):
            n = obj.get("num_speculative_tokens")
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
                raise InputError(str(path), "num_speculative_tokens", n, "must be a positive integer")
            return cls.from_ranges(obj.get("num_speculative_tokens_per_batch_size"), n, source=str(path))
        return cls.from_ranges(obj, source=str(path))

    def __str__(self) -> str:
        return json.dumps(self.as_lists())


@dataclass(frozen=True)
class ContextRow:
    max_context_len: int  # the row covers contexts up to this many tokens (the last row: every longer one too)
    table: DraftTable


@dataclass(frozen=True)
class ContextTable:
    """A 2-D table: one ``DraftTable`` per context-length bucket, rows sorted by ``max_context_len``.

    JSON: ``{"by_context": [{"max_context_len": N, "num_speculative_tokens_per_batch_size":
    [[lo, hi, k], ...]}, ...]}``. A step whose context is c uses the first row with
    c <= max_context_len, and the last row when c exceeds every bound (open-ended).
    """

    rows: tuple[ContextRow, ...]

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("a by-context table needs at least one row")
        bounds = [r.max_context_len for r in self.rows]
        if bounds != sorted(set(bounds)) or bounds[0] < 1:
            raise ValueError(f"max_context_len must be >= 1 and strictly increasing, got {bounds}")

    def row_index(self, context_len: float) -> int:
        for i, row in enumerate(self.rows):
            if context_len <= row.max_context_len:
                return i
        return len(self.rows) - 1

    def table_for(self, context_len: float) -> DraftTable:
        return self.rows[self.row_index(context_len)].table

    @property
    def k_max(self) -> int:
        return max(r.table.k_max for r in self.rows)

    def to_json(self) -> dict:
        return {"by_context": [{"max_context_len": r.max_context_len,
                                "num_speculative_tokens_per_batch_size": r.table.as_lists()} for r in self.rows]}

    @classmethod
    def from_json(cls, obj: object, source: str = "table") -> ContextTable:
        """Parse the ``by_context`` format; errors name the file, the field and the value."""
        rows_obj = obj.get("by_context") if isinstance(obj, dict) else None
        if not isinstance(rows_obj, list) or not rows_obj:
            raise InputError(source, "by_context", rows_obj, "must be a non-empty list of rows")
        rows = []
        for i, row in enumerate(rows_obj):
            if not isinstance(row, dict):
                raise InputError(source, f"by_context[{i}]", row, "must be an object")
            bound = row.get("max_context_len")
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
                raise InputError(source, f"by_context[{i}].max_context_len", bound, "must be an integer >= 1")
            if rows and bound <= rows[-1].max_context_len:
                raise InputError(source, f"by_context[{i}].max_context_len", bound,
                                 f"must exceed the previous row's {rows[-1].max_context_len}")
            table = DraftTable.from_ranges(row.get("num_speculative_tokens_per_batch_size"),
                                           source=f"{source}: by_context[{i}]")
            rows.append(ContextRow(bound, table))
        return cls(tuple(rows))

    @classmethod
    def load(cls, path: str | Path) -> ContextTable:
        return cls.from_json(fileio.read_json(path), source=str(path))
