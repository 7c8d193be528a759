"""The speculative step (docs/engine.md, "The step"): draft, verify, accept, update state; CUDA graphs keyed by batch
bucket, k and token bucket.

All set-up happens in the constructor: KV caches, per-slot state (the drafters write their drafts, signals and
distributions into per-slot arrays) and on CUDA every graph, captured largest first into one memory pool. A step
writes the rows' inputs and token layout into a pinned host buffer, replays (the graph's first node uploads it) and
reads back one small tensor. Verification is packed: row i feeds k_i + 1 tokens (``layout``), attention pads the
rows to k = max k_i. With ``EngineConfig.split_steps`` a step can also draft position by position
(``draft_position``) and verify after (``verify_drafted``), so that a policy ends rows' drafts in between. A new
request's prompt runs in ``prefill`` (``engine.prefill``: eager, or a graph per recurring prompt length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tabletune.engine.config import EngineConfig
from tabletune.engine.drafters import Drafter
from tabletune.engine.model import Decoder
from tabletune.engine.ops import Packed, upload
from tabletune.engine.prefill import Prefill, collector_paused
from tabletune.engine.verify import verify
from tabletune.padding import bucket_for, default_buckets
from tabletune.policies.base import MODEL, NGRAM

__all__ = ["EngineConfig", "SpecEngine"]
ROWS = 6  # host input rows a bucket: slots, verified k, forced-rejection caps, drafter kind, token offset, tokens
LAYOUTS_KEPT = 4096  # token layouts kept by (bucket, k, ks) before the cache starts over


@dataclass
class StepBuffers:
    """A bucket's static step inputs and outputs; the host reads ``out`` after the step."""

    inputs: torch.Tensor  # [ROWS * B + B * (k_max + 1)] int64 on the device: ``rows``, then the token layout
    host: torch.Tensor  # the same on the host (pinned on CUDA): one copy per step fills ``inputs``
    out: torch.Tensor  # [B, OUT_COLS + k_max + 1]: m, verified k, then the k + 1 tokens

    @property
    def rows(self) -> torch.Tensor:  # [ROWS, B]: slots, verified k, caps, drafter kind, qoff, qlen
        b = self.out.shape[0]
        return self.inputs[: ROWS * b].view(ROWS, b)

    @property
    def slots(self) -> torch.Tensor:  # [B]
        return self.rows[0]

    @property
    def flat(self) -> torch.Tensor:  # [B * (k_max + 1)]: each packed token's place in the padded [B, k + 1]
        return self.inputs[ROWS * self.out.shape[0]:]


@dataclass(frozen=True)
class StepResult:
    """What a step did, per row, read back after it: the step's output rows [rows, OUT_COLS + k + 1] (m, verified
    k, then the tokens), read into lists when asked for."""

    out: np.ndarray

    @property
    def accepted(self) -> list[int]:  # m: accepted drafts (the bonus excluded)
        return self.out[:, 0].tolist()

    @property
    def ks(self) -> list[int]:  # drafts verified (the requested k, n-gram rows capped to their real drafts)
        return self.out[:, 1].tolist()

    @property
    def tokens(self) -> list[list[int]]:  # emitted tokens, m + 1 a row
        return [row[OUT_COLS: OUT_COLS + row[0] + 1] for row in self.out.tolist()]


OUT_COLS = 2


@dataclass(frozen=True)
class DraftsCopy:
    """Drafted signals on their way to the host (``SpecEngine.copy_drafts``)."""

    host: torch.Tensor  # [rows, 3 k + 2]: pinned on CUDA
    event: torch.cuda.Event | None  # recorded after the copy (CUDA)
    k: int

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        """(signals [rows, k, 3], [rows, 2] n-gram match length and proposals)."""
        if self.event is not None:
            self.event.synchronize()
        out = self.host.numpy()
        return out[:, : 3 * self.k].reshape(len(out), self.k, 3), out[:, 3 * self.k:]


