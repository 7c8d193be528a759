"""The tuner's vLLM engine: one offline, in-process vLLM engine measured many times.

Implements ``tabletune.tuner.Engine`` on vLLM's own serving path:

* one ``vllm.LLM`` for the whole run, started with a table that uses every k in
  0..k_max (dynamic-SD mode, as a tuned deployment runs);
* k is forced by replacing ``Scheduler.dynamic_sd_lookup`` with [k] * (max_num_seqs + 1);
  the scheduler reads it at the next ``schedule()``;
* exactly b requests decode (ignore_eos, long outputs, greedy), each carrying its own prompt
  of the workload (``EngineSpec.timing_prompts``; ``timing_requests`` says how), so n-gram
  drafting searches real text, its steps averaging ``context_len`` tokens of context; the
  n-gram proposer's drafts are padded to k after its search, so every row verifies k tokens.
  Without timing prompts: b identical requests on a repetitive token-id prompt
  (n-gram drafting then matches at once);
* steps are timed by hooks on the engine core's step (``step_hooks``); steps
  with a prefill, with another batch size, and the first ``WARMUP_STEPS`` after
  a change of k or batch (their drafts were sized by the previous k) are not timed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from tabletune.acceptance import AcceptanceCounts
from tabletune.cost import MixedStep
from tabletune.integrations.vllm import engine_args, presets, versions
from tabletune.integrations.vllm.step_hooks import StepRecorder
from tabletune.integrations.vllm.timing_requests import full_drafts, kv_batch_cap, model_token_ids, timing_window
from tabletune.errors import InputError
from tabletune.prefill import PrefillCost
from tabletune.profile import Fingerprint
from tabletune.tuner import EngineSpec, StepSamples
from tabletune.tuner.budget import BatchCap
from tabletune.tuner.workload import timing_rows

WARMUP_STEPS = 1  # the first step after a change verifies drafts sized by the old k
PATTERN = (5, 6, 7, 8, 9, 10, 11)  # the repeated prompt tokens (valid in every vocabulary)


def validate(spec: EngineSpec) -> None:
    """Bad input fails here, before vLLM starts."""
    presets.check_model(spec.model)
    presets.check_method(spec.method, spec.k_max, spec.draft_model)
    if spec.engine_args:
        engine_args.parse(spec.model, spec.engine_args)


def prompt_token_ids(spec: EngineSpec, texts) -> list[list[int]]:
    """The model's token ids of each text, without starting vLLM (the CLI sizes the grid's context from them)."""
    preset = presets.resolve_model(spec.model, spec.engine_args)
    try:
        return model_token_ids(preset.path, preset.skip_tokenizer_init, texts)
    except (OSError, ValueError) as exc:
        raise InputError("--model", "model", spec.model, f"cannot load its tokenizer to size the context from the "
                         f"prompts ({exc.__class__.__name__}): give --context-len") from None


def start(spec: EngineSpec) -> VllmEngine:
    validate(spec)
    return VllmEngine(spec)


def static_same_as_dynamic(spec: EngineSpec) -> str | None:
    """Why timing the static mode would measure nothing new here (None: it may differ, measure it)."""
    if engine_args.on_cpu():
        return "on CPU vLLM captures no CUDA graphs, so the table mechanism changes no graph mode"
    return None


def start_static(spec: EngineSpec, k: int, memory=None):
    """An engine with fixed ``num_speculative_tokens = k`` and no table (k = 0: no speculation), in a child
    process (``static_engine``); call after the tuning engine closed. On a GPU it asks for at most the memory
    free now (``fit_memory_flags``; ``memory()`` -> (free, total) bytes, default the CUDA device's)."""
    import dataclasses

    from tabletune.integrations.vllm.static_engine import StaticEngine, fit_memory_flags

    got = (memory or cuda_memory)()
    if got is not None:
        flags = fit_memory_flags(spec.engine_args, *got)
        if flags != spec.engine_args:
            print(f"static check: {got[0] / 2**30:.1f} of {got[1] / 2**30:.1f} GiB free, so the static engine "
                  f"runs with {' '.join(flags[-2:])}", file=sys.stderr)
            spec = dataclasses.replace(spec, engine_args=flags)
    return StaticEngine(spec, k)


def cuda_memory() -> tuple[int, int] | None:
    """(free, total) bytes of the current CUDA device; None without one."""
    if engine_args.on_cpu():
        return None
    import torch

    free, total = torch.cuda.mem_get_info()
    return free, total


class VllmEngine:
    """``tabletune.tuner.Engine`` over an in-process ``vllm.LLM``."""

    def __init__(self, spec: EngineSpec, static_k: int | None = None, **llm_kwargs) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core must live in this process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; ~40k tokens of the tiny model
        self.spec = spec
        self.preset = presets.resolve_model(spec.model, spec.engine_args)
        self.k_max = spec.k_max
        self.max_batch_size = spec.max_batch_size
        self.context_len = spec.context_len  # measured: mean context of the timed steps
        self.context_target, self.refresh_tokens = timing_window(spec.context_len)  # timing requests' prompt tokens
        import vllm
        from vllm import LLM, SamplingParams

        warning = versions.check(vllm.__version__)
        if warning:
            versions.logger.warning("tabletune: %s", warning)
        self._sampling_params = SamplingParams
        self.static_k = static_k
        if static_k is None:
            config = presets.speculative_config(spec.method, spec.k_max, spec.draft_model,
                                                presets.all_k_ranges(spec.k_max, spec.max_batch_size))
        else:  # the table mechanism off: vLLM's static mode
            config = presets.speculative_config(spec.method, max(static_k, 1), spec.draft_model, [])
            del config["num_speculative_tokens_per_batch_size"]
        if spec.synthetic_acceptance:
            forced, use_cap = versions.forced_acceptance(spec.synthetic_acceptance, config["num_speculative_tokens"],
                                                         engine_args.on_cpu())
            config.update(forced)
            if use_cap:
                from tabletune.integrations.vllm import acceptance_cap

                acceptance_cap.set_rates(spec.synthetic_acceptance)
            if static_k is None:
                how = "the acceptance cap" if use_cap else "vLLM's synthetic sampler"
                print(f"acceptance forced by {how}: conditional rates {list(spec.synthetic_acceptance)}",
                      file=sys.stderr)
        args = engine_args.build(self.preset.path, spec.engine_args, max_num_seqs=spec.max_batch_size,
                                 seed=spec.seed, speculative_config=config,
                                 dummy_weights=self.preset.load_format == "dummy")
        if static_k == 0:
            args.speculative_config = None
        for name, value in llm_kwargs.items():
            setattr(args, name, value)
        self.llm = LLM.from_engine_args(args)
        self.max_model_len = self.llm.llm_engine.vllm_config.model_config.max_model_len
        self.core = self.llm.llm_engine.engine_core.engine_core
        self.scheduler = self.core.scheduler
        self.recorder = StepRecorder(self.core)
        self.full_drafts = full_drafts(self.core, spec.method) if spec.timing_prompts else None
        self._timing_ids = [self._token_ids(t) for t in spec.timing_prompts]
        self._batch: list[str] = []
        self._mixed: list[MixedStep] = []
        self._generated = 0
        self._next_id = 0
        self._context_sum = 0.0
        self._context_n = 0
        try:
            self.set_context_len(spec.context_len)
        except InputError:
            self.close()
            raise

    # ---- Engine protocol ----------------------------------------------------

    def fingerprint(self) -> Fingerprint:
        import vllm

        cfg = self.llm.llm_engine.vllm_config
        comp = cfg.compilation_config
        v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0") not in ("", "0")
        runner = f"{'v2' if v2 else 'v1'}/{'eager' if cfg.model_config.enforce_eager else f'compile-mode-{int(comp.mode)}'}"
        mode = getattr(comp, "cudagraph_mode", None)
        drafter = self.spec.method + (f":{os.path.basename(self.spec.draft_model)}" if self.spec.draft_model else "")
        return Fingerprint(engine="vllm", engine_version=vllm.__version__, device=engine_args.device_name(),
                           model=self.preset.name, dtype=str(cfg.model_config.dtype).removeprefix("torch."),
                           tp_size=cfg.parallel_config.tensor_parallel_size,
                           pp_size=cfg.parallel_config.pipeline_parallel_size, runner=runner, drafter=drafter,
                           graph_mode=getattr(mode, "name", str(mode)), flags=engine_args.flags_text(self.spec.engine_args))

    def measure_step(self, batch_size: int, k: int, num_steps: int) -> StepSamples:
        if not 1 <= batch_size <= self.max_batch_size or not 0 <= k <= self.k_max:
            raise ValueError(f"(b={batch_size}, k={k}) outside 1..{self.max_batch_size} x 0..{self.k_max}")
        self.force_k(k)
        if self.full_drafts is not None:
            self.full_drafts.on = True
        try:
            kept = self._timed_steps(batch_size, k, num_steps)
        finally:
            if self.full_drafts is not None:
                self.full_drafts.on = False
        self.context_len = round(self._context_sum / max(self._context_n, 1))
        return StepSamples(tuple(ms for ms, _ in kept), tuple(t for _, t in kept))

    def _timed_steps(self, batch_size: int, k: int, num_steps: int) -> list[tuple[float, int]]:
        full: list[tuple[float, int]] = []
        short: list[tuple[float, int]] = []
        for attempt in range(2):
            if attempt:  # the drafter stopped proposing k tokens (the text left the pattern): a fresh batch
                self.stop_batch()
            self._ensure_batch(batch_size, k)
            self._steps(WARMUP_STEPS)
            for _ in range(4 * num_steps):
                for r in self._steps(1, record=True):
                    if r.has_prefill or r.num_reqs != batch_size:
                        continue
                    bucket = full if r.scheduled_tokens == batch_size * (k + 1) else short
                    bucket.append((r.step_ms, r.scheduled_tokens))
                if len(full) >= num_steps:
                    break
            if full:
                break
        return full or short  # short drafts only when even a fresh batch never proposed k tokens

    def measure_acceptance(self, prompts: Sequence[str], k: int, max_tokens: int) -> AcceptanceCounts:
        self.stop_batch()
        self.force_k(k)
        counts = AcceptanceCounts(k_max=k, drafter=self.spec.method)
        params = self._sampling_params(max_tokens=max_tokens, temperature=0.0,
                                       ignore_eos=self.preset.skip_tokenizer_init)
        inputs = [self._prompt_input(p) for p in prompts]
        rec = self.recorder
        rec.counts, rec.recording = counts, True
        rec.records.clear()
        try:
            self.llm.generate(inputs, params, use_tqdm=False)
        finally:
            rec.counts, rec.recording = None, False
        self._mixed = [MixedStep(r.num_reqs, max(r.drafts_per_req), sum(r.drafts_per_req) / r.num_reqs, r.step_ms)
                       for r in rec.records if not r.has_prefill and r.num_reqs and r.drafts_per_req]
        rec.records.clear()
        return counts

    def measure_prefill(self, prompts: Sequence[str]) -> PrefillCost:
        """The workload's prefill cost: each prompt at its real length, prefilled alone (``prefill_probe``)."""
        from tabletune.integrations.vllm.prefill_probe import measure_prefill

        self.stop_batch()
        if self.static_k is None:
            self.force_k(0)
        inputs = [self._prompt_input(p) for p in prompts]
        return measure_prefill(self.llm, inputs, [len(i["prompt_token_ids"]) if isinstance(i, dict)
                                                   else len(self._token_ids(i)) for i in inputs])

    def take_mixed_steps(self) -> list[MixedStep]:
        """The decode steps of the last ``measure_acceptance``: real text, rows drafting what matched."""
        steps, self._mixed = self._mixed, []
        return steps

    def close(self) -> None:
        """Shut the engine down and drop it, so that its GPU memory is free for the static-mode engine."""
        if getattr(self, "llm", None) is None:
            return
        self.stop_batch()
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = self.core = self.scheduler = self.recorder = None
        import gc

        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass

    # ---- helpers ------------------------------------------------------------

    def set_context_len(self, context_len: int) -> None:
        """Time the next steps at a mean context of ``context_len`` tokens (a fresh batch; ``timing_window``)."""
        prompt, refresh = timing_window(context_len)
        if prompt + refresh + 8 * (self.k_max + 1) + 64 > self.max_model_len:
            raise InputError("--context-len", "context_len", context_len,
                             f"timing requests of {prompt} prompt + {refresh + 8 * (self.k_max + 1) + 64} decode "
                             f"tokens exceed vLLM's max_model_len={self.max_model_len}")
        self.stop_batch()
        self.context_len = context_len
        self.context_target, self.refresh_tokens = prompt, refresh
        self._context_sum, self._context_n = 0.0, 0

    def batch_cap(self, context_len: int) -> BatchCap:
        """The largest batch vLLM's KV cache holds at ``context_len`` (``kv_batch_cap``): the requests share
        one cached prompt only when they carry the filler prompt and prefix caching is on."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        prompt, refresh = timing_window(context_len)
        shared = bool(getattr(cache, "enable_prefix_caching", False)) and not self._timing_ids
        return kv_batch_cap(getattr(cache, "kv_cache_size_tokens", None), self.max_batch_size, self.k_max,
                            context_len, prompt, refresh, cache.block_size or 16, shared)

    def force_k(self, k: int) -> None:
        """Every batch size drafts k from the next ``schedule()`` on."""
        if self.static_k is not None:
            if k != self.static_k:
                raise ValueError(f"a static engine drafts k={self.static_k} only, not {k}")
            return
        self.scheduler.dynamic_sd_lookup = [k] * (self.scheduler.scheduler_config.max_num_seqs + 1)

    def _prompt_input(self, text: str) -> dict | str:
        if not self.preset.skip_tokenizer_init:
            return text
        # No tokenizer (dummy weights): the text has no meaning to the model. Use the repetitive
        # pattern, rotated by the prompt, so n-gram drafting matches and the cap sets acceptance.
        shift = sum(text.encode()) % len(PATTERN)
        return {"prompt_token_ids": [PATTERN[(i + shift) % len(PATTERN)] for i in range(self.context_target)]}

    def _token_ids(self, text: str) -> list[int]:
        """Token ids of a timing prompt: vLLM's own tokenizer, or the text's bytes without one."""
        if self.preset.skip_tokenizer_init:
            return model_token_ids(self.preset.path, True, [text])[0]
        return list(self.llm.get_tokenizer().encode(text))

    def _timing_prompts(self, batch_size: int) -> list[dict]:
        """One prompt per timing request: the workload's own text (a fresh one each batch), else the filler."""
        if not self._timing_ids:
            return [{"prompt_token_ids": [PATTERN[i % len(PATTERN)] for i in range(self.context_target)]}] * batch_size
        rows = timing_rows(self._timing_ids, batch_size, self.context_target, offset=self._next_id)
        return [{"prompt_token_ids": row} for row in rows]

    def _ensure_batch(self, batch_size: int, k: int) -> None:
        if len(self._batch) == batch_size and self._generated + 8 * (k + 1) < self.refresh_tokens:
            return
        self.stop_batch()
        from vllm.sampling_params import RequestOutputKind

        params = self._sampling_params(max_tokens=self.max_model_len - self.context_target - 64,
                                       temperature=0.0, ignore_eos=True, detokenize=False,
                                       output_kind=RequestOutputKind.DELTA)
        for prompt in self._timing_prompts(batch_size):
            req_id = f"tt-{self._next_id}"
            self._next_id += 1
            self.llm.llm_engine.add_request(req_id, prompt, params)
            self._batch.append(req_id)
        for _ in range(64):  # until one step runs the whole batch without prefill
            recs = self._steps(1, record=True)
            if recs and not recs[-1].has_prefill and recs[-1].num_reqs == batch_size:
                break

    def stop_batch(self) -> None:
        """Abort the timing requests (call before using ``self.llm`` directly)."""
        if self._batch:
            self.llm.llm_engine.abort_request(self._batch)
            self._batch = []
        self._generated = 0

    def _steps(self, n: int, record: bool = False) -> list:
        rec = self.recorder
        rec.records.clear()
        rec.recording = True
        for _ in range(n):
            for out in self.llm.llm_engine.step():
                if self._batch and out.request_id == self._batch[0]:
                    self._generated += len(out.outputs[0].token_ids)
        rec.recording = False
        if self._batch:
            self._context_sum += self.context_target + self._generated
            self._context_n += 1
        return list(rec.records) if record else []


def speculative_config(spec: EngineSpec, ranges: list[list[int]]) -> dict:
    """The whole ``--speculative-config`` for the tuned table; a dummy draft preset keeps its name (its folder
    is a cache path of the machine that tuned)."""
    config = presets.speculative_config(spec.method, spec.k_max, spec.draft_model, ranges)
    if spec.draft_model in presets.DUMMY_CONFIGS:
        config["model"] = spec.draft_model
    return config


def serve_static(arg: str) -> None:
    """The child process of ``static_engine.StaticEngine``: a static-mode engine answering JSON lines."""
    import dataclasses
    import json

    from tabletune.integrations.vllm.static_engine import REPLY_PREFIX

    cfg = json.loads(arg)
    spec = cfg["spec"]
    spec = EngineSpec(**{**spec, "engine_args": tuple(spec["engine_args"]),
                         "synthetic_acceptance": tuple(spec["synthetic_acceptance"] or ()) or None,
                         "timing_prompts": tuple(spec.get("timing_prompts", ()))})
    engine = VllmEngine(spec, static_k=cfg["k"])
    reply = lambda obj: print(REPLY_PREFIX + json.dumps(obj), flush=True)  # noqa: E731
    reply({"started": True})
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "close":
            engine.close()
            reply({"closed": True})
            return
        if req["op"] == "context":
            engine.set_context_len(req["n"])
            reply({})
        elif req["op"] == "fingerprint":
            reply(dataclasses.asdict(engine.fingerprint()))
        elif req["op"] == "cap":
            reply(dataclasses.asdict(engine.batch_cap(req["n"])))
        else:
            got = engine.measure_step(req["b"], req["k"], req["n"])
            reply({"samples_ms": list(got.samples_ms), "scheduled_tokens": list(got.scheduled_tokens)})


if __name__ == "__main__":
    serve_static(sys.argv[1])
