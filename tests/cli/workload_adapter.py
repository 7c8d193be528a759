"""A tuner adapter whose step cost grows with the context and with the n-gram proposer's search.

A step of b rows (each row: its context's token ids) drafting k costs

    T = 10 + VERIFY_MS * b * (k + 1) * mean context + [k > 0] * SEARCH_MS * sum over rows of scan(row)   (ms)

``scan(row)``: the positions an n-gram search walks back from the row's end before it meets an
earlier occurrence of the row's last ``NGRAM`` tokens (the whole row when there is none): 7 on the
repetitive filler, about the row's length on text that does not repeat.

The engine times rows laid out by ``timing_rows`` from ``spec.timing_prompts`` (the UTF-8 bytes of
each prompt are its tokens) at ``spec.context_len``; without timing prompts, the repetitive filler.
``served_step_ms`` costs a served step with the same model: b requests of the workload, each its own
prompt followed by ``output_tokens // 2`` generated tokens (the middle of its decode).
Acceptance: 100 drafts of k accepting 0/1/2/3 tokens 10/18/22/50 times (rates 0.9, 0.8, 50/72).
"""

from __future__ import annotations

from collections.abc import Sequence

from tabletune.acceptance import AcceptanceCounts
from tabletune.errors import InputError
from tabletune.profile import Fingerprint
from tabletune.tuner import EngineSpec, StepSamples
from tabletune.tuner.workload import timing_rows

VERIFY_MS = 0.0005  # per verified token per token of context
SEARCH_MS = 0.001  # per position the proposer scans
NGRAM = 3
FILLER = (5, 6, 7, 8, 9, 10, 11)


def scan(row: Sequence[int]) -> int:
    """Positions walked back from the end before an earlier occurrence of the last NGRAM tokens."""
    tail = list(row[-NGRAM:])
    for back in range(1, len(row) - NGRAM + 1):
        start = len(row) - NGRAM - back
        if list(row[start:start + NGRAM]) == tail:
            return back
    return len(row)


def step_ms(rows: Sequence[Sequence[int]], k: int) -> float:
    b = len(rows)
    context = sum(len(r) for r in rows) / b
    search = SEARCH_MS * sum(scan(r) for r in rows) if k > 0 else 0.0
    return 10.0 + VERIFY_MS * b * (k + 1) * context + search


def served_step_ms(prompts: Sequence[str], output_tokens: int, b: int, k: int) -> float:
    """A served step: b requests (prompts cyclically), each at its prompt + output_tokens // 2 tokens."""
    ids = [list(p.encode()) for p in prompts]
    rows = [ids[i % len(ids)] + ids[(i + 1) % len(ids)][:output_tokens // 2] for i in range(b)]
    return step_ms(rows, k)


class WorkloadEngine:
    def __init__(self, spec: EngineSpec) -> None:
        self.max_batch_size, self.k_max, self.context_len = spec.max_batch_size, spec.k_max, spec.context_len
        self.ids = [list(p.encode()) for p in spec.timing_prompts]

    def set_context_len(self, context_len: int) -> None:
        self.context_len = context_len

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(engine="fake-workload", model="m")

    def measure_step(self, batch_size, k, num_steps):
        if self.ids:
            rows = timing_rows(self.ids, batch_size, self.context_len)
        else:
            rows = [[FILLER[i % len(FILLER)] for i in range(self.context_len)]] * batch_size
        return StepSamples((step_ms(rows, k),) * num_steps)

    def measure_acceptance(self, prompts, k, max_tokens):
        counts = AcceptanceCounts(k_max=k)
        for m, n in ((0, 10), (1, 18), (2, 22), (3, 50)):
            for _ in range(n):
                counts.observe_draft(k, min(m, k))
        return counts

    def close(self) -> None:
        pass


def validate(spec: EngineSpec) -> None:
    if spec.model != "fake":
        raise InputError("--model", "model", spec.model, "the workload adapter runs model 'fake' only")


def start(spec: EngineSpec) -> WorkloadEngine:
    validate(spec)
    return WorkloadEngine(spec)