@dataclass(frozen=True)
class OutCopy:
    """A step's results on their way to the host (``SpecEngine.copy_out``)."""

    host: torch.Tensor  # [B, OUT_COLS + k_max + 1]: pinned on CUDA
    event: torch.cuda.Event | None  # recorded after the copy (CUDA)
    num_rows: int

    def get(self) -> StepResult:
        """The ``StepResult`` of rows 0 .. num_rows-1, once copied."""
        if self.event is not None:
            self.event.synchronize()
        return StepResult(self.host[: self.num_rows].numpy().copy())  # the host buffer takes turns


def token_js(b: int, k: int) -> range:
    """Token buckets of a step of bucket b and longest draft k: T = b (j + 1) tokens for j = ceil(k / b) .. k (at
    least one row feeds k + 1 tokens, every row at least one)."""
    return range(-(-k // b), k + 1)


def layout(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The packed token layout of rows feeding q_i tokens (1 <= q_i <= k + 1), padded to the token bucket
    T = B (j + 1) of ``token_js``: the rows from the last one back take up the slack, each up to k + 1 tokens
    (causal followers that verification caps). (q per row, flat [T]: token t's place row * (k + 1) + position,
    j)."""
    b = len(q)
    j = next(j for j in token_js(b, k) if b * (j + 1) >= q.sum())
    room = (k + 1 - q)[::-1]
    extra = b * (j + 1) - int(q.sum())
    q = q + np.clip(extra - (np.cumsum(room) - room), 0, room)[::-1]
    qoff = np.cumsum(q) - q
    flat = np.repeat(np.arange(b) * (k + 1) - qoff, q) + np.arange(b * (j + 1))
    return q, flat, j


def offsets_and_lengths(q: np.ndarray, flat: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A ``layout`` as the step buffer's rows take it: ([2, B] token offsets and counts per row, flat, j)."""
    return np.stack([np.cumsum(q) - q, q]), flat, j


class SpecEngine:
    def __init__(self, target: Decoder, drafter: Drafter, cfg: EngineConfig) -> None:
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.device = target.device
        self.k_max, self.temperature = cfg.k_max, cfg.temperature
        self.buckets = list(cfg.buckets or default_buckets(cfg.max_num_seqs))
        self.ks = list(cfg.ks or range(cfg.k_max + 1))
        self.cache = target.new_cache(self.buckets[-1], cfg.max_len)
        s1, dev, km = self.cache.num_slots + 1, self.device, max(cfg.k_max, 1)
        self.cached = torch.zeros(s1, dtype=torch.long, device=dev)  # tokens in the target cache
        self.last_token = torch.zeros(s1, dtype=torch.long, device=dev)  # newest token, not yet cached
        self.history = torch.zeros(s1, cfg.max_len, dtype=torch.long, device=dev)  # all tokens by position
        self.oracle = torch.zeros(s1, cfg.max_len, dtype=torch.long, device=dev)  # ReplayDrafter's tokens
        # what the drafter drafted, per slot and position, and its signals (a drafter without probabilities leaves
        # a sure one-hot draft: top-1 1, entropy 0, margin 1)
        self.drafts = torch.zeros(s1, km, dtype=torch.long, device=dev)
        self.draft_sig = torch.tensor([1.0, 0.0, 1.0], device=dev).repeat(s1, km, 1)
        # n-gram match length, n-gram proposals, recorded accepted run of the model and the n-gram chain
        self.draft_meta = torch.tensor([0, km, km, km], device=dev).repeat(s1, 1)
        drafter.setup(self)
        # q [slots + 1, k_max, V] of a sampling model drafter, kept for the rejection sampling
        self.draft_probs = torch.zeros(s1, km, target.cfg.vocab_size, device=dev) if drafter.has_probs else None
        drafter.out.probs = self.draft_probs
        # the drafter kind a row gets unless the policy picks one: the n-gram drafter is NGRAM, all others MODEL
        self.default_kind = NGRAM if drafter.name == "ngram" else MODEL
        # the smallest captured k >= each k (-1: none), and the token layouts of recent steps (``_write``)
        self._graph_k = [min((x for x in self.ks if x >= k), default=-1) for k in range(max(self.ks) + 1)]
        self._layouts: dict[tuple, tuple] = {}
        self._host_views: dict[int, np.ndarray] = {}
        self._written: dict[int, tuple] = {}  # bucket -> (the inputs last written to its host buffer, j)
        self._last_step: dict[int, tuple] = {}  # bucket -> the graph key of its last fused step (``relaunch``)
        self._out_ring: dict[int, list[torch.Tensor]] = {}  # bucket -> ``copy_out``'s two host buffers
        self._out_turn: dict[int, int] = {}  # bucket -> the one its last copy went to
        self.buffers = {b: self._buffers(b) for b in self.buckets}
        # the rows of each draft position, one pinned buffer per (bucket, position): a position's graph uploads its
        # rows when the device reaches it, after the host may have launched the next positions (no sync between
        # them), so positions of one bucket must not share a buffer
        self.draft_inputs = {(b, j): self._host_and_device(torch.full((b,), self.cache.scratch_slot))
                             for b in self.buckets for j in range(km)}
        # the rows of a split step's n-gram lookup, per bucket (a drafter with both chains only)
        self.has_lookup = cfg.split_steps and type(drafter).lookup is not Drafter.lookup
        self.lookup_inputs = {b: self._host_and_device(torch.full((b,), self.cache.scratch_slot))
                              for b in self.buckets} if self.has_lookup else {}
        # ("step" | "verify", bucket, k, token bucket j), ("first", bucket, k) | ("next", bucket, j) and
        # ("lookup", bucket) -> graph
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        use_graphs = self.device.type == "cuda" if cfg.use_graphs is None else cfg.use_graphs
        self.prefills = Prefill(target, self.cache, cfg.prefill_graph_max_len if use_graphs else 0)
        if use_graphs:
            self.capture()

    def _host_and_device(self, host: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(host, device copy): pinned on CUDA; a copy on the CPU too, so a step reads only what was uploaded."""
        host = host.pin_memory() if self.device.type == "cuda" else host
        return host, host.to(self.device, copy=True)

    def _buffers(self, b: int) -> StepBuffers:
        host, inputs = self._host_and_device(torch.zeros(ROWS * b + b * (self.k_max + 1), dtype=torch.long))
        buf = StepBuffers(inputs, host, torch.zeros(b, OUT_COLS + self.k_max + 1, dtype=torch.long,
                                                     device=self.device))
        self._write(buf, [], [], None, None, self.k_max)
        buf.inputs.copy_(buf.host)
        return buf

    # ---- the step ----------------------------------------------------------

    @torch.inference_mode()
    def _verify_body(self, buf: StepBuffers, k: int, j: int) -> None:
        """Verify the first k_i drafts of each row, packed into b (j + 1) tokens; accept, update state, write
        ``buf.out``. Row i's cap min(k_i, forced cap, recorded run) stops its verification at k_i, where it emits the
        target's own token (the bonus), so a row is verified exactly as a step of its k_i."""
        slots, k_ver, forced, kind, qoff, qlen = buf.rows
        start, last = self.cached[slots], self.last_token[slots]
        drafts = self.drafts[slots, :k]
        cap = torch.minimum(k_ver, forced)
        if self.drafter.has_meta:  # n-gram rows verify only their real drafts; the recorded run caps a trace row
            meta = self.draft_meta[slots]
            k_ver = torch.where(kind == NGRAM, torch.minimum(k_ver, meta[:, 1]), k_ver)
            cap = torch.minimum(torch.minimum(cap, k_ver), meta.gather(1, 2 + kind[:, None])[:, 0])
        # [B, k+1]
        inputs = torch.cat([last[:, None], drafts], dim=1)
        if k == 0:
            hidden, index = self.target(inputs, start, slots, self.cache), None
        else:
            packed = Packed(qoff, qlen, buf.flat[: len(slots) * (j + 1)], k + 1)
            hidden = self.target(inputs.view(-1)[packed.flat], start, slots, self.cache, packed=packed)
            index = packed.index
        probs = None if self.draft_probs is None else self.draft_probs[slots, :k]
        m, tokens = verify(self.target.logits(hidden), drafts, probs, self.temperature, cap=cap, index=index)
        self.cached[slots] = start + m + 1
        self.last_token[slots] = tokens.gather(1, m[:, None])[:, 0]
        self.history[slots[:, None], (start + 1)[:, None] + torch.arange(k + 1, device=self.device)] = tokens
        self.drafter.observe(slots, start, tokens, m, hidden if index is None else hidden[index])
        self.cached[self.cache.scratch_slot:].zero_()
        buf.out[:, 0] = m
        buf.out[:, 1] = k_ver
        buf.out[:, OUT_COLS: OUT_COLS + k + 1] = tokens

    @torch.inference_mode()
    def _step_body(self, buf: StepBuffers, k: int, j: int) -> None:
        """Draft k positions for every row and verify: one graph per (bucket, k, token bucket)."""
        slots = buf.slots
        if k > 0:
            self.drafter.begin(slots, self.cached[slots], self.last_token[slots], k)
        for i in range(k):
            self.drafter.draft(slots, i)
        self._verify_body(buf, k, j)

    @torch.inference_mode()
    def _position_body(self, slots: torch.Tensor, j: int, k: int) -> None:
        """Draft position j + 1 of these rows (the first position also runs the drafter's ``begin`` for a step of
        at most k drafts)."""
        if j == 0:
            self.drafter.begin(slots, self.cached[slots], self.last_token[slots], k)
        self.drafter.draft(slots, j)

    def _bodies(self):
        """(key, host inputs, device inputs, body) of every graph to capture."""
        for b in reversed(self.buckets):
            buf = self.buffers[b]
            phases = ("step", "verify") if self.cfg.split_steps else ("step",)
            for k in self.ks:
                for j in token_js(b, k):
                    q = np.full(b, j + 1)  # a layout of b (j + 1) tokens
                    for phase in phases:
                        self._write(buf, [], [], None, None, k, layout(q, k))
                        body = self._step_body if phase == "step" else self._verify_body
                        yield (phase, b, k, j), buf.host, buf.inputs, lambda bd=body, bf=buf, k=k, j=j: bd(bf, k, j)
            if self.cfg.split_steps:
                host, dev = self.draft_inputs[(b, 0)]
                for k in (x for x in self.ks if x > 0):
                    yield ("first", b, k), host, dev, lambda d=dev, k=k: self._position_body(d, 0, k)
                for j in range(1, self.k_max):
                    host, dev = self.draft_inputs[(b, j)]
                    yield ("next", b, j), host, dev, lambda d=dev, j=j: self._position_body(d, j, self.k_max)
            if self.has_lookup:
                host, dev = self.lookup_inputs[b]
                yield ("lookup", b), host, dev, lambda d=dev: self._lookup_body(d)

    def capture(self) -> None:
        """Every graph (``_bodies``), largest bucket first, sharing one memory pool; a graph's first node uploads
        ``host`` into ``dev``. Each body first runs once on a side stream, so that kernel compiles and GEMM choices
        happen outside the capture."""
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        with collector_paused():
            for key, host, dev, body in self._bodies():
                dev.copy_(host)
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    body()
                torch.cuda.current_stream().wait_stream(stream)
                self.graphs[key] = g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    dev.copy_(host, non_blocking=True)
                    body()
        self.cached.zero_()
        torch.cuda.synchronize()

    def _write(self, buf: StepBuffers, slots, ks_row, caps, kinds, k: int, lay=None) -> int:
        """Rows' inputs and token layout (default: row i feeds k_i + 1 tokens) into the bucket's host buffer (rows
        past ``slots``: the scratch slot, nothing verified, one token); the token bucket j. Layouts are kept by
        (bucket, k, the rows' ks): a step's host work is a few copies when its ks recur."""
        n, b = len(slots), buf.out.shape[0]
        ks_arr = np.asarray(ks_row, np.int64)
        # a step whose inputs are the last ones written to this buffer leaves it as it is (a steady batch at one
        # k: most steps of a fixed k or a table); a layout given (capture) always writes
        inputs = (tuple(slots), ks_arr.tobytes(), None if caps is None else tuple(caps),
                  None if kinds is None else tuple(kinds), k) if lay is None else None
        last = self._written.get(b)
        if inputs is not None and last is not None and last[0] == inputs:
            return last[1]
        host = self._host_views.get(b)
        if host is None:  # free to overwrite: the previous step's copy finished before its read-back
            host = self._host_views[b] = buf.host.numpy()
        rows = host[: ROWS * b].reshape(ROWS, b)
        rows[0, :n], rows[0, n:] = slots, self.cache.scratch_slot
        rows[1, :n], rows[1:3, n:] = ks_row, 0
        rows[2, :n] = caps if caps is not None else k
        rows[3, :n] = kinds if kinds is not None else self.default_kind
        rows[3, n:] = self.default_kind
        if lay is None:
            key = (b, k, inputs[1])
            kept = self._layouts.get(key)
            if kept is None:
                if len(self._layouts) >= LAYOUTS_KEPT:
                    self._layouts.clear()
                kept = self._layouts[key] = offsets_and_lengths(
                    *layout(np.concatenate([ks_arr + 1, np.ones(b - n, np.int64)]), k))
        else:
            kept = offsets_and_lengths(*lay)
        rows[4:6], flat, j = kept
        host[ROWS * b: ROWS * b + len(flat)] = flat
        self._written[b] = (inputs, j)
        return j

    def _fill(self, slots: Sequence[int], ks: int | Sequence[int], caps: Sequence[int] | None,
              kinds: Sequence[int] | None, min_rows: int) -> tuple[StepBuffers, int, int]:
        """Write the rows' inputs into the bucket's pinned host buffer; (buffer, the step's k, token bucket j)."""
        n = len(slots)
        ks_row = np.full(n, ks, np.int64) if isinstance(ks, int) else np.asarray(ks, np.int64)
        if len(ks_row) != n or (n and ks_row.min() < 0):
            raise ValueError(f"need one k >= 0 per row, got {ks_row.tolist()} for {n} rows")
        if kinds is not None and not set(kinds) <= {MODEL, NGRAM}:
            raise ValueError(f"drafter kinds must be MODEL ({MODEL}) or NGRAM ({NGRAM}), got {list(kinds)}")
        # the step runs the graph of the smallest captured k >= max k_i (attention pads its rows to that k)
        k_top = int(ks_row.max()) if n else 0
        k = self._graph_k[k_top] if k_top < len(self._graph_k) else -1
        if k < 0:
            raise ValueError(f"k={k_top} has no graph (captured: {self.ks})")
        buf = self.buffers[bucket_for(max(n, min_rows), self.buckets)]
        return buf, k, self._write(buf, slots, ks_row, caps, kinds, k)

    def _run(self, key: tuple, host: torch.Tensor, dev: torch.Tensor, body, on_replay=None) -> None:
        if on_replay is not None:  # the host's part of the step is done: what follows is device work
            on_replay()
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()  # copies the host inputs in, then runs
        else:
            dev.copy_(host, non_blocking=True)
            body()

    def launch(self, slots: Sequence[int], ks: int | Sequence[int], caps: Sequence[int] | None = None,
               min_rows: int = 0, kinds: Sequence[int] | None = None, on_replay=None) -> StepBuffers:
        """Fill the static inputs and run the step (replay on CUDA); no sync. ``on_replay()`` is called between the
        two (a scheduler's mark: its host time ends there).

        ``ks``: one k for every row, or k_i per row (a ragged step: every row drafts max k_i, row i verifies k_i);
        ``caps``: forced-rejection caps; ``kinds``: MODEL or NGRAM per row (the trace replay's chain; n-gram rows
        verify at most the drafts that follow their match)."""
        buf, k, j = self._fill(slots, ks, caps, kinds, min_rows)
        key = self._last_step[buf.out.shape[0]] = ("step", buf.out.shape[0], k, j)
        self._run(key, buf.host, buf.inputs, lambda: self._step_body(buf, k, j), on_replay)
        return buf

    def draft_position(self, slots: Sequence[int], j: int, k: int) -> None:
        """Draft position j + 1 (j = 0: the first, with the drafter's ``begin`` for a step of at most k drafts) of
        these rows only, in the graph of their own bucket; no sync (``read_position`` reads the signals)."""
        b = bucket_for(len(slots), self.buckets)
        host, dev = self.draft_inputs[(b, j)]
        host[: len(slots)] = torch.as_tensor(slots)
        host[len(slots):] = self.cache.scratch_slot
        k = self._graph_k[k]  # the smallest captured k >= k
        key = ("first", b, k) if j == 0 else ("next", b, j)
        self._run(key, host, dev, lambda: self._position_body(dev, j, k if j == 0 else self.k_max))

    def lookup_rows(self, slots: Sequence[int], on_replay=None) -> None:
        """The drafter's n-gram proposals for rows that take no model draft this step (``Drafter.lookup``, a few
        gathers: one graph per bucket, so that a step with no model row to draft does not leave the device idle
        while the host launches them one by one); no sync. The lookup writes all k_max proposals; verification
        takes each row's own k_i. ``on_replay`` as in ``launch``."""
        if not self.has_lookup:
            raise ValueError(f"{self.drafter.name} has no n-gram lookup apart from drafting (or split_steps is off)")
        b = bucket_for(len(slots), self.buckets)
        host, dev = self.lookup_inputs[b]
        host[: len(slots)] = torch.as_tensor(slots)
        host[len(slots):] = self.cache.scratch_slot
        self._run(("lookup", b), host, dev, lambda: self._lookup_body(dev), on_replay)

    @torch.inference_mode()
    def _lookup_body(self, slots: torch.Tensor) -> None:
        self.drafter.lookup(slots, self.cached[slots], self.last_token[slots], self.k_max)

    def read_drafts(self, slots: Sequence[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(signals [rows, k, 3]: top-1, entropy, margin of positions 1..k; [rows, 2]: n-gram match length and
        proposals), one sync."""
        return self.copy_drafts(slots, k).get()

    @torch.inference_mode()
    def copy_drafts(self, slots: Sequence[int], k: int) -> DraftsCopy:
        """``read_drafts`` without the sync: the copy to the host is queued behind the drafting; ``get()`` waits
        for it (free once a later read synced the stream)."""
        s = upload(list(slots), self.device)
        out = torch.cat([self.draft_sig[s, :k].flatten(1), self.draft_meta[s, :2].float()], 1)
        if self.device.type != "cuda":
            return DraftsCopy(out, None, k)
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return DraftsCopy(host, event, k)

    def verify_drafted(self, slots: Sequence[int], ks: Sequence[int], caps: Sequence[int] | None = None,
                       min_rows: int = 0, kinds: Sequence[int] | None = None, on_replay=None) -> StepBuffers:
        """The verify phase of a split step (after row i drafted at least k_i positions); no sync."""
        buf, k, j = self._fill(slots, ks, caps, kinds, min_rows)
        self._run(("verify", buf.out.shape[0], k, j), buf.host, buf.inputs, lambda: self._verify_body(buf, k, j),
                  on_replay)
        return buf

    def read(self, buf: StepBuffers, num_rows: int, k: int) -> StepResult:
        """The step's results for rows 0 .. num_rows-1 (the one host sync of a step)."""
        return StepResult(buf.out[:num_rows, : OUT_COLS + k + 1].cpu().numpy().copy())  # the buffer is reused

    def copy_out(self, buf: StepBuffers, num_rows: int) -> OutCopy:
        """``read`` without the sync: the step's results copied to the host behind it, before a later step of the
        bucket (``relaunch``) overwrites them; ``get()`` waits for the copy. Two host buffers a bucket take turns."""
        b, cuda = buf.out.shape[0], self.device.type == "cuda"
        ring = self._out_ring.get(b)
        if ring is None:
            ring = self._out_ring[b] = [torch.empty_like(buf.out, device="cpu", pin_memory=cuda) for _ in range(2)]
        turn = self._out_turn[b] = 1 - self._out_turn.get(b, 1)
        host = ring[turn]
        host.copy_(buf.out, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return OutCopy(host, event, num_rows)

    def relaunch(self, buf: StepBuffers, on_replay=None) -> None:
        """Run the bucket's last step again on its inputs as they stand (the same rows, ks, caps and kinds: the
        device state those rows reached goes on from there); no sync. The inputs are not written, so a step
        launched before the last one's read-back can not change them under it."""
        b = buf.out.shape[0]
        key = self._last_step[b]
        k, j = key[2], key[3]
        self._run(key, buf.host, buf.inputs, lambda: self._step_body(buf, k, j), on_replay)

    def step(self, slots: list[int], k: int | Sequence[int], caps: list[int] | None = None,
             min_rows: int = 0) -> tuple[list[int], list[list[int]]]:
        """One step for the sequences in ``slots``: (m per row, emitted tokens per row). ``min_rows``: run at least
        this bucket (rows past ``slots`` point at the scratch slot), so that a shrinking batch keeps one shape."""
        buf = self.launch(slots, k, caps, min_rows)
        res = self.read(buf, len(slots), self.k_max)
        return res.accepted, res.tokens

    # ---- requests ------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slot: int, prompt: list[int]) -> int:
        """Run the prompt through the target (``prefills``) and the drafter; return the first generated token."""
        n = len(prompt)
        if not 0 < n <= self.cfg.max_len - self.k_max - 3:
            raise ValueError(f"prompt of {n} tokens does not fit max_len {self.cfg.max_len}")
        p = torch.tensor(prompt, dtype=torch.long, device=self.device)
        hidden, logits = self.prefills(p, torch.tensor([slot], device=self.device))
        if self.temperature == 0:
            first = int(logits.argmax(-1))
        else:
            first = int(torch.multinomial(torch.softmax(logits / self.temperature, -1), 1))
        self.cached[slot], self.last_token[slot] = n, first
        self.history[slot, :n], self.history[slot, n] = p, first
        self.drafter.prefill(slot, p, first, hidden)
        return first

    def set_context(self, num_rows: int, context_len: int, seed: int = 0) -> None:
        """Pretend slots 0..num_rows-1 hold context_len tokens (random history) — for timing."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        vocab = self.target.cfg.vocab_size
        self.history[:num_rows] = torch.randint(0, vocab, self.history[:num_rows].shape, generator=g).to(self.device)
        self.last_token[:num_rows] = self.history[:num_rows, context_len]
        self.reset_rows(num_rows, context_len)

    def reset_rows(self, num_rows: int, context_len: int) -> None:
        """Put slots 0..num_rows-1 back at context_len cached tokens (between timed steps)."""
        self.cached[:num_rows] = context_len
        self.drafter.reset(num_rows, context_len)
