"""The running requests of a simulation as parallel arrays (struct of arrays).

Shared by ``simulator`` (which creates request arrays) and ``loop`` (which steps them).
"""

from __future__ import annotations

import numpy as np

FIELDS = ("ids", "widx", "logits", "out_len", "generated", "arrival_s", "first_s", "span_left", "match_len",
          "trace_pos")


class RunningRequests:
    """The running requests as parallel arrays (struct of arrays)."""

    def __init__(self, k_max: int) -> None:
        self.ids = np.zeros(0, np.int64)
        self.widx = np.zeros(0, np.int64)
        self.logits = np.zeros((0, k_max))
        self.out_len = np.zeros(0, np.int64)
        self.generated = np.zeros(0, np.int64)
        self.arrival_s = np.zeros(0)
        self.first_s = np.full(0, np.nan)
        self.span_left = np.zeros(0, np.int64)
        self.match_len = np.zeros(0, np.int64)
        self.trace_pos = np.zeros(0, np.int64)  # trace replay: the row of the next position to draft

    def __len__(self) -> int:
        return len(self.ids)

    def keep(self, mask: np.ndarray) -> None:
        for name in FIELDS:
            setattr(self, name, getattr(self, name)[mask])

    def extend(self, other: dict[str, np.ndarray]) -> None:
        for name in FIELDS:
            setattr(self, name, np.concatenate([getattr(self, name), other[name]]))
