"""Online adaptation: the EAGLE head learns from verified tokens inside the built-in engine's serving loop.

``OnlineAdapter.after_step`` is the scheduler's step hook (``engine.scheduler.StepHook``); it runs between steps:

1. collect: the target's features f of the step's verified positions start .. start + m of every row, in one
   gather. The engine's ``EagleDrafter`` holds them after the step as its next catch-up input
   (``prev_hid[slot, :m + 1]``): the verify forward computed them, so learning costs no extra target forward.
2. queue: a finished request's output becomes one training sequence, tokens x_p and features f_p for the output
   positions p = P .. P + F - 1 (P the prompt length); at most ``max_pending`` wait (a new one is dropped).
3. update: ``steps`` AdamW steps of the training loss (``train.batch_loss``: soft-label CE against
   softmax(lm_head(f_{p+1})) plus the feature regression, at input (embed(x_{p+1}), f_p)) on a float32 master
   copy of the head, over every sequence waiting (right-padded into one batch, the padding masked out; fused
   AdamW on CUDA). With ``background`` (default on CUDA) a worker thread runs it on a side CUDA stream, so the
   serving loop does not wait for it. It still shares the process's host (the interpreter's lock): on an H100 each
   update cost the stream about 60 ms, whether it learnt from one sequence or several, and the stream ran 29%
   slower (``benchmarks/results/drafter_online_h100``). ``OnlineStats`` keeps an update's host time (queueing its
   work) apart from its GPU time (CUDA events on the side stream).
4. publish: once an update has finished (an event polled without a sync), its weights are copied into the
   engine's drafter between two steps, in place (the captured graphs read the same storage).

Lossless: verification reads only the target (its weights, its KV cache, the drafted tokens); the head changes
which tokens are drafted, never which are emitted. The head's embedding and LM head are the target's and stay
frozen: the optimizer holds only the head's own weights.

The update sees the output only: the engine keeps no features of the prompt, so in training the head's attention
has no prompt context (serving's has). Updates at lr 1e-4 lowered held-out acceptance in a CPU replay of a
code -> chat stream and 1e-5 left it flat, hence the default.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from tabletune.integrations.hf.eagle_head import load_head
from tabletune.drafter.train import LossConfig, batch_loss

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineConfig:
    lr: float = 1e-5
    steps: int = 2  # AdamW steps per finished request
    min_tokens: int = 4  # shorter outputs are not learned from
    max_pending: int = 8  # finished requests waiting for an update; more are dropped
    loss: LossConfig = field(default_factory=LossConfig)
    background: bool | None = None  # a worker thread (and a side stream on CUDA); default: on CUDA
    eos_id: int | None = None  # learn from an output up to its first end-of-turn token (fixed-length serving)

    def __post_init__(self) -> None:
        if not (self.lr > 0 and self.steps >= 1 and self.min_tokens >= 3 and self.max_pending >= 1):
            raise ValueError(f"bad online config {self}")


@dataclass
class OnlineStats:
    """Counters of an adapter (read by the benchmark)."""

    queued: int = 0  # finished requests queued for an update
    dropped: int = 0  # finished requests dropped: the queue was full
    updates: int = 0  # updates applied (each ``steps`` optimizer steps over the sequences waiting)
    learned: int = 0  # sequences those updates learned from
    published: int = 0  # weight copies into the engine's drafter
    update_host_s: float = 0.0  # the updates' host time: the worker's (or the loop's) wall time queueing their work
    update_gpu_ms: float = 0.0  # their device time on the side stream (CUDA events; 0 on the CPU)
    error: str | None = None  # why learning stopped (an update raised); serving goes on with the last published head


@dataclass
class _Pending:
    """A running request's collected features: (gathered step tensor, row, positions) chunks from position P on."""

    chunks: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)


