"""The per-token trace (``tabletune acceptance --trace-out``, ``docs/formats.md``): what every reader shares.

Held-out calibration: every prompt belongs to one half, ``prompt_half(request)``: "calibration" when the first
byte of sha256(request name) is even, else "scoring". The rule reads the prompt's name only, so a prompt lands
in the same half in every trace file (model and n-gram chains, every temperature); rules are fit on the
calibration half (``policies.trace_fit``) and scored on the other (``sim.replay``'s loaders, ``half=``).
"""

from __future__ import annotations

import hashlib

HALVES = ("calibration", "scoring")


def prompt_half(request: str) -> str:
    """The half of a prompt, by its name alone: "calibration" if sha256(name)[0] is even, else "scoring"."""
    return HALVES[hashlib.sha256(request.encode()).digest()[0] % 2]


def check_half(half: str | None) -> None:
    if half is not None and half not in HALVES:
        raise ValueError(f"half must be one of {HALVES} or None, got {half!r}")
