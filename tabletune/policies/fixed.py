"""Fixed k and speculation off: the baselines every other policy is measured against.

Rule: every step drafts the same k for every request (``fixed:K``); ``off`` is k = 0
(plain decoding: one token per request per step). vLLM's static
``num_speculative_tokens`` is this policy.
"""

from __future__ import annotations

from typing import ClassVar

from tabletune.errors import InputError
from tabletune.policies.base import BatchPolicy, BatchState, PolicyContext


class FixedK(BatchPolicy):
    name: ClassVar[str] = "fixed"
    observe_may_lag: ClassVar[bool] = True  # observe is a no-op
    decides_ahead: ClassVar[bool] = True  # the same k every step

    def __init__(self, ctx: PolicyContext, k: int) -> None:
        super().__init__(ctx)
        if k not in ctx.ks:
            raise InputError("--policy", "fixed", k, f"k must be one of the allowed ks {list(ctx.ks)} (measured, with known rates)")
        self.k = int(k)
        self.label = f"fixed:{k}"

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> FixedK:
        if arg is None or not arg.strip().isdigit():
            raise InputError("--policy", "fixed", arg, "write fixed:K with K a non-negative integer, e.g. fixed:3")
        return cls(ctx, int(arg))

    def k_for(self, state: BatchState) -> int:
        return self.k


class Off(FixedK):
    """Speculation off: k = 0 on every step."""

    name: ClassVar[str] = "off"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx, 0)
        self.label = "off"

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> Off:
        if arg:
            raise InputError("--policy", "off", arg, "takes no argument")
        return cls(ctx)