class OnlineAdapter:
    """The head of ``engine`` (an ``EagleDrafter`` loaded from ``head_dir``) learning while the scheduler serves."""

    def __init__(self, engine, head_dir: str, cfg: OnlineConfig = OnlineConfig()) -> None:
        drafter = engine.drafter
        if getattr(drafter, "name", "") != "eagle" or getattr(drafter, "norms", True):
            raise ValueError("online adaptation needs the engine's EAGLE-1 drafter (make_drafter('eagle', head=...))")
        self.engine, self.drafter, self.cfg = engine, drafter, cfg
        target = drafter.target[0]
        self.device = target.device
        self.embed, self.lm_head = target.embed.detach(), target.lm_head.detach()
        self.head = load_head(head_dir).to(self.device).train()
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0,
                                     fused=self.device.type == "cuda")  # one kernel a step, not one a tensor
        self.stats = OnlineStats()
        self._pending: dict[int, _Pending] = {}
        cuda = self.device.type == "cuda"
        self.background = cuda if cfg.background is None else cfg.background
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self._queue: queue.Queue = queue.Queue(cfg.max_pending)
        # (CUDA event or None, staged weights, the update's start event or None) of finished updates, oldest first
        self._done: deque = deque()
        self._worker = None
        if self.background:
            self._worker = threading.Thread(target=self._work, name="online-head-update", daemon=True)
            self._worker.start()

    # ---- the step hook ---------------------------------------------------------------------------------------

    def after_step(self, running, res, finished_ids: np.ndarray) -> None:
        """Collect the step's features, queue finished requests, publish a finished update (see the module doc)."""
        # [n, k_max + 1, hidden]: column j is the feature of position start + j of the row's slot
        gathered = self.drafter.prev_hid[torch.tensor([r.slot for r in running], device=self.device)]
        finished, accepted, done = set(finished_ids.tolist()), res.accepted, []
        for i, req in enumerate(running):
            self._pending.setdefault(req.id, _Pending()).chunks.append((gathered, i, accepted[i] + 1))
            if req.id in finished:
                seq = self._finish(req, self._pending.pop(req.id))
                if seq is not None:
                    done.append(seq)
        if not self.background:  # in the foreground: one update for the step's finished requests
            if done:
                self.stats.queued += len(done)
                self._guarded_update(done)
        else:  # the worker learns from all it finds queued at once
            for seq in done:
                try:
                    self._queue.put_nowait(seq)
                    self.stats.queued += 1
                except queue.Full:
                    self.stats.dropped += 1
        self._publish_ready()

    def flush(self) -> None:
        """Wait for every queued update and publish the last (between two runs, e.g. before an evaluation)."""
        if self.background:
            self._queue.join()
        self._publish_ready(wait=True)

    def close(self) -> None:
        if self._worker is not None:
            self.flush()
            self._queue.put(None)
            self._worker.join()
            self._worker = None

    # ---- queue, update, publish ------------------------------------------------------------------------------

    def _finish(self, req, pending: _Pending) -> tuple | None:
        """A finished request's training sequence (ids, features, ready event), or None (too short, or learning
        stopped)."""
        if self.stats.error is not None:
            return None
        feats = torch.cat([g[i, :n] for g, i, n in pending.chunks], 0)  # [F, hidden], positions P .. P + F - 1
        output = req.output
        if self.cfg.eos_id is not None and self.cfg.eos_id in output:
            output = output[: output.index(self.cfg.eos_id) + 1]
        num = min(feats.shape[0], len(output))
        if num < self.cfg.min_tokens:
            return None
        ids, feats = torch.tensor(output[:num], device=self.device), feats[:num]
        ready = None
        if self._stream is not None:  # the side stream reads tensors the main stream wrote
            ready = torch.cuda.Event()
            ready.record()
            ids.record_stream(self._stream)
            feats.record_stream(self._stream)
        return ids, feats, ready

    def _work(self) -> None:
        """Take every sequence queued (at least one, waiting for it) and learn from them in one update."""
        while True:
            items = [self._queue.get()]
            while items[-1] is not None:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                seqs = [seq for seq in items if seq is not None]
                if seqs:
                    self._guarded_update(seqs)
            finally:
                for _ in items:
                    self._queue.task_done()
            if items[-1] is None:
                return

    def _guarded_update(self, seqs: list[tuple]) -> None:
        """``_update``, unless an earlier one raised: the first error stops learning (logged once, kept in
        ``stats.error``); the queue still drains, so ``flush`` never waits on a dead worker, and serving goes on."""
        if self.stats.error is not None:
            return
        try:
            self._update(seqs)
        except Exception as exc:  # noqa: BLE001 - learning is optional, serving is not
            self.stats.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("online head update failed, learning stopped, the last published head serves on: %s",
                        self.stats.error)

    def _update(self, seqs: list[tuple]) -> None:
        """``steps`` AdamW steps on the sequences (``collate``), then the weights staged in the engine's dtype (on
        the side stream on CUDA); (its event, the staged weights, its start event) go to ``_done`` for the serving
        loop to publish."""
        t0 = time.perf_counter()
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            start = None
            if self._stream is not None:
                start = torch.cuda.Event(enable_timing=True)
                start.record(self._stream)
            for _, _, ready in seqs:
                if ready is not None:
                    self._stream.wait_event(ready)
            with torch.inference_mode(False):  # the serving loop may run in inference mode: plain copies for autograd
                batch = collate([(ids, feats) for ids, feats, _ in seqs])
            with torch.inference_mode(False), torch.enable_grad():
                for _ in range(self.cfg.steps):
                    loss, _ = batch_loss(self.head, self.embed, self.lm_head, batch, self.cfg.loss, with_stats=False)
                    self.opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
                    self.opt.step()
            dtype = self.drafter.fc.dtype
            staged = {k: v.detach().to(dtype, copy=True) for k, v in self.head.state_dict().items()}
            done = None
            if self._stream is not None:
                done = torch.cuda.Event(enable_timing=True)
                done.record(self._stream)
        self.stats.updates += 1
        self.stats.learned += len(seqs)
        self.stats.update_host_s += time.perf_counter() - t0
        self._done.append((done, staged, start))

    def _publish_ready(self, wait: bool = False) -> None:
        """Copy the newest finished update's weights into the engine's drafter (``wait``: wait for the updates)."""
        from tabletune.engine.weights import put_eagle_state

        latest = None
        while self._done and (wait or self._done[0][0] is None or self._done[0][0].query()):
            latest = self._done.popleft()
            event, _, start = latest
            if start is not None:
                event.synchronize()  # complete already unless ``wait``
                self.stats.update_gpu_ms += start.elapsed_time(event)
        if latest is None:
            return
        event, staged, _ = latest
        if event is not None:
            torch.cuda.current_stream().wait_event(event)  # already complete unless ``wait``
            for t in staged.values():
                t.record_stream(torch.cuda.current_stream())
        put_eagle_state(self.drafter, staged, "online head")
        self.stats.published += 1


def collate(seqs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """Sequences (ids [F_i], features [F_i, hidden]) right-padded into one ``train.batch_loss`` batch: ids
    [n, F], feats [n, F, hidden] (fresh tensors, padding 0) and mask [n, F - 1], true at each sequence's
    positions. The head's attention is causal, so a sequence's positions never see its padding, and the loss
    averages over the masked positions: the batch's loss is the position-weighted mean of its sequences'."""
    width = max(int(ids.shape[0]) for ids, _ in seqs)
    first = seqs[0][1]
    ids = torch.zeros(len(seqs), width, dtype=seqs[0][0].dtype, device=first.device)
    feats = torch.zeros(len(seqs), width, first.shape[-1], dtype=first.dtype, device=first.device)
    mask = torch.zeros(len(seqs), width - 1, dtype=torch.bool, device=first.device)
    for i, (seq_ids, seq_feats) in enumerate(seqs):
        n = int(seq_ids.shape[0])
        ids[i, :n], feats[i, :n], mask[i, : n - 1] = seq_ids, seq_feats, True
    return {"ids": ids, "feats": feats, "mask": mask}
