"""The speculative step: draft, verify, accept, update state; one CUDA graph per (batch bucket, k).

All set-up happens in the constructor: KV caches, per-slot state, and on CUDA a
graph for every (bucket, k), captured largest first into one memory pool (as
nano-vllm does). A step only writes the slot ids and caps into a pinned host
buffer, replays (the graph's first node uploads that buffer), and reads back one
small tensor (the step's single host sync). A prompt's prefill runs eager, or from a graph per prompt length
once a length has come twice (``EngineConfig.prefill_graph_max_len``):

    step(b rows, k):  bucket B = bucket_for(b); rows b..B-1 point at the scratch slot
      drafts [B, k]     = drafter.propose(...)
      hidden [B, k+1]   = target([last, drafts]) at positions start .. start+k
      m, tokens         = verify(lm_head(hidden), drafts)       # row emits tokens[:m+1]
      cached += m + 1; last = tokens[m]; history[start+1 ..] = tokens
"""

from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass

import torch

from tabletune.engine.drafters import Drafter
from tabletune.engine.model import PREFETCH_MODES, Decoder, L2Prefetch
from tabletune.engine.verify import verify
from tabletune.padding import bucket_for, default_buckets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8
    max_len: int = 2048  # cache positions per sequence (prompt + output + k_max + 2)
    k_max: int = 7
    temperature: float = 0.0
    buckets: tuple[int, ...] = ()  # default: padding.default_buckets(max_num_seqs)
    ks: tuple[int, ...] = ()  # k values with a graph; default 0..k_max
    use_graphs: bool | None = None  # default: on CUDA
    # Two-stream overlap: a step of B rows with B*(k+1) >= this runs the target forward as two half-batches on two
    # streams, so that one half's attention (KV-bound) can run beside the other half's GEMMs. 0: off.
    overlap_min_tokens: int = 0
    # With the overlap: SMs that cuBLAS GEMMs leave free (torch's experimental SM carveout, baked into the captured
    # launches), so that the other half's attention finds SMs to run on. 0: none.
    overlap_sm_carveout: int = 0
    # L2 prefetch of each layer's o weight during RoPE + attention (CUDA, one-stream steps of at most this many
    # rows, where attention is latency-bound and the memory bus idles); 0: off. Mode: model.PREFETCH_MODES.
    # Off by default: measured on the H200 at -0.6% .. +6.5% step time (docs/engine_notes.md, v0.5).
    prefetch_max_batch: int = 0
    prefetch_mode: str = "lines"
    # programs of the prefetch kernel: 16 (engine 0.5) pull ~33 MB through 16 SMs, slower than the attention it
    # hides behind; at b <= 8 attention leaves ~70 of the 132 SMs idle
    prefetch_programs: int = 16
    # Verify steps (k >= 1) run qk-norm, RoPE and the cache write inside the attention launch (model.DecoderLayer.attn)
    fuse_rope: bool = True
    # Steps of at most this many rows (<= model.FUSED_NORM_MAX_M) run the fused-norm layers
    # (model._forward_fused_norm: no norm launch inside the stack). 0: off (docs/engine_notes.md, engine 0.7).
    fuse_norm_max_rows: int = 0
    # CUDA graphs of buckets of b <= 64 (kernels.step_attn_candidates): capture the step with each attention tile it
    # lists, time the replays at the longest context the cache holds, keep the fastest (timed alone, the launches of
    # small buckets misled: docs/engine_notes.md, 0.7.dev3 and 0.7.dev4)
    attn_step_choice: bool = True
    # CUDA graphs of steps of at most gemm_step_max_rows target rows whose GEMM choices include a kernel that is
    # not Triton's where a Triton config was timed (gemm.pdl_breaks): capture the step again with gemm.triton_only
    # (every such GEMM on its fastest Triton config, which keeps the PDL chain of the step's kernels), time both
    # replays as the attention choice does, keep the faster. H200 traces (engine_step_breakdown_h200_v7dev7.log):
    # from k = 3 to k = 4 gate_up turned cuBLAS at b = 1 and every GEMM at b = 16, and the replay grew by 0.17 /
    # 0.39 ms where the kernels alone grew by 0.04 / 0.17 ms. Measured on the 8B shape (engine 0.7.dev8 in
    # docs/engine_notes.md): Triton-only replayed faster at 18 of the 39 steps of <= 64 rows (by more than 1% at
    # 12, by at most 0.10 ms or 2.1%) and slower at all 23 steps of more rows (by 2.8% up to 2.1 ms): the cap.
    gemm_step_choice: bool = True
    gemm_step_max_rows: int = 64  # 0: no step
    # The target's prompt forward (prefill) as a CUDA graph per prompt length up to this many tokens, captured after
    # the second prompt of that length (at most PREFILL_GRAPHS lengths; longer prompts and further lengths run
    # eager). Eager, a 32-token prefill of the 8B shape cost 36-45 ms on the H200, host-bound by its ~500 launches;
    # graphed, closed-loop serving ran 1.1-3.2x faster (docs/engine_notes.md, serving). 0: always eager. Used only
    # where the step graphs are (use_graphs).
    prefill_graph_max_len: int = 512

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.k_max < 0 or self.temperature < 0 or self.prefetch_max_batch < 0 \
                or self.prefetch_programs < 1 or self.fuse_norm_max_rows < 0 or self.prefill_graph_max_len < 0:
            raise ValueError(f"bad engine config {self}")
        if self.prefetch_mode not in PREFETCH_MODES:
            raise ValueError(f"prefetch_mode {self.prefetch_mode!r} not in {PREFETCH_MODES}")
        if self.max_len < self.k_max + 3:
            raise ValueError(f"max_len {self.max_len} too small for k_max {self.k_max}")


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
    inputs: torch.Tensor  # [2, B] int64 on the device: row 0 the slots, row 1 the forced-rejection caps
    host: torch.Tensor  # [2, B] int64 on the host (pinned on CUDA): one copy per step fills ``inputs``
    out: torch.Tensor  # [B, k_max + 2]: column 0 is m, columns 1.. the emitted tokens

    @property
    def slots(self) -> torch.Tensor:  # [B]
        return self.inputs[0]

    @property
    def cap(self) -> torch.Tensor:  # [B]
        return self.inputs[1]


