"""TableTune's tuned table: the goodput-optimal table from the offline profile, used as is.

Rule: k(b) = argmax_k b * E[tokens | k] / T(b, k) over the allowed ks, with
E[tokens | k] from the prior (offline-measured) acceptance rates and T from the
offline step-time profile (``tabletune.optimizer.optimize_table``, the same code as
``tabletune table --exact``). A drafter that proposes in only a share q < 1 of request-steps
(``PolicyContext.prior_draft_rate``, n-gram) is optimised with the partial-draft model
(``optimizer.partial_goodput_grid``) at the cost's draft share f. No online adaptation;
see ``controller`` for that.
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
        if ctx.prior_yields:
            options = OptimizeOptions(max_batch=ctx.max_num_seqs, ks=ctx.ks, yields=tuple(ctx.prior_yields),
                                      draft_share=ctx.cost.draft_share)
            result = optimize_table(ctx.cost.profile, list(ctx.prior_rates), options)
        else:
            options = OptimizeOptions(max_batch=ctx.max_num_seqs, ks=ctx.ks, **partial_options(ctx))
            result = optimize_table(ctx.cost.profile, list(ctx.prior_rates), options)
        super().__init__(ctx, result.table, label="tabletune")

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> TunedTable:
        if arg:
            raise InputError("--policy", "tabletune", arg, "takes no argument")
        return cls(ctx)


def partial_options(ctx: PolicyContext) -> dict:
    """OptimizeOptions fields for the partial-draft model when the drafter does not always propose."""
    if ctx.prior_draft_rate >= 1.0:
        return {}
    return {"draft_rate": ctx.prior_draft_rate, "draft_share": ctx.cost.draft_share}
