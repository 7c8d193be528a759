"""Trace replay: the model drafter's accept/reject outcomes and confidence signals from measured traces.

A per-token trace (issue 7's format, ``profiles/traces/*.csv.gz``: ``request, gen_pos,
top1_prob, entropy, margin, accepted``, one row per generated position) is, at
temperature 0, a stream: row g holds the drafter's proposal for position g given the
correct prefix, its signals, and whether the target's greedy token equals it. A draft
of k tokens starting at position g is rows g..g+k-1; it keeps its leading run of
accepted rows, the target emits its own token at the first rejected row, and the next
draft starts after the emitted tokens. This is exact for drafters whose proposal at g
depends only on the prefix (early exit, and EAGLE/draft models when the prefix is
correct); the only liberty is that the signals shown for rows after a rejected one
within a draft come from the correct prefix (those tokens are rejected either way).

Held-out calibration (``tabletune.token_trace.prompt_half``): ``load_traces(..., half=)`` and
``load_ngram_trace(..., half=)`` keep the prompts of one half only.

Requests are the trace's streams, laid end to end in one cyclic array; a new request
starts at a random row (so long runs cross request boundaries, a stated simplification),
except in segmented streams (``Segments``), where each request replays one stream, from
a random row of it and wrapping within it, as the engine does.
With two chains (``load_paired_traces``) row i of both streams is one request's output
position, as the engine pairs them: where the lookup finds nothing the model drafter tends
to do worse too, and a policy that picks a chain per row sees that correlation.
No KL is recorded, so ``StepOutcome.kl`` is None under replay (DSDE uses its proxy).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from tabletune.token_trace import TokenTrace, check_half, load_token_traces, pair_traces, prompt_half


SEGMENT_STRIDE = 1 << 32  # a position in segmented streams: request segment r * SEGMENT_STRIDE + offset within it


@dataclass(frozen=True)
class Segments:
    """Each request's own rows of a stream, as the engine replays them: request id i reads segment i mod R from a
    random row of it, and wraps within it (a position is r * SEGMENT_STRIDE + its offset, which grows as the request
    emits). The random start keeps many requests over few traces from running in step."""

    starts: np.ndarray  # [R] first row of each segment
    lengths: np.ndarray  # [R] rows of each segment (> 0)

    def first_positions(self, ids: np.ndarray, drawn: np.ndarray) -> np.ndarray:
        """Request ids' first positions: segment id mod R, offset ``drawn`` (one non-negative draw a request) mod
        its length."""
        seg = np.asarray(ids, np.int64) % len(self.starts)
        return seg * SEGMENT_STRIDE + np.asarray(drawn, np.int64) % self.lengths[seg]

    def rows(self, pos: np.ndarray, k_max: int) -> np.ndarray:
        """[b, k_max] the rows of positions pos .. pos + k_max - 1, each wrapping within its segment."""
        pos = np.asarray(pos, np.int64)
        seg, offset = pos // SEGMENT_STRIDE, pos % SEGMENT_STRIDE
        length = self.lengths[seg][:, None]
        return self.starts[seg][:, None] + (offset[:, None] + np.arange(k_max)[None, :]) % length


class Segmented:
    """What the two streams share: the segments requests read (``layout``) and where new requests start."""

    segments: Segments | None
    num_rows: int

    @cached_property
    def layout(self) -> Segments:
        """The segments requests read: ``segments``, or one segment of every row (the cyclic stream)."""
        return self.segments or Segments(np.zeros(1, np.int64), np.array([self.num_rows], np.int64))

    def first_positions(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Where new requests start: a row of their segment drawn with one variate each (cyclic: any row)."""
        return self.layout.first_positions(ids, rng.integers(0, self.num_rows, len(ids)))


