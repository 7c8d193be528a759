"""The per-token trace (``tabletune acceptance --trace-out``, ``docs/formats.md``), read once for every user.

A trace has one row per tested draft token at output position ``gen_pos`` g (1 = the first token after the
prefill's): its signals (top-1, entropy, margin; empty for n-gram), whether the target accepted it, and for
n-gram its suffix match length. ``load_token_traces`` makes each request's rows arrays by g (``TokenTrace``); a
position the trace lacks counts as rejected with no proposal, except the n-gram chain's bonus position after a
fully accepted recorded draft (``bridge_bonus``). The simulator (``sim.replay``) and the engine's traced replay
(``engine.trace_replay``) read traces through this module.

Held-out calibration: every prompt belongs to one half, ``prompt_half(request)``: "calibration" when the first
byte of sha256(request name) is even, else "scoring". The rule reads the prompt's name only, so a prompt lands
in the same half in every trace file (model and n-gram chains, every temperature); rules are fit on the
calibration half (``policies.trace_fit``) and scored on the other (the loaders' ``half=``).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HALVES = ("calibration", "scoring")
ABSENT_SIGNALS = (0.5, 1.0, 0.0)  # top-1, entropy, margin of a position the trace lacks


def prompt_half(request: str) -> str:
    """The half of a prompt, by its name alone: "calibration" if sha256(name)[0] is even, else "scoring"."""
    return HALVES[hashlib.sha256(request.encode()).digest()[0] % 2]


def check_half(half: str | None) -> None:
    if half is not None and half not in HALVES:
        raise ValueError(f"half must be one of {HALVES} or None, got {half!r}")


def bridge_bonus(present: np.ndarray, accepted: np.ndarray, match_len: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One request's n-gram chain by output position, with the bonus position after a fully accepted recorded draft
    read as an accepted proposal: a position without a row, after an accepted row and before the next recorded
    draft (the target emitted it, so the recording never tested it; a replay with another k would have). Its
    match length is the row before's. New arrays, the inputs untouched."""
    bonus = np.zeros(len(present), bool)
    bonus[1:-1] = ~present[1:-1] & accepted[:-2] & present[2:]
    return (present | bonus, accepted | bonus,
            np.where(bonus, np.roll(match_len, 1), match_len).astype(np.int64))


@dataclass(frozen=True)
class TokenTrace:
    """One request's recorded draft tokens by output position (index g - 1 for gen_pos g)."""

    request: str
    signals: np.ndarray  # [n, 3] float32: top-1 probability, entropy (nats), top-1 - top-2 margin
    accepted: np.ndarray  # [n] bool: the token at g was drafted, tested and accepted
    present: np.ndarray  # [n] bool: the trace has a row at g
    match_len: np.ndarray  # [n] int64: n-gram suffix match length at g (0: none)

    def bridged(self) -> TokenTrace:
        """The trace read as an n-gram chain: the bonus position after a fully accepted recorded draft counts as
        an accepted proposal (``bridge_bonus``)."""
        present, accepted, match = bridge_bonus(self.present, self.accepted, self.match_len)
        return TokenTrace(self.request, self.signals, accepted, present, match)

    def fitted(self, n: int) -> TokenTrace:
        """The trace cut, or padded with gaps, to n positions (so that a pair's chains wrap together)."""
        m = min(n, len(self.accepted))

        def fit(a: np.ndarray, fill) -> np.ndarray:
            out = np.full((n,) + a.shape[1:], fill, a.dtype)
            out[:m] = a[:m]
            return out

        return TokenTrace(self.request, fit(self.signals, 0.0), fit(self.accepted, False), fit(self.present, False),
                          fit(self.match_len, 0))

    @property
    def run(self) -> np.ndarray:
        """[n] int64: recorded rows from g on without a gap (the n-gram drafter's proposals at g)."""
        out = np.zeros(len(self.present), np.int64)
        for g in range(len(out) - 1, -1, -1):
            out[g] = (out[g + 1] + 1 if g + 1 < len(out) else 1) if self.present[g] else 0
        return out


def load_token_traces(path: str | Path, half: str | None = None) -> list[TokenTrace]:
    """The per-request traces of one trace file (``.csv`` or ``.csv.gz``), in file order; with ``half``, only
    the prompts of that half (``prompt_half``)."""
    check_half(half)
    opener = gzip.open if str(path).endswith(".gz") else open
    rows: dict[str, list[dict]] = {}
    with opener(path, "rt") as fh:  # type: ignore[operator]
        for r in csv.DictReader(fh):
            if half is None or prompt_half(r["request"]) == half:
                rows.setdefault(r["request"], []).append(r)
    if not rows:
        raise ValueError(f"trace {path} has no rows")
    return [_trace(name, rs) for name, rs in rows.items()]


def _trace(name: str, rows: list[dict]) -> TokenTrace:
    n = max(int(r["gen_pos"]) for r in rows)
    signals = np.tile(np.array(ABSENT_SIGNALS, np.float32), (n, 1))
    accepted, present = np.zeros(n, bool), np.zeros(n, bool)
    match = np.zeros(n, np.int64)
    for r in rows:
        g = int(r["gen_pos"]) - 1
        present[g] = True
        accepted[g] = r["accepted"] == "1"
        match[g] = int(float(r["ngram_len"] or 0))
        if r.get("top1_prob"):
            signals[g] = (float(r["top1_prob"]), float(r["entropy"]), float(r["margin"]))
    return TokenTrace(name, signals, accepted, present, match)


def pair_traces(model: list[TokenTrace], ngram: list[TokenTrace]) -> list[tuple[TokenTrace, TokenTrace | None]]:
    """Each model-chain trace with the n-gram trace of the same request (None if it has none)."""
    by_name = {t.request: t for t in ngram}
    return [(t, by_name.get(t.request)) for t in model]


def leading_runs(accepted: np.ndarray, k_max: int) -> np.ndarray:
    """[n] the leading run of accepted flags (at most k_max) from each position, wrapping around."""
    n = len(accepted)
    idx = (np.arange(n)[:, None] + np.arange(k_max)[None, :]) % n
    return np.cumprod(accepted[idx], axis=1).sum(axis=1)


def replay_rates(traces: list[TokenTrace], k_max: int) -> tuple[float, ...]:
    """Conditional rates a_1..a_k_max of the replay, a draft starting at a uniform position of each trace:

        a_j = #(runs >= j) / #(runs >= j - 1)       (a rate with no draft reaching j: the last known one)
    """
    runs = np.concatenate([leading_runs(t.accepted, k_max) for t in traces])
    out: list[float] = []
    for j in range(1, k_max + 1):
        reached = int((runs >= j - 1).sum())
        out.append(float((runs >= j).sum()) / reached if reached else (out[-1] if out else 0.0))
    return tuple(max(a, 1e-3) for a in out)


def ngram_length_rates(traces: list[TokenTrace], l_max: int = 16) -> tuple[float, ...]:
    """rates[L] = accepted share of the n-gram chain's recorded tokens at match length L (index 0: 0)."""
    match = np.concatenate([t.match_len[t.present] for t in traces])
    ok = np.concatenate([t.accepted[t.present] for t in traces])
    out = [0.0]
    for length in range(1, l_max + 1):
        sel = np.minimum(match, l_max) == length
        out.append(float(ok[sel].mean()) if sel.any() else out[-1])
    return tuple(out)
