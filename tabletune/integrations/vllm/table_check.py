"""Is the table honoured, and which by-context row applies: per-step checks for the controller hook.

``DraftCheck``: the scheduler picks k for the next drafts from its lookup
(``num_spec_tokens_to_schedule``); the drafts of the next step show what the model
runner actually proposed (``scheduled_spec_decode_tokens``, not clipped to the
table's k by the scheduler). A drafter may propose fewer tokens (n-gram without a
match), never more, so a step is a mismatch when some request verifies more draft
tokens than the table's k. After ``stretch`` mismatching steps in a row the table
is not honoured: one loud warning names vLLM's version and model runner (vLLM
issue #51510: its V2 runner ignored the table). ``table_honoured`` is None until a
step whose table k is below the largest k has been checked (only those can tell).

``ContextRows``: with a by-context table (``tabletune.table.ContextTable``) the row
for each step is picked from the scheduled requests' mean context length (tokens
already computed). The step's attention work is the sum of its requests' contexts,
i.e. b x mean, and the profiles were measured with every request at one context,
so the mean is the statistic a row's T(b, k) describes (an argument, not a
measurement; ``statistic="max"`` is the conservative alternative).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from tabletune.table import ContextTable

logger = logging.getLogger("tabletune.controller")


class DraftCheck:
    """Counts steps whose drafts exceed the table's k; warns once after a stretch of them."""

    def __init__(self, k_max: int, stretch: int = 32, describe: Callable[[], str] = lambda: "") -> None:
        self.k_max = k_max
        self.stretch = stretch
        self.describe = describe
        self.k_mismatch_steps = 0
        self.checked_steps = 0  # steps whose table k was below k_max
        self.run = 0  # current stretch of mismatching steps
        self.honoured: bool | None = None
        self.warned = False

    def observe(self, table_k: int, drafted: Iterable[int]) -> None:
        """One step: ``table_k`` sized its drafts; ``drafted``: draft tokens each request verifies."""
        longest = max(drafted, default=0)
        if longest > table_k:
            self.k_mismatch_steps += 1
            self.run += 1
        elif table_k < self.k_max:
            self.run = 0
        if table_k < self.k_max:
            self.checked_steps += 1
            if self.honoured is None and self.checked_steps >= self.stretch and self.run == 0:
                self.honoured = True
        if self.run >= self.stretch:
            self.honoured = False
            if not self.warned:
                self.warned = True
                logger.error("tabletune: THE DRAFT-LENGTH TABLE IS NOT HONOURED: %d steps in a row drafted more "
                             "tokens than the table's k (%s). The engine runs num_speculative_tokens=%d whatever the "
                             "table says.", self.run, self.describe(), self.k_max)

    def state(self) -> dict:
        return {"table_honoured": self.honoured, "k_mismatch_steps": self.k_mismatch_steps}


def engine_description() -> str:
    """vLLM's version and model runner, for the warning."""
    try:
        import vllm

        version = vllm.__version__
    except Exception:  # noqa: BLE001 -- the warning must not fail
        version = "unknown"
    v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0") not in ("", "0")
    return f"vLLM {version}, {'V2' if v2 else 'V1'} model runner"


class ContextRows:
    """The by-context table's dense lookups, one per row, and the row of the current step."""

    def __init__(self, table: ContextTable, expand: Callable[[list[list[int]]], list[int]],
                 statistic: str = "mean") -> None:
        if statistic not in ("mean", "max"):
            raise ValueError(f"statistic must be mean or max, got {statistic!r}")
        self.table = table
        self.lookups = [expand(row.table.as_lists()) for row in table.rows]
        self.statistic = statistic
        self.row: int | None = None

    def pick(self, contexts: list[int]) -> list[int] | None:
        """The lookup for a step whose requests have these contexts (None for an empty step)."""
        if not contexts:
            return None
        c = max(contexts) if self.statistic == "max" else sum(contexts) / len(contexts)
        self.row = self.table.row_index(c)
        return self.lookups[self.row]
