"""The speculative step: draft, verify, accept, update state; one CUDA graph per (batch bucket, k).

All set-up happens in the constructor: KV caches, per-slot state, and on CUDA a graph for every (bucket, k),
captured largest first into one memory pool (as nano-vllm does). A step only writes the rows' slots, k_i, caps and
drafter kinds into a pinned host buffer, replays (the graph's first node uploads that buffer), and reads back one
small tensor (the step's single host sync). Steps are ragged: row i verifies its own k_i; the step runs the graph
of k = max k_i and caps row i at k_i (``_verify_body``). With ``EngineConfig.split_steps`` a step can also run as a
draft graph and a verify graph, so that a policy reads the drafts' signals in between. A prompt's prefill runs
eager, or from a graph per prompt length once a length has come twice (``EngineConfig.prefill_graph_max_len``):

    step(b rows, k_1..k_b):  bucket B = bucket_for(b), k = max k_i; rows b..B-1 point at the scratch slot
      drafts [B, k], signals [B, k, 3] = drafter.propose(...)
      hidden [B, k+1]   = target([last, drafts]) at positions start .. start+k
      m, tokens         = verify(lm_head(hidden), drafts, cap = min(k_i, forced cap))   # row emits tokens[:m+1]
      cached += m + 1; last = tokens[m]; history[start+1 ..] = tokens
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tabletune.engine.config import EngineConfig
from tabletune.engine.drafters import Drafter, Proposal
from tabletune.engine.model import Decoder
from tabletune.engine.verify import verify
from tabletune.padding import bucket_for, default_buckets
from tabletune.policies.base import MODEL, NGRAM

__all__ = ["EngineConfig", "SpecEngine"]
log = logging.getLogger(__name__)


PREFILL_GRAPHS = 16  # prompt lengths that get a prefill graph (each holds its own memory pool)


@contextlib.contextmanager
def _collector_paused():
    """Python's garbage collector run first, then off for the block (a CUDA graph capture): an earlier engine's
    graphs, freed by a collection that fell inside the capture, would invalidate it."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class PrefillGraph:
    """The target's prefill of one prompt length, captured: write ``tokens`` and ``slot``, replay, read ``hidden``
    [n, hidden] and ``logits`` [1, vocab] (the last position's, fp32); both are overwritten by the next replay."""
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # [n] int64
    slot: torch.Tensor  # [1] int64
    hidden: torch.Tensor
    logits: torch.Tensor


@dataclass
class StepBuffers:
    """A bucket's static step inputs and outputs; the host reads ``out`` (and ``signals``) after the step."""

    inputs: torch.Tensor  # [4, B] int64 on the device: slots, requested k, forced-rejection caps, drafter kind
    host: torch.Tensor  # [4, B] int64 on the host (pinned on CUDA): one copy per step fills ``inputs``
    # [B, OUT_COLS + k_max + 1]: m, verified k, n-gram match length, n-gram proposals, then the k + 1 tokens
    out: torch.Tensor
    signals: torch.Tensor  # [B, k_max, 3] float32: each drafted token's top-1 probability, entropy, margin
    drafts: torch.Tensor  # [B, k_max] int64: the draft phase's tokens, which the verify phase reads
    accept_run: torch.Tensor  # [B, 2] int64: recorded accepted run of the model / n-gram chain (trace replay)
    probs: torch.Tensor | None = None  # [B, k_max, V] float32: draft distributions kept between split phases

    @property
    def slots(self) -> torch.Tensor:  # [B]
        return self.inputs[0]


@dataclass(frozen=True)
class StepResult:
    """What a step did, per row, read back after it."""

    accepted: list[int]  # m: accepted drafts (the bonus excluded)
    ks: list[int]  # drafts verified (the requested k, n-gram rows capped to their real drafts)
    tokens: list[list[int]]  # emitted tokens, m + 1 a row
    match_len: list[int]  # n-gram suffix match length (0: none, or not an n-gram drafter)
    num_proposed: list[int]  # real drafts of the drafter (all k but for n-gram)


OUT_COLS = 4


