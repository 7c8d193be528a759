"""The built-in engine behind the tuner's ``Engine`` protocol: ``tabletune tune --engine builtin``.

* ``--model``: a shape preset (random weights; ``smollm2-135m`` loads its real weights) or a local HF folder.
* ``--method``: ngram, eagle (eagle3 is taken as eagle), draft_model, parallel_block; ``--draft-model``: for eagle,
  a trained head's folder (``tabletune drafter train``); for draft_model, a preset or folder. Both need one to
  measure real acceptance; with ``--synthetic-acceptance`` (timing) eagle may run random weights and draft_model
  qwen3-0.6b's shape when the vocabularies match, else a quarter-depth copy of the target's shape.
* ``--policy``: the policy (``tabletune simulate --policy`` spellings) that picks the draft lengths while
  acceptance is measured (default: every request drafts k); per-request k gives ragged steps.
* GPU when there is one (bf16, CUDA graphs over power-of-two batch buckets), else the CPU in float32.

``measure_step`` times whole steps from ``context_len`` cached tokens on a timing engine of ``batch_cap(n)``
sequences (all ``max_num_seqs`` when they fit the free GPU memory, ``tabletune.tuner.budget``) of
``context_len + k_max + 256`` tokens, the workload's own text (``EngineSpec.timing_prompts`` laid out by
``tabletune.tuner.workload.timing_rows``), else random tokens. One engine holds memory at a time: a new context
(or the acceptance pass) first releases the previous engine (``tabletune.engine.memory``) and measures the free
memory again, and the next engine is sized from that.
``measure_acceptance`` decodes the prompts with the real drafter or, with synthetic acceptance, replays the target's
own greedy continuation through the forced-rejection cap (lossless; acceptance follows the given rates).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from tabletune.acceptance import AcceptanceCounts
from tabletune.engine.drafters import ReplayDrafter, make_drafter
from tabletune.engine.memory import CudaMemory, DeviceMemory, FixedMemory
from tabletune.engine.model import Decoder
from tabletune.engine.presets import PRESETS, replace, resolve
from tabletune.engine.profiling import ENGINE_VERSION, RUNNER, device_name, time_steps
from tabletune.engine.runner import EngineConfig, SpecEngine
from tabletune.engine.scheduler import Request, Scheduler, policy_context
from tabletune.errors import InputError
from tabletune.padding import geometric_batch_sizes
from tabletune.policies import make_policy
from tabletune.policies import resolve as resolve_policy
from tabletune.profile import Fingerprint
from tabletune.table import DraftTable
from tabletune.tuner import EngineSpec, StepSamples
from tabletune.tuner.budget import BatchCap, MemoryPlan, kv_cache_bytes, largest_batch
from tabletune.tuner.workload import byte_token_ids, timing_rows

WORKSPACE_BYTES = 4 << 30  # activations, CUDA graphs' pools, cuBLAS workspace: a margin, not a measurement

METHODS = {"ngram": "ngram", "eagle": "eagle", "eagle3": "eagle", "draft_model": "draft_model",
           "parallel_block": "parallel_block", "dflash": "parallel_block"}
NEEDS_DRAFT_MODEL = ("eagle", "draft_model")  # the engine's drafters with weights of their own
ACCEPTANCE_TOKENS = 256  # room in each slot for prompt + output during measure_acceptance


def validate(spec: EngineSpec) -> None:
    if spec.method not in METHODS:
        raise InputError("--method", "method", spec.method, f"the builtin engine drafts with {sorted(METHODS)}")
    if spec.model not in PRESETS and not (Path(spec.model) / "config.json").exists():
        raise InputError("--model", "model", spec.model, f"not a preset ({sorted(PRESETS)}) nor a HF model folder")
    if spec.k_max < 1:
        raise InputError("--k-max", "k_max", spec.k_max, "must be >= 1")
    if spec.policy:
        resolve_policy(spec.policy.partition(":")[0])
    if METHODS[spec.method] in NEEDS_DRAFT_MODEL and not spec.draft_model and spec.synthetic_acceptance is None:
        raise InputError("--draft-model", "draft_model", None, f"--method {spec.method} needs a trained draft "
                         "(e.g. profiles/drafters/smollm2-135m-eagle), or --synthetic-acceptance to time random weights")


def start(spec: EngineSpec) -> BuiltinEngine:
    validate(spec)
    return BuiltinEngine(spec)


def prompt_token_ids(spec: EngineSpec, texts: Sequence[str]) -> list[list[int]]:
    """The model's token ids of each text: its tokenizer with real weights, bytes (mod vocab) for a shape."""
    folder = _weights_folder(spec.model)
    if folder is None:
        vocab = resolve(spec.model).vocab_size
        return [byte_token_ids(t, vocab) for t in texts]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    return [list(tok(t).input_ids) for t in texts]


