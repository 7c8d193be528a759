"""A tuned table as SGLang's adaptive speculative config (``--speculative-adaptive-config``). Core: no torch.

SGLang serves batch-size-aware adaptive ``speculative_num_steps`` for EAGLE/EAGLE3 with topk 1
(``--speculative-adaptive``; PRs #21599 and #24055; parsed in
``python/sglang/srt/speculative/adaptive_spec_params.py``, routed in ``adaptive_step_router.py``).
Its config file, as that code reads it:

* a JSON object; every key made only of digits is a batch-size lower bound and holds an entry
  ``{"candidate_steps": [s, ...]}``, a non-empty list of integers (>= 1 in the first releases;
  >= 0 in newer code, where step 0 drafts nothing). Other keys of an entry (``ema_alpha``,
  ``update_interval``, ``warmup_batches``, ``up_hysteresis``, ``down_hysteresis``,
  ``ceiling_coeff``) tune its EMA; top-level keys that are not digits are defaults for every entry,
  and ``"strategy"`` is ``"ema"`` (the default) or ``"throughput_aware"``.
* a batch of b requests is first padded up to the smallest CUDA-graph batch size >= b, then uses
  the entry with the largest key <= that size (the smallest key when every key is larger).
* inside an entry an EMA of accepted drafts moves the step among the candidates; with one
  candidate it never moves. ``--speculative-num-steps`` must be one of the candidates (the first
  releases refuse it otherwise) and sizes the drafter.

A table ``[[start, end, k], ...]`` is written as ``{"<start>": {"candidate_steps": [k]}, ...}``: one
candidate per range pins SGLang to the tuned k, and the last range is open-ended as in vLLM. Because
SGLang routes the padded batch size, a range that starts between two CUDA-graph batch sizes takes
effect from the next graph size up (``routed_step`` shows what SGLang will run).
"""

from __future__ import annotations

import bisect

from tabletune.errors import InputError
from tabletune.table import DraftTable

STRATEGY = "ema"
SGLANG_ADAPTIVE_METHODS = ("eagle", "eagle3")  # the methods (``tune --method``) SGLang's adaptive steps serve


def to_sglang(table: DraftTable, min_step: int = 0) -> dict:
    """{"strategy": "ema", "<start_bs>": {"candidate_steps": [k]}, ...}; ``min_step`` = 1 for SGLang releases
    without step 0 (a k below it is raised to it; neighbouring ranges that then hold the same k are joined)."""
    if min_step not in (0, 1):
        raise ValueError(f"min_step must be 0 or 1, got {min_step}")
    dense = [max(min_step, k) for k in table.dense(table.ranges[-1][1])[1:]]
    out: dict = {"strategy": STRATEGY}
    for start, _, k in DraftTable.from_dense(dense).ranges:
        out[str(start)] = {"candidate_steps": [k]}
    return out


def from_sglang(obj: object, source: str = "sglang config") -> DraftTable:
    """The table a pinned config (one candidate per entry) stands for; bad input names the key."""
    if not isinstance(obj, dict):
        raise InputError(source, "<file>", type(obj).__name__, "must be a JSON object")
    starts: list[tuple[int, int]] = []
    for key, entry in obj.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (not isinstance(steps, list) or len(steps) != 1 or not isinstance(steps[0], int)
                or isinstance(steps[0], bool) or steps[0] < 0):
            raise InputError(source, f"{key}.candidate_steps", steps, "a tuned table pins one step >= 0 per range")
        if int(key) < 1:
            raise InputError(source, key, int(key), "batch-size keys must be >= 1")
        starts.append((int(key), steps[0]))
    if not starts:
        raise InputError(source, "<keys>", sorted(obj), "no batch-size key (digits) holds candidate_steps")
    starts.sort()
    if starts[0][0] != 1:  # SGLang gives batches below the first key that key's entry
        starts[0] = (1, starts[0][1])
    ends = [s - 1 for s, _ in starts[1:]] + [max(s for s, _ in starts)]
    return DraftTable.from_ranges([[s, e, k] for (s, k), e in zip(starts, ends)], source=source)


def routed_step(config: dict, batch_size: int, cuda_graph_bs: list[int] | None = None) -> int:
    """The step SGLang runs for ``batch_size`` under a pinned config: pad b up to the smallest CUDA-graph
    batch size >= b (when there is one), then take the entry with the largest key <= it (else the smallest)."""
    if cuda_graph_bs:
        graphs = sorted(cuda_graph_bs)
        i = bisect.bisect_left(graphs, batch_size)
        batch_size = graphs[i] if i < len(graphs) else batch_size
    keys = sorted(int(key) for key in config if key.isdigit())
    key = keys[max(0, bisect.bisect_right(keys, batch_size) - 1)]
    return config[str(key)]["candidate_steps"][0]


def launch_flags(config: dict, path: str) -> str:
    """The ``sglang.launch_server`` flags that serve ``config`` from ``path`` (EAGLE/EAGLE3, topk 1): the
    initial step is the largest candidate, which sizes the drafter, and topk 1 drafts steps + 1 tokens."""
    steps = max(max(e["candidate_steps"]) for key, e in config.items() if key.isdigit())
    steps = max(steps, 1)
    return (f"--speculative-eagle-topk 1 --speculative-num-steps {steps} --speculative-num-draft-tokens {steps + 1} "
            f"--speculative-adaptive --speculative-adaptive-config {path}")
