"""Static tables: vLLM's documented table, "documented / 4", or any table file.

Rule: k = table.k_for(b) for the running batch size b, vLLM's dense lookup (gaps
take the previous range's k, past the last range the last k), clamped to the
allowed ``ctx.ks`` (the largest allowed k <= the table's k). The documented
table is the example in vLLM's dynamic speculative decoding docs,
``[[1,16,5],[17,32,4],[33,64,3],[65,128,1],[129,512,0]]``; "documented / 4" divides
every range bound by 4 (a table tuned for a much faster GPU or a much better drafter).
"""

from __future__ import annotations

from typing import ClassVar

from tabletune.errors import InputError
from tabletune.policies.base import BatchPolicy, BatchState, PolicyContext, nearest_k
from tabletune.table import VLLM_DOCUMENTED_DIV4_RANGES, VLLM_DOCUMENTED_RANGES, DraftTable


class StaticTable(BatchPolicy):
    name: ClassVar[str] = "table"
    observe_may_lag: ClassVar[bool] = True  # observe is a no-op
    decides_ahead: ClassVar[bool] = True  # the same batch size, the same k

    def __init__(self, ctx: PolicyContext, table: DraftTable, label: str = "table") -> None:
        super().__init__(ctx)
        self.table = table
        self.label = label
        self._dense = [nearest_k(k, ctx.ks) for k in table.dense(max(ctx.max_num_seqs, 1))]

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> StaticTable:
        if not arg:
            raise InputError("--policy", "table", arg, "write table:FILE (a vLLM table JSON)")
        return cls(ctx, DraftTable.load(arg), label=f"table:{arg}")

    def k_for(self, state: BatchState) -> int:
        b = state.batch_size
        return self._dense[b] if b < len(self._dense) else self._dense[-1]


def documented(ctx: PolicyContext, arg: str | None = None) -> StaticTable:
    return StaticTable(ctx, DraftTable(VLLM_DOCUMENTED_RANGES), label="documented")


def documented_div4(ctx: PolicyContext, arg: str | None = None) -> StaticTable:
    return StaticTable(ctx, DraftTable(VLLM_DOCUMENTED_DIV4_RANGES), label="documented-div4")