def static_same_as_dynamic(spec: EngineSpec) -> str | None:
    """The builtin engine has one mode: a CUDA graph per (bucket, k), whatever the table."""
    return "the builtin engine runs the same graphs with or without a table"


def _weights_folder(model: str) -> str | None:
    if model == "smollm2-135m":
        from tabletune.integrations.hf import smollm2 as assets  # smollm2_model_dir moved out of the core

        return str(assets.smollm2_model_dir())
    return model if Path(model).is_dir() else None


class BuiltinEngine:
    def __init__(self, spec: EngineSpec, free_bytes: int | None = None, memory: DeviceMemory | None = None) -> None:
        """``memory``: the device's (default: the GPU's; ``free_bytes`` gives a fixed size instead, and on the
        CPU without it there is no limit). ``self.free_bytes``: what it has free with no engine built, measured
        once the weights are loaded and again at each release."""
        self.spec = spec
        cuda = torch.cuda.is_available()
        self.device, self.dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
        self.weights = _weights_folder(spec.model)
        cfg = resolve(self.weights or spec.model)
        torch.manual_seed(spec.seed)
        self.target = Decoder(cfg, self.dtype, self.device)
        if self.weights:
            self.target.load_safetensors(self.weights)
        self.method = METHODS[spec.method]
        self.max_batch_size, self.k_max, self.context_len = spec.max_batch_size, spec.k_max, spec.context_len
        self._engine: SpecEngine | None = None  # the timing engine, built on first use (after the acceptance pass)
        self._timing_ids = prompt_token_ids(spec, spec.timing_prompts) if spec.timing_prompts else []
        self._rows_ready = 0
        if memory is None:
            memory = CudaMemory() if self.device == "cuda" and free_bytes is None else FixedMemory(free_bytes)
        self.memory = memory
        self.free_bytes = memory.free_bytes()

    @property
    def engine(self) -> SpecEngine:
        """The timing engine (every bucket, every k) for the current context: ``batch_cap`` slots of
        ``_max_len(context_len)`` tokens, built on first use (after the acceptance pass's own engine and the
        previous context's are released); one engine holds memory at a time."""
        if self._engine is None:
            self._engine = self._build(self._drafter(), max_num_seqs=self.batch_cap(self.context_len).batch_size,
                                       max_len=self._max_len(self.context_len))
        return self._engine

    def _drafter(self):
        head = self.spec.draft_model if self.method == "eagle" else None
        return make_drafter(self.method, self.target, self.spec.k_max, draft_model=self._draft(), head=head)

    def _sequence_bytes(self, max_len: int) -> int:
        """KV bytes of one slot of ``max_len`` tokens: the target's layers, plus the EAGLE head's one layer
        or the draft model's layers (``tabletune.engine.drafters`` give the drafter a cache of the same slots)."""
        cfg, bytes_per = self.target.cfg, torch.finfo(self.dtype).bits // 8
        layers = cfg.num_layers + (1 if self.method == "eagle" else 0)
        out = kv_cache_bytes(layers, cfg.num_kv_heads, cfg.head_dim, bytes_per, 1, max_len)
        if self.method == "draft_model":
            d = self._draft_cfg()
            out += kv_cache_bytes(d.num_layers, d.num_kv_heads, d.head_dim, bytes_per, 1, max_len)
        return out

    def _weights_to_load(self) -> int:
        """Bytes of the draft model (``draft_model`` method) that each timing engine's build loads."""
        if self.method != "draft_model":
            return 0
        return self._draft_cfg().num_params() * (torch.finfo(self.dtype).bits // 8)

    def memory_plan(self, context_len: int, slots: int) -> MemoryPlan:
        """What a timing engine of ``slots`` sequences at ``context_len`` allocates (``tabletune.tuner.budget``)."""
        loaded = sum(t.numel() * t.element_size() for t in (*self.target.parameters(), *self.target.buffers()))
        return MemoryPlan(free_bytes=self.free_bytes or 0, weights_bytes=self._weights_to_load(),
                          kv_bytes=(slots + 1) * self._sequence_bytes(self._max_len(context_len)),
                          workspace_bytes=WORKSPACE_BYTES, already_allocated_bytes=loaded)

    def batch_cap(self, context_len: int) -> BatchCap:
        """The largest batch a timing engine at ``context_len`` holds in ``free_bytes`` (free with no engine
        built): WORKSPACE_BYTES + weights to load + (b + 1 slots) * KV bytes per slot <= free
        (``budget.largest_batch``)."""
        n = self.spec.max_batch_size
        if self.free_bytes is None:
            return BatchCap(context_len, n, n)
        b = largest_batch(self.free_bytes, WORKSPACE_BYTES + self._weights_to_load(),
                          self._sequence_bytes(self._max_len(context_len)), n, extra_slots=1)
        plan = self.memory_plan(context_len, n)
        numbers = (f"{n} sequences of {self._max_len(context_len)} tokens {plan.describe()}" if b < n else "")
        return BatchCap(context_len, b, n, numbers, self.free_bytes)

    def _draft_cfg(self):
        name = self.spec.draft_model
        if name:
            return resolve(_weights_folder(name) or name)
        cfg = self.target.cfg
        return PRESETS["qwen3-0.6b"] if cfg.vocab_size == PRESETS["qwen3-0.6b"].vocab_size else \
            replace(cfg, name=cfg.name + "-draft", num_layers=max(1, cfg.num_layers // 4))

    def _draft(self) -> Decoder | None:
        if self.method != "draft_model":
            return None
        model = Decoder(self._draft_cfg(), self.dtype, self.device, ops=self.target.ops)
        folder = _weights_folder(self.spec.draft_model) if self.spec.draft_model else None
        if folder:
            model.load_safetensors(folder)
        return model

    def _max_len(self, context_len: int) -> int:
        """Tokens per slot for steps from ``context_len`` cached tokens (or prompts of that length)."""
        return max(context_len, ACCEPTANCE_TOKENS) + self.spec.k_max + ACCEPTANCE_TOKENS

    def _build(self, drafter, max_num_seqs: int, max_len: int, ks: tuple[int, ...] = ()) -> SpecEngine:
        cfg = EngineConfig(max_num_seqs=max_num_seqs, max_len=max_len, k_max=self.spec.k_max, ks=ks,
                           buckets=tuple(geometric_batch_sizes(max_num_seqs)), split_steps=bool(self.spec.policy))
        return SpecEngine(self.target, drafter, cfg)

    def set_context_len(self, context_len: int) -> None:
        """Time the next steps from ``context_len`` cached tokens. Another context's timing engine is released
        first (``_release``), so that ``batch_cap`` sizes this context's from the memory free without it; the
        next step builds it."""
        if context_len != self.context_len:
            self._release()
        self.context_len, self._rows_ready = context_len, 0

    # ---- Engine protocol ----------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        model = self.spec.model if self.weights else f"{self.spec.model} (shape, random weights)"
        drafter = self.method + (f":{self.spec.draft_model}" if self.spec.draft_model else "")
        engine = self.engine
        cfg = engine.cfg
        graphs = "cudagraph-per-(bucket,k,tokens)" if engine.graphs else "none"
        # the configured max_num_seqs, not this context's engine (its slots and cache length follow the context)
        buckets = ",".join(map(str, geometric_batch_sizes(self.spec.max_batch_size)))
        knobs = (f"max_num_seqs={self.spec.max_batch_size} k_max={cfg.k_max} buckets={buckets} "
                 f"split_steps={cfg.split_steps} "
                 f"triton={cfg.kernels.use_triton if cfg.kernels.use_triton is not None else self.device == 'cuda'} "
                 f"pdl={cfg.kernels.pdl} split_k={cfg.kernels.split_k}")
        return Fingerprint(engine="builtin", engine_version=ENGINE_VERSION, device=f"{device_name(engine)} x1",
                           model=model, dtype=str(self.dtype).removeprefix("torch."), runner=RUNNER, drafter=drafter,
                           graph_mode=graphs, flags=knobs)

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples:
        fits = self.batch_cap(self.context_len).batch_size
        if not 1 <= batch_size <= fits or not 0 <= k <= self.k_max:
            raise ValueError(f"(b={batch_size}, k={k}) outside 1..{fits} x 0..{self.k_max} "
                             f"at context {self.context_len}")
        if batch_size > self._rows_ready:
            self.engine.set_context(batch_size, self.context_len, seed=self.spec.seed)
            self._write_workload_text(batch_size)
            self._rows_ready = batch_size
        samples = time_steps(self.engine, batch_size, k, num_steps, self.context_len, warmup=1)
        return StepSamples(tuple(samples), tuple([batch_size * (k + 1)] * len(samples)))

    def _write_workload_text(self, num_rows: int) -> None:
        """The timing rows' context: the workload's text in place of ``set_context``'s random tokens."""
        if not self._timing_ids:
            return
        engine, n = self.engine, self.context_len + 1  # positions 0..context_len (the last: the row's last token)
        rows = timing_rows(self._timing_ids, num_rows, n)
        engine.history[:num_rows, :n] = torch.tensor(rows, dtype=engine.history.dtype, device=engine.history.device)
        engine.last_token[:num_rows] = engine.history[:num_rows, self.context_len]

    def measure_acceptance(self, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceCounts:
        self._release()  # its own engine below, alone in memory; the timing rows' state is gone with it
        self._rows_ready = 0
        limit = max(self.context_len, 8)
        ids = [i[-limit:] or [0] for i in prompt_token_ids(self.spec, prompts)]
        max_tokens = min(max_tokens, ACCEPTANCE_TOKENS - 8)
        prompt_len = self._max_len(max(len(i) for i in ids))  # an engine of the prompts' own size
        rates = self.spec.synthetic_acceptance
        if rates:
            # the oracle: the target's greedy path, decoded by the same graphs (every draft rejected by a zero cap),
            # on a small engine of its own (the prompts' batch, k only) in one batch shape (fixed_shape) for both runs
            engine = self._build(ReplayDrafter(), max_num_seqs=len(ids), max_len=prompt_len, ks=(k,))
            base = [Request(p, max_tokens, i) for i, p in enumerate(ids)]
            Scheduler(engine, DraftTable.fixed(k), cap_rates=[0.0] * k, fixed_shape=True).run(base)
            reqs = [Request(p, max_tokens, i, oracle=r.output + [0] * (k + 2)) for i, (p, r) in enumerate(zip(ids, base))]
            counts = Scheduler(engine, self._policy(engine, k), cap_rates=rates, seed=self.spec.seed,
                               fixed_shape=True).run(reqs).counts
            stale = sum(r.oracle_stale for r in reqs)
            if stale:
                print(f"tabletune: synthetic acceptance: {stale}/{len(reqs)} requests left the oracle's path "
                      "(bf16 rounding); their later steps are not counted", flush=True)
        else:
            reqs = [Request(p, max_tokens, i) for i, p in enumerate(ids)]
            engine = self._build(self._drafter(), max_num_seqs=len(ids), max_len=prompt_len)
            counts = Scheduler(engine, self._policy(engine, k)).run(reqs).counts
        del engine  # the last reference: _release collects it
        self._release()
        return AcceptanceCounts(k_max=k, drafter=self.method, num_drafts=counts.num_drafts,
                                reached=counts.reached[:k], accepted=counts.accepted[:k], drafted=counts.drafted[:k])

    def _policy(self, engine: SpecEngine, k: int):
        """``--policy`` on this engine (its prior: the synthetic rates if given), else a fixed k."""
        if not self.spec.policy:
            return DraftTable.fixed(k)
        ctx = policy_context(engine, prior_rates=self.spec.synthetic_acceptance or (), seed=self.spec.seed)
        return make_policy(self.spec.policy, ctx)

    def close(self) -> None:
        self._release()

    def _release(self) -> None:
        """Drop the timing engine (its KV caches, CUDA graphs and their pool) and give back the memory of every
        engine no longer referenced (``DeviceMemory.release``; no caller may still hold one), then measure what
        is free for the next (``batch_cap`` sizes it from that)."""
        self._engine = None
        self.memory.release()
        self.free_bytes = self.memory.free_bytes()