class SpecEngine:
    def __init__(self, target: Decoder, drafter: Drafter, cfg: EngineConfig) -> None:
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.device = target.device
        self.k_max, self.temperature = cfg.k_max, cfg.temperature
        # a benchmark may change these two before capturing a variant
        self.overlap_min_tokens, self.overlap_sm_carveout = cfg.overlap_min_tokens, cfg.overlap_sm_carveout
        self.prefetch_max_batch, self.prefetch_mode = cfg.prefetch_max_batch, cfg.prefetch_mode
        self.prefetch_programs = cfg.prefetch_programs
        self.fuse_rope, self.fuse_norm_max_rows = cfg.fuse_rope, cfg.fuse_norm_max_rows
        # (bucket, k) -> the kernels.attn_force value its graph was captured with (the in-step attention choice);
        # capture_step applies it, so later captures of that step run the same tiles
        self.attn_step_force: dict[tuple[int, int], tuple | None] = {}
        self.attn_step_ms: dict[tuple[int, int], dict] = {}  # (bucket, k) -> candidate -> median replay ms
        # (bucket, k) -> whether its graph was captured with gemm.triton_only (the in-step GEMM choice), and the
        # median replay ms of both ways
        self.gemm_step_triton: dict[tuple[int, int], bool] = {}
        self.gemm_step_ms: dict[tuple[int, int], dict] = {}
        self._side: torch.cuda.Stream | None = None  # second stream (two-stream forward, L2 prefetch), made on first use
        self.buckets = list(cfg.buckets or default_buckets(cfg.max_num_seqs))
        self.ks = list(cfg.ks or range(cfg.k_max + 1))
        self.cache = target.new_cache(self.buckets[-1], cfg.max_len)
        s1, dev = self.cache.num_slots + 1, self.device
        self.cached = torch.zeros(s1, dtype=torch.long, device=dev)  # tokens in the target cache
        self.last_token = torch.zeros(s1, dtype=torch.long, device=dev)  # newest token, not yet cached
        self.history = torch.zeros(s1, cfg.max_len, dtype=torch.long, device=dev)  # all tokens by position
        self.oracle = torch.zeros(s1, cfg.max_len, dtype=torch.long, device=dev)  # ReplayDrafter's tokens
        drafter.setup(self)
        self.buffers = {b: self._buffers(b) for b in self.buckets}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.prefill_graphs: dict[int, PrefillGraph] = {}  # prompt length -> its captured prefill
        self._prefill_seen: dict[int, int] = {}  # prompt length -> prompts of that length prefilled so far
        use_graphs = self.device.type == "cuda" if cfg.use_graphs is None else cfg.use_graphs
        self.prefill_graph_max_len = cfg.prefill_graph_max_len if use_graphs else 0
        if use_graphs:
            self.capture()

    def _buffers(self, b: int) -> StepBuffers:
        host = torch.tensor([[self.cache.scratch_slot] * b, [self.k_max] * b], dtype=torch.long)
        if self.device.type == "cuda":
            host = host.pin_memory()
        # a copy on the CPU too (``to`` would hand back ``host`` itself), so that the inputs a step reads are only
        # what was uploaded into them, as on the GPU
        return StepBuffers(host.to(self.device, copy=True), host, torch.zeros(b, self.k_max + 2, dtype=torch.long,
                                                                              device=self.device))

    # ---- the step ----------------------------------------------------------

    @torch.inference_mode()
    def _step_body(self, buf: StepBuffers, k: int) -> None:
        """Everything a step does on the device; captured as one graph per (bucket, k)."""
        slots = buf.slots
        start, last = self.cached[slots], self.last_token[slots]
        if k > 0:
            drafts, probs = self.drafter.propose(slots, start, last, k)
        else:
            drafts, probs = torch.zeros(slots.shape[0], 0, dtype=torch.long, device=self.device), None
        # [B, k+1]
        inputs = torch.cat([last[:, None], drafts], dim=1)
        hidden = self._forward(inputs, start, slots, self.overlaps(slots.shape[0], k))
        m, tokens = verify(self.target.logits(hidden), drafts, probs, self.temperature, cap=buf.cap)
        self.cached[slots] = start + m + 1
        self.last_token[slots] = tokens.gather(1, m[:, None])[:, 0]
        self.history[slots[:, None], (start + 1)[:, None] + torch.arange(k + 1, device=self.device)] = tokens
        self.drafter.observe(slots, start, tokens, m, hidden)
        self.cached[self.cache.scratch_slot:].zero_()
        buf.out[:, 0] = m
        buf.out[:, 1: k + 2] = tokens

    def overlaps(self, rows: int, k: int) -> bool:
        """Whether a step of ``rows`` (bucket) rows with k drafts runs the two-stream half-batch forward."""
        t = self.overlap_min_tokens
        return bool(t) and rows >= 2 and rows * (k + 1) >= t

    def prefetches(self, rows: int) -> bool:
        """Whether a one-stream step of ``rows`` (bucket) rows hints each layer's o weight into L2 (CUDA only)."""
        return self.device.type == "cuda" and 0 < rows <= self.prefetch_max_batch

    def _forward(self, inputs, start, slots, split: bool):
        """The target's verify forward; split: rows [:B/2] on this stream, [B/2:] on a second one, joined after.

        Rows are independent through every layer (each has its own cache slot), so the halves only meet at
        the join; on the CPU they simply run one after the other.
        """
        if not split:
            prefetch = L2Prefetch(self.prefetch_mode, self._side_stream(), self.prefetch_programs) \
                if self.prefetches(inputs.shape[0]) else None
            return self.target(inputs, start, slots, self.cache, prefetch=prefetch, fuse_rope=self.fuse_rope,
                               fuse_norm_rows=self.fuse_norm_max_rows)
        half = inputs.shape[0] // 2
        if self.device.type != "cuda":
            return torch.cat([self._forward_rows(inputs, start, slots, slice(None, half)),
                              self._forward_rows(inputs, start, slots, slice(half, None))])
        from tabletune.engine import kernels

        carve = self.overlap_sm_carveout and hasattr(torch._C, "_set_sm_carveout_experimental")
        if carve:
            previous = torch._C._get_sm_carveout_experimental()
            torch._C._set_sm_carveout_experimental(self.overlap_sm_carveout)
        try:
            main = torch.cuda.current_stream()
            side = self._side_stream()
            side.wait_stream(main)
            first = self._forward_rows(inputs, start, slots, slice(None, half))
            with torch.cuda.stream(side):
                kernels.lane = 1
                try:
                    second = self._forward_rows(inputs, start, slots, slice(half, None))
                finally:
                    kernels.lane = 0
            main.wait_stream(side)
        finally:
            if carve:
                torch._C._set_sm_carveout_experimental(previous)
        return torch.cat([first, second])

    def _forward_rows(self, inputs, start, slots, rows: slice):
        """The target forward of one half-batch of the two-stream step."""
        return self.target(inputs[rows], start[rows], slots[rows], self.cache, fuse_rope=self.fuse_rope)

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def capture(self) -> None:
        """A CUDA graph per (bucket, k), largest bucket first, sharing one memory pool."""
        with _collector_paused():
            self._capture_all()

    def _capture_all(self) -> None:
        pool = self.graph_pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for b in reversed(self.buckets):
            for k in self.ks:
                self.graphs[(b, k)] = self._choose_attention_in_step(b, k, pool, stream) \
                    if self.cfg.attn_step_choice else self.capture_step(b, k, pool, stream=stream)
                if self.cfg.gemm_step_choice:
                    self.graphs[(b, k)] = self._choose_gemms_in_step(b, k, self.graphs[(b, k)], pool, stream)
        self.cached.zero_()
        torch.cuda.synchronize()

    def _choose_attention_in_step(self, b: int, k: int, pool, stream, reps: int = 9) -> torch.cuda.CUDAGraph:
        """The step of (b, k) captured with each of ``kernels.step_attn_candidates`` (just once where there are
        none), every graph replayed in turn ``reps`` times from the same state, rows 0 .. b-1 at the longest
        context the cache holds; the fastest by median is kept and its tiles recorded in ``attn_step_force``."""
        from tabletune.engine import kernels

        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        cands = kernels.step_attn_candidates(b, self.target.cfg.num_kv_heads, sms)
        if len(cands) < 2:
            return self.capture_step(b, k, pool, stream=stream)
        graphs = {}
        for c in cands:
            self.attn_step_force[(b, k)] = c
            graphs[c] = self.capture_step(b, k, pool, stream=stream)
        medians = self._replay_medians(b, k, graphs, reps)
        best = min(medians, key=medians.get)
        self.attn_step_force[(b, k)] = best
        self.attn_step_ms[(b, k)] = medians
        return graphs[best]

    def _choose_gemms_in_step(self, b: int, k: int, graph: torch.cuda.CUDAGraph, pool, stream, reps: int = 9
                              ) -> torch.cuda.CUDAGraph:
        """``graph`` (the step of (b, k) as captured) or the same step captured with ``gemm.triton_only``,
        whichever replays faster (``_replay_medians``), for steps of at most ``gemm_step_max_rows`` (and
        MAX_TRITON_M) target rows where that switch changes a GEMM (``gemm.pdl_breaks`` of the target's and the
        drafter's row counts); the outcome is recorded in ``gemm_step_triton`` for later captures of the step."""
        from tabletune.engine import gemm

        rows = b * (k + 1)
        self.gemm_step_triton[(b, k)] = False
        if rows > min(gemm.MAX_TRITON_M, self.cfg.gemm_step_max_rows) or not gemm.pdl_breaks({rows, b}):
            return graph
        self.gemm_step_triton[(b, k)] = True
        graphs = {False: graph, True: self.capture_step(b, k, pool, stream=stream)}
        medians = self._replay_medians(b, k, graphs, reps)
        best = min(medians, key=medians.get)
        self.gemm_step_triton[(b, k)] = best
        self.gemm_step_ms[(b, k)] = medians
        return graphs[best]

    def _replay_medians(self, b: int, k: int, graphs: dict, reps: int) -> dict:
        """Median GPU ms of each graph of the step of (b, k), replayed in turn ``reps`` times from the same state
        (rows 0 .. b-1 at the longest context the cache holds); the inputs, rows and cached lengths put back
        after."""
        buf = self.buffers[b]
        context = self.cfg.max_len - self.k_max - 3
        saved, saved_cached = buf.host.clone(), self.cached.clone()
        buf.host[0], buf.host[1] = torch.arange(b), k
        self.set_context(b, context)
        times = {c: [] for c in graphs}
        for _ in range(reps):
            for c, g in graphs.items():
                times[c].append(self.timed_ms(g.replay, b, context))
        # the state as it was: the next capture's warm-up step runs eagerly on whatever slots ``buf.inputs`` names,
        # so they go back to the scratch slot (the replays above uploaded rows 0 .. b-1; a warm-up on those would
        # advance their cached length by up to k + 1 a capture, past max_len after enough of them)
        buf.host.copy_(saved)
        buf.inputs.copy_(buf.host)
        self.reset_rows(b, 0)
        self.cached.copy_(saved_cached)
        return {c: sorted(t)[len(t) // 2] for c, t in times.items()}

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

    def capture_step(self, b: int, k: int, pool=None, upload: bool = True,
                     stream: torch.cuda.Stream | None = None) -> torch.cuda.CUDAGraph:
        """The step of bucket b with k drafts as a CUDA graph, as the engine runs it now.

        It is first run once on a side stream, so that kernel compiles and GEMM choices happen outside
        the capture; ``upload``: the copy of the host inputs is the graph's first node.
        """
        buf = self.buffers[b]
        stream = stream or torch.cuda.Stream()
        with self.step_choices(b, k):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._step_body(buf, k)
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                if upload:
                    buf.inputs.copy_(buf.host, non_blocking=True)
                self._step_body(buf, k)
        return g

    @contextlib.contextmanager
    def step_choices(self, b: int, k: int):
        """The in-step choices recorded for (b, k) applied for the block (a capture of that step): its attention
        tiles (``kernels.attn_force``) and GEMM switch (``gemm.triton_only``), each unless a benchmark's variant
        set it from outside; both as they were after."""
        from tabletune.engine import gemm, kernels

        force, triton_only = kernels.attn_force, gemm.triton_only
        if force is None:
            kernels.attn_force = self.attn_step_force.get((b, k))
        if not triton_only:
            gemm.triton_only = self.gemm_step_triton.get((b, k), False)
        try:
            yield
        finally:
            kernels.attn_force, gemm.triton_only = force, triton_only

    def launch(self, slots: list[int], k: int, caps: list[int] | None = None, min_rows: int = 0) -> StepBuffers:
        """Fill the static inputs and run the step (replay on CUDA); no sync."""
        if k not in self.ks:
            raise ValueError(f"k={k} has no graph (captured: {self.ks})")
        b = bucket_for(max(len(slots), min_rows), self.buckets)
        buf = self.buffers[b]
        n = len(slots)
        host = buf.host.numpy()  # free to overwrite: the previous step's copy finished before its read-back
        host[0, :n] = slots
        host[0, n:] = self.cache.scratch_slot
        host[1, :n] = caps if caps is not None else k
        host[1, n:] = k
        graph = self.graphs.get((b, k))
        if graph is not None:
            graph.replay()  # copies buf.host in, then runs the step
        else:
            buf.inputs.copy_(buf.host, non_blocking=True)
            self._step_body(buf, k)
        return buf

    def step(self, slots: list[int], k: int, caps: list[int] | None = None,
             min_rows: int = 0) -> tuple[list[int], list[list[int]]]:
        """One speculative step for the sequences in ``slots``: (m per row, emitted tokens per row).

        ``min_rows``: run at least this bucket (rows past ``slots`` point at the scratch slot), so that a
        shrinking batch keeps one batch shape.
        """
        buf = self.launch(slots, k, caps, min_rows)
        out = buf.out[: len(slots), : k + 2].tolist()  # the step's one host sync
        return [row[0] for row in out], [row[1: row[0] + 2] for row in out]

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
