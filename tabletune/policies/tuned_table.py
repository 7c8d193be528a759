"""TableTune's tuned table: the goodput-optimal table from the offline profile, used as is.

Rule: k(b) = argmax_k b * E[tokens | k] / T(b, k) over the allowed ks, with
E[tokens | k] from the prior (offline-measured) acceptance rates and T from the
offline step-time profile (``tabletune.optimizer.optimize_table``, the same code as
``tabletune table``). No online adaptation; see ``controller`` for that.
"""

from __future__ import annotations

from typing import ClassVar

from tabletune.errors import InputError
from tabletune.optimizer import OptimizeOptions, optimize_table
from tabletune.policies.base import PolicyContext
from tabletune.policies.static_table import StaticTable


class TunedTable(StaticTable):
    name: ClassVar[str] = "tabletune"

    def __init__(self, ctx: PolicyContext) -> None:
        options = OptimizeOptions(max_batch=ctx.max_num_seqs, ks=ctx.ks)
        result = optimize_table(ctx.cost.profile, list(ctx.prior_rates), options)
        super().__init__(ctx, result.table, label="tabletune")

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> TunedTable:
        if arg:
            raise InputError("--policy", "tabletune", arg, "takes no argument")
        return cls(ctx)
