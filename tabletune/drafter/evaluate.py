"""The held-out table of a trained head (``tabletune drafter eval``): per workload and temperature, acceptance
and tokens a step at one k.

Each row is ``tabletune acceptance --drafter eagle`` (``integrations.hf.measure``): the head replayed along the
target's own continuations of held-out prompts, drafts of ``k_max``; a_j is the censored conditional acceptance
at position j (from the drafts that reached j), and

    tokens/step at k = E[tokens | k] = 1 + sum_{i <= k} prod_{j <= i} a_j      (``goodput.expected_tokens``)

counts the target's bonus token. The continuations are generated on the CPU (cached for SmolLM2-135M) or read
from a training run's ``eval_trajectories.json`` (``train.eval_trajectories``: T0 / T1, by workload).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabletune.acceptance import AcceptanceCounts
from tabletune.errors import InputError
from tabletune.goodput import expected_tokens

EVAL_WORKLOADS = ("code", "chat")


@dataclass(frozen=True)
class HeldOutRow:
    workload: str
    temperature: float
    num_prompts: int
    num_drafts: int
    rates: tuple[float, ...]  # a_1 .. a_k_max; NaN where no draft reached the position
    k: int  # the k of ``tokens_per_step``

    @property
    def a_1(self) -> float:
        return self.rates[0]

    @property
    def tokens_per_step(self) -> float:
        """E[tokens | k], bonus included (module docstring)."""
        return expected_tokens(self.rates, self.k)


def held_out_row(counts: AcceptanceCounts, workload: str, temperature: float, num_prompts: int, k: int) -> HeldOutRow:
    rates = tuple(math.nan if r is None else r for r in counts.rates())
    if not 1 <= k <= len(rates):
        raise InputError("drafter eval", "k", k, f"must be in 1..k_max={len(rates)}")
    return HeldOutRow(workload, temperature, num_prompts, counts.num_drafts, rates, k)


def format_table(rows: Sequence[HeldOutRow], num_rates: int = 4) -> str:
    """Markdown: workload, T, prompts, drafts, a_1 .. a_num_rates, tokens/step at each row's k."""
    if not rows:
        return ""
    n = min(num_rates, min(len(r.rates) for r in rows))
    head = ["workload", "T", "prompts", "drafts"] + [f"a_{j}" for j in range(1, n + 1)]
    lines = ["| " + " | ".join(head + [f"tokens/step, k={rows[0].k}"]) + " |",
             "|---|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [r.workload, f"{r.temperature:g}", str(r.num_prompts), str(r.num_drafts)]
        cells += [f"{a:.3f}" for a in r.rates[:n]] + [f"{r.tokens_per_step:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_trajectories(path: Path, workload: str, temperature: float, limit: int | None):
    """The continuations of ``workload`` at ``temperature`` (0 or 1) from a training run's eval_trajectories.json."""
    from tabletune.integrations.hf.measure import Trajectory

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(str(path), "<file>", str(path), f"cannot read: {exc}") from None
    key = f"T{temperature:g}"
    if workload not in data.get(key, {}):
        raise InputError(str(path), f"{key}.{workload}", None, f"missing: has {sorted(data.get(key, {}))}")
    rows = data[key][workload][:limit]
    return [Trajectory(r["id"], r["prompt"], r["output"][: data.get("max_new_tokens")]) for r in rows]


@dataclass(frozen=True)
class EvalConfig:
    head: str
    workloads: tuple[str, ...] = EVAL_WORKLOADS
    temperatures: tuple[float, ...] = (0.0, 1.0)
    k_max: int = 7
    k: int = 4
    max_prompts: int | None = None
    max_new_tokens: int = 256
    seed: int = 0
    target_dir: str | None = None  # a transformers folder with its tokenizer (default: SmolLM2-135M)
    trajectories: str | None = None  # a training run's eval_trajectories.json instead of generating

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.k_max:
            raise InputError("drafter eval", "k", self.k, f"must be in 1..k_max={self.k_max}")
        if self.trajectories and any(t not in (0.0, 1.0) for t in self.temperatures):
            raise InputError("drafter eval", "temperature", self.temperatures, "trajectories files hold T = 0 and 1")


def evaluate(cfg: EvalConfig, progress=None, command: str = "") -> list[HeldOutRow]:
    """One ``HeldOutRow`` per (workload, temperature); bad input is refused before any model loads."""
    from tabletune.integrations.hf.eagle_head import load_head_state
    from tabletune.integrations.hf.measure import AcceptanceRun, measure

    load_head_state(Path(cfg.head))
    runs = [AcceptanceRun(drafter="eagle", workload=w, temperature=t, k_max=cfg.k_max, num_prompts=cfg.max_prompts,
                          max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, draft_model=cfg.head)
            for w in cfg.workloads for t in cfg.temperatures]
    given = {(r.workload, r.temperature): read_trajectories(Path(cfg.trajectories), r.workload, r.temperature,
                                                            cfg.max_prompts) for r in runs} if cfg.trajectories else {}
    runner = None
    if cfg.target_dir:
        from tabletune.integrations.hf.model import SmolLM2Runner

        runner = SmolLM2Runner(Path(cfg.target_dir))
    rows = []
    for run in runs:
        m = measure(run, progress or (lambda *a: None), command, runner=runner,
                    trajs=given.get((run.workload, run.temperature)))
        rows.append(held_out_row(m.profile.entries[0], run.workload, run.temperature, m.detail["num_prompts"], cfg.k))
    return rows


def split_by_prompt(rows: Sequence[tuple]) -> tuple[list[tuple], list[tuple]]:
    """Trace rows (``replay.TRACE_COLUMNS``, the request first) into a calibration and a scoring half by prompt, by
    the rule the simulator and the engine's replay split traces with (``token_trace.prompt_half``)."""
    from tabletune.token_trace import prompt_half

    halves = {row[0]: prompt_half(str(row[0])) for row in rows}
    return ([row for row in rows if halves[row[0]] == "calibration"],
            [row for row in rows if halves[row[0]] == "scoring"])