@dataclass(frozen=True)
class TraceStreams(Segmented):
    top1_prob: np.ndarray  # [num_rows] float
    entropy: np.ndarray  # [num_rows] float, nats
    margin: np.ndarray  # [num_rows] float, top-1 minus top-2 probability
    accepted: np.ndarray  # [num_rows] bool, the greedy target token equals the proposal
    request: np.ndarray  # [num_rows] int, stream index (for train/test splits)
    segments: Segments | None = None  # each request reads its own segment (``load_paired_traces``), else cyclic

    def __post_init__(self) -> None:
        n = len(self.accepted)
        if n == 0 or any(len(a) != n for a in (self.top1_prob, self.entropy, self.margin, self.request)):
            raise ValueError("a trace needs equally long, non-empty columns")

    @property
    def num_rows(self) -> int:
        return len(self.accepted)

    def window(self, pos: np.ndarray, k_max: int) -> tuple[np.ndarray, ...]:
        """(accepted, top1_prob, entropy, margin), each [batch_size, k_max], of rows pos..pos+k_max-1 (cyclic, or
        within each request's segment)."""
        rows = self.layout.rows(pos, k_max)
        return self.accepted[rows], self.top1_prob[rows], self.entropy[rows], self.margin[rows]

    def conditional_rates(self, k_max: int) -> tuple[float, ...]:
        """a_j = P(row g+j-1 accepted | rows g..g+j-2 accepted) over every start g (censoring-correct)."""
        ok = self.accepted[(np.arange(self.num_rows)[:, None] + np.arange(k_max)[None, :]) % self.num_rows]
        run = np.cumprod(ok, axis=1)  # [rows, k_max] survived through j
        reached = np.concatenate([np.full((len(ok), 1), True), run[:, :-1].astype(bool)], axis=1)
        return tuple(float(run[:, j].sum() / max(reached[:, j].sum(), 1)) for j in range(k_max))

    def subset(self, requests: np.ndarray) -> TraceStreams:
        keep = np.isin(self.request, requests)
        return TraceStreams(self.top1_prob[keep], self.entropy[keep], self.margin[keep], self.accepted[keep],
                            self.request[keep])

    def split(self, test_share: float = 0.5, seed: int = 0) -> tuple[TraceStreams, TraceStreams]:
        """(train, test) by whole request streams, drawn with a seed."""
        ids = np.unique(self.request)
        rng = np.random.default_rng(seed)
        test = rng.choice(ids, size=max(1, int(round(test_share * len(ids)))), replace=False)
        return self.subset(np.setdiff1d(ids, test)), self.subset(test)


def load_traces(paths: Sequence[str | Path], half: str | None = None) -> TraceStreams:
    """Model-drafter rows (non-empty top1_prob) of the trace files, each request's rows in gen_pos order;
    with ``half``, only the prompts of that half (``prompt_half``)."""
    check_half(half)
    cols: dict[str, list] = {"top1_prob": [], "entropy": [], "margin": [], "accepted": [], "request": []}
    names: dict[tuple[str, str], int] = {}
    for path in map(Path, paths):
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        rows = [r for r in csv.DictReader(io.StringIO(raw.decode()))
                if r.get("top1_prob") and (half is None or prompt_half(r["request"]) == half)]
        rows.sort(key=lambda r: (r["request"], int(r["gen_pos"])))
        for r in rows:
            rid = names.setdefault((str(path), r["request"]), len(names))
            cols["request"].append(rid)
            cols["accepted"].append(int(r["accepted"]) == 1)
            for name in ("top1_prob", "entropy", "margin"):
                cols[name].append(float(r[name]))
    return TraceStreams(np.array(cols["top1_prob"]), np.array(cols["entropy"]), np.array(cols["margin"]),
                        np.array(cols["accepted"], dtype=bool), np.array(cols["request"], dtype=np.int64))


