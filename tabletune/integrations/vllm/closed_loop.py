"""Closed-loop serving on an in-process vLLM engine: keep ``load`` requests open.

Each request gets its own output length, drawn once from a seeded generator in
[0.5, 1.5] x ``mean_tokens``, so requests finish at different steps and the
batch stays near ``load``. When one finishes, the next prompt (cyclically) takes
its place. Tokens are counted from ``RequestOutputKind.DELTA`` outputs, so the
throughput counts exactly the tokens the engine emitted. This is the engine-core
loop ``vllm serve`` runs, driven from the same thread (no HTTP).

Besides wall time, ``LoopResult.cpu_s`` is this process's CPU time over the run: on a
shared machine, with the engine in-process and one OpenMP thread
(``VLLM_CPU_OMP_THREADS_BIND`` = one core), it measures the engine's own work whatever
else runs, while wall time does not.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LoopResult:
    steps: int
    wall_s: float
    output_tokens: int
    finished: int
    cpu_s: float = 0.0

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def throughput_cpu_tok_s(self) -> float:
        """Output tokens per second of engine CPU time."""
        return self.output_tokens / self.cpu_s if self.cpu_s > 0 else 0.0


class ClosedLoop:
    """``load`` open requests on ``llm`` (a ``vllm.LLM``); ``run(n)`` steps the engine n times."""

    def __init__(self, llm, prompts: Sequence[dict | str], load: int, mean_tokens: int = 256,
                 seed: int = 0, temperature: float = 0.0) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if load < 1 or not prompts:
            raise ValueError(f"need load >= 1 and prompts, got load={load}, {len(prompts)} prompts")
        self.engine = llm.llm_engine
        self.prompts = list(prompts)
        self.load = load
        self.rng = random.Random(seed)
        self.mean_tokens = mean_tokens
        self._params = lambda n: SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True,
                                                detokenize=False, output_kind=RequestOutputKind.DELTA)
        self.open: set[str] = set()
        self.next_id = 0
        self.outputs: dict[str, list[int]] = {}  # filled only when keep_outputs
        self.keep_outputs = False

    def _add(self) -> None:
        n = max(1, round(self.mean_tokens * self.rng.uniform(0.5, 1.5)))
        req_id = f"cl-{self.next_id}"
        prompt = self.prompts[self.next_id % len(self.prompts)]
        self.next_id += 1
        self.engine.add_request(req_id, prompt, self._params(n))
        self.open.add(req_id)

    def run(self, num_steps: int, on_step: Callable[[int], None] | None = None) -> LoopResult:
        """Step the engine ``num_steps`` times, refilling to ``load`` open requests before each."""
        tokens = finished = 0
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(num_steps):
            while len(self.open) < self.load:
                self._add()
            for out in self.engine.step():
                new = out.outputs[0].token_ids
                tokens += len(new)
                if self.keep_outputs:
                    self.outputs.setdefault(out.request_id, []).extend(new)
                if out.finished:
                    self.open.discard(out.request_id)
                    finished += 1
            if on_step is not None:
                on_step(i)
        return LoopResult(num_steps, time.perf_counter() - t0, tokens, finished, time.process_time() - c0)

    def close(self) -> None:
        """Abort what is still open."""
        if self.open:
            self.engine.abort_request(sorted(self.open))
            self.open.clear()


def generate_greedy(llm, prompts: Sequence[dict | str], max_tokens: int) -> list[list[int]]:
    """Greedy token ids per prompt with ignore_eos (for losslessness checks)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    return [list(o.outputs[0].token_ids) for o in llm.generate(list(prompts), params, use_tqdm=False)]
