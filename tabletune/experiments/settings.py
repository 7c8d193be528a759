"""The paper's drafter settings, each a measured step profile paired with a measured acceptance profile.

Every setting names two committed files and nothing else decides its numbers:

* the step profile T(b, k): the built-in engine on one H200 (``profiles/h200/``, random bf16 weights of
  the named shape, the whole speculative step timed, the drafter's cost included);
* the acceptance: SmolLM2-135M's measured per-position rates (``profiles/acceptance/``), from the
  trained EAGLE head, the layer-12 early exit, or n-gram prompt lookup, on the named prompt set at
  temperature 0. For n-gram, the per-token trace (``profiles/traces/``) is replayed in the simulator:
  which request-steps find a match (the draft rate q) and what is accepted given the match.

The acceptance comes from a 135M model while the step times come from 8B-30B shapes: the pairing is a
stated stand-in (no 8B drafter's acceptance was measured here), and two pairings have no drafter of
their own kind measured: the separate draft model uses the early-exit acceptance (a smaller model's
proposals) and the parallel block uses the trained head's on code.

A mixed step (rows drafting different lengths, and n-gram rows without a match) is costed by the
draft-share rule of ``tabletune.cost`` with f = ``Lab.draft_share``: the share fitted to the engine's
timed mixed steps when ``benchmarks/results/engine_policies.json`` holds them, else 1, the rule of the
engine's code (a step runs the graph of max k_i with every row padded to it, ``engine/runner.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tabletune.acceptance import AcceptanceProfile
from tabletune.policies.base import MODEL, NGRAM
from tabletune.profile import StepProfile
from tabletune.sim.workload import Workload


@dataclass(frozen=True)
class Setting:
    name: str
    description: str
    profile: str  # step profile, relative to the profiles folder
    acceptance: str  # acceptance profile, relative to the profiles folder
    default_drafter: int = MODEL
    ngram_trace: str | None = None  # n-gram per-token trace replayed by the simulator

    def step_profile(self, root: Path) -> StepProfile:
        return StepProfile.load(root / self.profile)

    def workload(self, root: Path) -> Workload:
        """The simulator's workload: the measured rates (conditional, over the drafts made)."""
        entry = AcceptanceProfile.load(root / self.acceptance).select()
        rates = tuple(max(float(r), 1e-3) for r in entry.known_rates())
        return Workload(f"{self.name} ({entry.workload})", rates, prompt_len_mean=512.0, output_len_mean=256.0)


def _s(name: str, description: str, profile: str, acceptance: str, **kw) -> Setting:
    return Setting(name, description, f"h200/{profile}", f"acceptance/{acceptance}", **kw)


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    _s("eagle", "8B, EAGLE-style head; trained head on MT-Bench chat", "qwen3-8b_eagle_ctx1024.json",
       "eagle_chat_T0.json"),
    _s("draft-model", "8B, 0.6B-shape draft model; early-exit acceptance on chat", "qwen3-8b_draft-model_ctx1024.json",
       "early-exit_chat_T0.json"),
    _s("parallel-block", "8B, parallel block (DFlash-like); trained head on HumanEval",
       "qwen3-8b_parallel-block_ctx1024.json", "eagle_code_T0.json"),
    _s("ngram-code-edit", "8B, n-gram prompt lookup; code edits (trace replayed)", "qwen3-8b_ngram_ctx1024.json",
       "ngram_code-edit_T0.json", default_drafter=NGRAM, ngram_trace="traces/ngram_code-edit_T0.csv.gz"),
    _s("32b", "32B, EAGLE-style head; trained head on chat", "qwen3-32b_eagle_ctx1024.json", "eagle_chat_T0.json"),
    _s("moe", "30B-A3B MoE, EAGLE-style head; trained head on chat", "qwen3-30b-a3b_eagle_ctx1024.json",
       "eagle_chat_T0.json"),
)}

#: The settings of Table 1, in order.
TABLE1 = ("eagle", "draft-model", "parallel-block", "ngram-code-edit", "32b", "moe")

# Fig 4b: the EAGLE-style head on code (HumanEval), then on chat (MT-Bench): the workload switch, on the 8B
# and on the MoE step profile.
SETTINGS["eagle-code"] = dataclasses.replace(SETTINGS["eagle"], name="eagle-code", acceptance="acceptance/eagle_code_T0.json",
                                             description="8B, EAGLE-style head; trained head on HumanEval")
SETTINGS["eagle-chat"] = dataclasses.replace(SETTINGS["eagle"], name="eagle-chat")
SETTINGS["moe-code"] = dataclasses.replace(SETTINGS["moe"], name="moe-code", acceptance="acceptance/eagle_code_T0.json",
                                           description="30B-A3B MoE, EAGLE-style head; trained head on HumanEval")
SETTINGS["moe-chat"] = dataclasses.replace(SETTINGS["moe"], name="moe-chat")