class SpecEngine:
    def __init__(self, target: Decoder, drafter: Drafter, cfg: EngineConfig) -> None:
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.device = target.device
        self.k_max, self.temperature = cfg.k_max, cfg.temperature
        self.buckets = list(cfg.buckets or default_buckets(cfg.max_num_seqs))
        self.ks = list(cfg.ks or range(cfg.k_max + 1))
        self.cache = target.new_cache(self.buckets[-1], cfg.max_len)
        s1, dev = self.cache.num_slots + 1, self.device
        self.cached = torch.zeros(s1, dtype=torch.long, device=dev)  # tokens in the target cache
        self.last_token = torch.zeros(s1, dtype=torch.long, device=dev)  # newest token, not yet cached
        self.history = torch.zeros(s1, cfg.max_len, dtype=torch.long, device=dev)  # all tokens by position
        self.oracle = torch.zeros(s1, cfg.max_len, dtype=torch.long, device=dev)  # ReplayDrafter's tokens
        drafter.setup(self)
        # the drafter kind a row gets unless the policy picks one: the n-gram drafter is NGRAM, all others MODEL
        self.default_kind = NGRAM if drafter.name == "ngram" else MODEL
        self.buffers = {b: self._buffers(b) for b in self.buckets}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # ("draft" | "verify", bucket, k) -> graph of one phase of a split step (``EngineConfig.split_steps``)
        self.split_graphs: dict[tuple[str, int, int], torch.cuda.CUDAGraph] = {}
        self.prefill_graphs: dict[int, PrefillGraph] = {}  # prompt length -> its captured prefill
        self._prefill_seen: dict[int, int] = {}  # prompt length -> prompts of that length prefilled so far
        use_graphs = self.device.type == "cuda" if cfg.use_graphs is None else cfg.use_graphs
        self.prefill_graph_max_len = cfg.prefill_graph_max_len if use_graphs else 0
        if use_graphs:
            self.capture()

    def _buffers(self, b: int) -> StepBuffers:
        k, dev = self.k_max, self.device
        host = torch.tensor([[self.cache.scratch_slot] * b, [k] * b, [k] * b, [self.default_kind] * b],
                            dtype=torch.long)
        if dev.type == "cuda":
            host = host.pin_memory()
        # a copy on the CPU too (``to`` would hand back ``host`` itself), so that the inputs a step reads are only
        # what was uploaded into them, as on the GPU
        signals = torch.zeros(b, k, 3, device=dev)
        signals[..., 0] = signals[..., 2] = 1.0  # a drafter without probabilities: a sure one-hot draft
        probs = None
        if self.cfg.split_steps and self.drafter.has_probs:  # a sampling model drafter
            probs = torch.zeros(b, k, self.target.cfg.vocab_size, device=dev)
        return StepBuffers(host.to(dev, copy=True), host, torch.zeros(b, OUT_COLS + k + 1, dtype=torch.long,
                           device=dev), signals, torch.zeros(b, k, dtype=torch.long, device=dev),
                           torch.zeros(b, 2, dtype=torch.long, device=dev), probs)

    # ---- the step ----------------------------------------------------------

    @torch.inference_mode()
    def _draft_body(self, buf: StepBuffers, k: int, keep: bool) -> Proposal:
        """Draft k tokens a row; signals and n-gram counts into ``buf``, and with ``keep`` (the draft phase of a
        split step) also what the verify phase reads: the drafts, their probabilities, the recorded runs."""
        slots = buf.slots
        if k == 0:
            prop = Proposal(torch.zeros(slots.shape[0], 0, dtype=torch.long, device=self.device))
        else:
            prop = self.drafter.propose(slots, self.cached[slots], self.last_token[slots], k)
        if prop.signals is not None:
            buf.signals[:, :k] = prop.signals
        buf.out[:, 2] = 0 if prop.match_len is None else prop.match_len
        buf.out[:, 3] = k if prop.num_proposed is None else prop.num_proposed
        if keep:
            buf.drafts[:, :k] = prop.drafts
            buf.accept_run.copy_(torch.full_like(buf.accept_run, k) if prop.accept_run is None else prop.accept_run)
            if buf.probs is not None and prop.probs is not None:
                buf.probs[:, :k] = prop.probs
        return prop

    @torch.inference_mode()
    def _verify_body(self, buf: StepBuffers, k: int, prop: Proposal) -> None:
        """Verify the first k_i of the k drafts per row; accept, update state, write ``buf.out``.

        Rows are padded to k: row i's cap min(k_i, forced cap, recorded run) stops its verification at k_i, where
        it emits the target's own token (the bonus), so a shorter row is verified exactly as a step of k_i.
        """
        slots, k_ver, forced, kind = buf.inputs
        start, last = self.cached[slots], self.last_token[slots]
        drafts = prop.drafts
        if prop.num_proposed is not None:  # [B] n-gram rows verify only their real drafts
            k_ver = torch.where(kind == NGRAM, torch.minimum(k_ver, prop.num_proposed), k_ver)
        cap = torch.minimum(k_ver, forced)
        if prop.accept_run is not None:  # the recorded accepted run of the row's chain
            cap = torch.minimum(cap, prop.accept_run.gather(1, kind[:, None])[:, 0])
        # [B, k+1]
        inputs = torch.cat([last[:, None], drafts], dim=1)
        hidden = self.target(inputs, start, slots, self.cache)
        m, tokens = verify(self.target.logits(hidden), drafts, prop.probs, self.temperature, cap=cap)
        self.cached[slots] = start + m + 1
        self.last_token[slots] = tokens.gather(1, m[:, None])[:, 0]
        self.history[slots[:, None], (start + 1)[:, None] + torch.arange(k + 1, device=self.device)] = tokens
        self.drafter.observe(slots, start, tokens, m, hidden)
        self.cached[self.cache.scratch_slot:].zero_()
        buf.out[:, 0] = m
        buf.out[:, 1] = k_ver
        buf.out[:, OUT_COLS: OUT_COLS + k + 1] = tokens

    def _step_body(self, buf: StepBuffers, k: int) -> None:
        """Draft and verify in one go; captured as one graph per (bucket, k)."""
        self._verify_body(buf, k, self._draft_body(buf, k, keep=False))

    def _phase_body(self, phase: str, buf: StepBuffers, k: int) -> None:
        if phase == "draft":
            self._draft_body(buf, k, keep=True)
        else:
            probs = None if buf.probs is None else buf.probs[:, :k]
            self._verify_body(buf, k, Proposal(buf.drafts[:, :k], probs, num_proposed=buf.out[:, 3],
                                               accept_run=buf.accept_run))

    def capture(self) -> None:
        """A CUDA graph per (bucket, k), largest bucket first, sharing one memory pool; with split steps also a
        draft graph and a verify graph per (bucket, k)."""
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        with _collector_paused():
            for b in reversed(self.buckets):
                for k in self.ks:
                    self.graphs[(b, k)] = self.capture_step(b, k, pool, stream)
                    for phase in ("draft", "verify") if self.cfg.split_steps else ():
                        self.split_graphs[(phase, b, k)] = self.capture_step(b, k, pool, stream, phase)
        self.cached.zero_()
        torch.cuda.synchronize()

    def timed_ms(self, run, num_rows: int, context_len: int) -> float:
        """GPU time (ms, CUDA events) of ``run()`` (a graph replay or a launch), rows 0 .. num_rows-1 first put back
        at ``context_len`` cached tokens."""
        self.reset_rows(num_rows, context_len)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1)

    def capture_step(self, b: int, k: int, pool=None, stream: torch.cuda.Stream | None = None,
                     phase: str = "step") -> torch.cuda.CUDAGraph:
        """The step (or one phase of a split step) of bucket b with k drafts as a CUDA graph whose first node
        uploads the host inputs. It is first run once on a side stream, so that kernel compiles and GEMM choices
        happen outside the capture."""
        buf = self.buffers[b]
        body = (lambda: self._step_body(buf, k)) if phase == "step" else (lambda: self._phase_body(phase, buf, k))
        stream = stream or torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            body()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            buf.inputs.copy_(buf.host, non_blocking=True)
            body()
        return g

    def _fill(self, slots: Sequence[int], ks: int | Sequence[int], caps: Sequence[int] | None,
              kinds: Sequence[int] | None, min_rows: int) -> tuple[StepBuffers, int]:
        """Write the rows' inputs into the bucket's pinned host buffer; (buffer, the step's k = max k_i)."""
        n = len(slots)
        ks_row = [int(ks)] * n if isinstance(ks, int) else [int(x) for x in ks]
        if len(ks_row) != n or min(ks_row, default=0) < 0:
            raise ValueError(f"need one k >= 0 per row, got {ks_row} for {n} rows")
        if kinds is not None and not set(kinds) <= {MODEL, NGRAM}:
            raise ValueError(f"drafter kinds must be MODEL ({MODEL}) or NGRAM ({NGRAM}), got {list(kinds)}")
        # the step runs the graph of the smallest captured k >= max k_i (its rows padded to that k)
        k = min((x for x in self.ks if x >= max(ks_row, default=0)), default=-1)
        if k < 0:
            raise ValueError(f"k={max(ks_row)} has no graph (captured: {self.ks})")
        b = bucket_for(max(n, min_rows), self.buckets)
        buf = self.buffers[b]
        host = buf.host.numpy()  # free to overwrite: the previous step's copy finished before its read-back
        host[0, :n] = slots
        host[0, n:] = self.cache.scratch_slot
        host[1, :n] = ks_row
        host[2, :n] = caps if caps is not None else k
        host[3, :n] = kinds if kinds is not None else self.default_kind
        host[1:3, n:] = k
        host[3, n:] = self.default_kind
        return buf, k

    def launch(self, slots: Sequence[int], ks: int | Sequence[int], caps: Sequence[int] | None = None,
               min_rows: int = 0, kinds: Sequence[int] | None = None) -> StepBuffers:
        """Fill the static inputs and run the step (replay on CUDA); no sync.

        ``ks``: one k for every row, or k_i per row (a ragged step: it runs the graph of max k_i); ``caps``:
        forced-rejection caps; ``kinds``: MODEL or NGRAM per row (the trace replay's chain; n-gram rows verify at
        most the drafts that follow their match)."""
        buf, k = self._fill(slots, ks, caps, kinds, min_rows)
        graph = self.graphs.get((buf.out.shape[0], k))
        if graph is not None:
            graph.replay()  # copies buf.host in, then runs the step
        else:
            buf.inputs.copy_(buf.host, non_blocking=True)
            self._step_body(buf, k)
        return buf

    def draft(self, slots: Sequence[int], k: int, min_rows: int = 0) -> StepBuffers:
        """The draft phase of a split step: k drafts a row and their signals into the bucket's buffers; no sync.
        A policy that reads the signals then picks k_i <= k and ``verify_drafted`` finishes the step."""
        return self._phase("draft", slots, k, None, None, min_rows)

    def verify_drafted(self, slots: Sequence[int], ks: Sequence[int], caps: Sequence[int] | None = None,
                       min_rows: int = 0, kinds: Sequence[int] | None = None) -> StepBuffers:
        """The verify phase of a split step (after ``draft`` of the same rows with k >= max k_i); no sync."""
        return self._phase("verify", slots, ks, caps, kinds, min_rows)

    def _phase(self, phase, slots, ks, caps, kinds, min_rows) -> StepBuffers:
        buf, k = self._fill(slots, ks, caps, kinds, min_rows)
        graph = self.split_graphs.get((phase, buf.out.shape[0], k))
        if graph is not None:
            graph.replay()
        else:
            buf.inputs.copy_(buf.host, non_blocking=True)
            self._phase_body(phase, buf, k)
        return buf

    def read(self, buf: StepBuffers, num_rows: int, k: int) -> StepResult:
        """The step's results for rows 0 .. num_rows-1 (the one host sync of a step)."""
        out = buf.out[:num_rows, : OUT_COLS + k + 1].tolist()
        return StepResult([r[0] for r in out], [r[1] for r in out], [r[OUT_COLS: OUT_COLS + r[0] + 1] for r in out],
                          [r[2] for r in out], [r[3] for r in out])

    def read_signals(self, buf: StepBuffers, num_rows: int, k: int):
        """[num_rows, k, 3] numpy float32: the drafted tokens' top-1 probability, entropy, margin."""
        return buf.signals[:num_rows, :k].cpu().numpy()

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
        """Run the prompt through the target (and the drafter); return the first generated token."""
        n = len(prompt)
        if not 0 < n <= self.cfg.max_len - self.k_max - 3:
            raise ValueError(f"prompt of {n} tokens does not fit max_len {self.cfg.max_len}")
        p = torch.tensor(prompt, dtype=torch.long, device=self.device)
        hidden, logits = self._prefill_target(p, torch.tensor([slot], device=self.device))
        if self.temperature == 0:
            first = int(logits.argmax(-1))
        else:
            first = int(torch.multinomial(torch.softmax(logits / self.temperature, -1), 1))
        self.cached[slot] = n
        self.last_token[slot] = first
        self.history[slot, :n] = p
        self.history[slot, n] = first
        self.drafter.prefill(slot, p, first, hidden)
        return first

    def _prefill_forward(self, tokens: torch.Tensor, slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target over one prompt ``tokens`` [n] into cache slot ``slot`` [1]: (hidden [n, hidden], the last
        position's logits [1, vocab] fp32)."""
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        hidden = self.target(tokens[None], zero, slot, self.cache, prefill_at=(0, slot))[0]
        return hidden, self.target.logits(hidden[-1:]).float()

    def _prefill_target(self, tokens: torch.Tensor, slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``_prefill_forward``, replayed from the prompt length's graph when it has one. Prompts of a length up to
        ``prefill_graph_max_len`` run eager the first two times (the first makes the GEMM choices of its shapes);
        after the second the graph is captured for the next ones, so one-off lengths cost no capture."""
        n = tokens.shape[0]
        pg = self.prefill_graphs.get(n)
        if pg is not None:
            pg.tokens.copy_(tokens)
            pg.slot.copy_(slot)
            pg.graph.replay()
            return pg.hidden, pg.logits
        out = self._prefill_forward(tokens, slot)
        self._prefill_seen[n] = seen = self._prefill_seen.get(n, 0) + 1
        if seen >= 2 and n <= self.prefill_graph_max_len and len(self.prefill_graphs) < PREFILL_GRAPHS:
            try:
                self.prefill_graphs[n] = self._capture_prefill(tokens.clone(), slot.clone())
            except RuntimeError as exc:  # a forward that cannot be captured: eager from now on, serving goes on
                log.warning("prefill of %d tokens not captured (%s); prompts run eager", n, exc)
                self.prefill_graph_max_len = 0
        return out

    def _capture_prefill(self, tokens: torch.Tensor, slot: torch.Tensor) -> PrefillGraph:
        """``_prefill_forward`` of these static inputs captured as a CUDA graph, in its own memory pool (it replays
        between the steps' graphs, never inside them)."""
        g = torch.cuda.CUDAGraph()
        with _collector_paused(), torch.cuda.graph(g):
            hidden, logits = self._prefill_forward(tokens, slot)
        return PrefillGraph(g, tokens, slot, hidden, logits)

    def set_context(self, num_rows: int, context_len: int, seed: int = 0) -> None:
        """Pretend slots 0..num_rows-1 hold context_len tokens (random history) — for timing."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        vocab = self.target.cfg.vocab_size
        self.cached[:num_rows] = context_len
        self.history[:num_rows] = torch.randint(0, vocab, self.history[:num_rows].shape, generator=g).to(self.device)
        self.last_token[:num_rows] = self.history[:num_rows, context_len]
        self.reset_rows(num_rows, context_len)

    def reset_rows(self, num_rows: int, context_len: int) -> None:
        """Put slots 0..num_rows-1 back at context_len cached tokens (between timed steps)."""
        self.cached[:num_rows] = context_len
        if hasattr(self.drafter, "prev_count"):
            self.drafter.prev_count[:num_rows] = 1
            self.drafter.prev_start[:num_rows] = context_len