@dataclass(frozen=True)
class NgramStreams(Segmented):
    """The n-gram drafter's recorded proposals by output position, requests laid end to end (cyclic).

    From an n-gram trace (``profiles/traces/ngram_*.csv.gz``): ``run[g]`` = recorded rows from g on
    without a gap, i.e. the tokens the drafter proposes at g (0: no match, the row is undrafted);
    ``accepted[g]`` whether the target accepted the token at g; ``match_len[g]`` its suffix match
    length. A draft at g of k tokens proposes min(k, run[g]) and keeps its leading run of accepted
    rows, so the share of request-steps that draft (q) and the acceptance given the match follow the
    measurement. The same reading of a trace as the engine's ``TracedReplayDrafter``: a draft that starts
    inside a recorded one continues the recorded proposal (a stated simplification), and the bonus token
    after a fully accepted recorded draft, which has no row, counts as an accepted proposal
    (``tabletune.token_trace.bridge_bonus``), so that a replay with another k than the recording does not see
    a miss the recording never had.
    """

    accepted: np.ndarray  # [num_rows] bool
    run: np.ndarray  # [num_rows] int64
    match_len: np.ndarray  # [num_rows] int64
    segments: Segments | None = None  # each request reads its own segment (``load_paired_traces``), else cyclic

    @property
    def num_rows(self) -> int:
        return len(self.accepted)

    def window(self, pos: np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(accepted [b, k_max], proposals [b] <= k_max, match_len [b]) at rows pos (cyclic, or within each
        request's segment; a proposal never runs past its segment's end: ``run`` is per request)."""
        rows = self.layout.rows(pos, k_max)
        first = rows[:, 0]
        return self.accepted[rows], np.minimum(self.run[first], k_max), self.match_len[first]


def load_ngram_trace(path: str | Path, half: str | None = None) -> NgramStreams:
    """An n-gram trace file as NgramStreams: one stream per request (``TokenTrace.bridged``), positions 1..its
    last row; with ``half``, only the prompts of that half (``prompt_half``)."""
    traces = [t.bridged() for t in load_token_traces(path, half)]
    return NgramStreams(np.concatenate([t.accepted for t in traces]), np.concatenate([t.run for t in traces]),
                        np.concatenate([t.match_len for t in traces]))


def load_paired_traces(model_path: str | Path, ngram_path: str | Path,
                       half: str | None = None) -> tuple[TraceStreams, NgramStreams]:
    """The model chain and the n-gram chain of the same requests, row for row, as the engine's
    ``TracedReplayDrafter`` reads a request's pair (``pair_traces``): a request spans its model trace's positions
    1..n; a position the model trace lacks is a rejection with ``ABSENT_SIGNALS`` (on the engine too); the n-gram
    chain is bridged (``TokenTrace.bridged``) and cut, or padded with gaps, to n (no n-gram trace: all gaps). Both
    streams are segmented as the engine serves them (``Segments``): request i replays pair i mod R from a random
    position and wraps within it, so every pair gets an equal share of requests, whatever its length."""
    model = load_token_traces(model_path, half)
    ngram = load_token_traces(ngram_path, half)
    cols: dict[str, list[np.ndarray]] = {"sig": [], "ok": [], "req": [], "ng_ok": [], "ng_run": [], "ng_len": []}
    for i, (m, g) in enumerate(pair_traces(model, ngram)):
        n = len(m.accepted)  # a position a trace lacks is already a rejection with ``ABSENT_SIGNALS`` and no match
        cols["sig"].append(m.signals)
        cols["ok"].append(m.accepted)
        cols["req"].append(np.full(n, i, np.int64))
        chain = g.bridged().fitted(n) if g is not None else TokenTrace(
            m.request, np.zeros((n, 3), np.float32), np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, np.int64))
        cols["ng_ok"].append(chain.accepted)
        cols["ng_run"].append(chain.run)
        cols["ng_len"].append(chain.match_len)
    sig = np.concatenate(cols["sig"]).astype(np.float64)
    lengths = np.array([len(a) for a in cols["ok"]], np.int64)
    segments = Segments(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64), lengths)
    streams = TraceStreams(sig[:, 0], sig[:, 1], sig[:, 2], np.concatenate(cols["ok"]), np.concatenate(cols["req"]),
                           segments)
    return streams, NgramStreams(np.concatenate(cols["ng_ok"]), np.concatenate(cols["ng_run"]),
                                 np.concatenate(cols["ng_len"]), segments)

