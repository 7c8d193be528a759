"""The five drafter settings of Table 1, derived from one measured EAGLE-like step-time profile.

The starter profiles measure T_e(b, k) = V(b, k) + k * d_e(b): target verification of
k + 1 tokens per sequence, plus k steps of an EAGLE-like drafter (one decoder layer and
the LM head). We split them with the stated assumption d_e(b) = 0.04 * T_e(b, 0) (an
EAGLE head costs ~4% of a target forward), so V(b, k) = T_e(b, k) - 0.04 k T_e(b, 0),
and price the other drafters on top of V:

* ``eagle``: T_e as measured; rates EAGLE-3-like on general text.
* ``draft-model``: a separate small model (0.6B-for-8B-like), d(b) = 0.12 * T_e(b, 0) per
  draft step (a small model's forward is launch- and bandwidth-bound); acceptance holds
  up deeper in the draft.
* ``ngram-code-edit``: prompt-lookup drafting on the CPU, d = 0 (T = V); the code-edit
  workload (long copyable spans, ``tabletune.sim.ngram``); requests without a match
  verify nothing.
* ``parallel-block``: DFlash-like, all k tokens drafted in one parallel pass costing
  0.15 * T_e(b, 0) whatever k (> 0); high acceptance.
* ``weak-drafter``: the target quantised to 4 bits as drafter: d(b) = 0.3 * T_e(1, 0) +
  0.6 * (T_e(b, 0) - T_e(1, 0)) (4 bits cut the weight reads, not the compute that grows
  with b); very high acceptance, expensive drafts.

Mixed lengths (per-request policies) are costed by the split rule of ``tabletune.cost``
with each setting's own drafting time D(b, k) = draft_ms(b, k) (0 for n-gram): the step
pays the drafter for the longest chain and the target per verified token.
``draft_share`` is the older one-constant rule, kept for comparison (``Lab(cost_rule="share")``).

The rates are stated assumptions until measured acceptance profiles exist under
``profiles/acceptance/``; ``prior`` rates come from an offline calibration run
(``tabletune.experiments.runner.measure_rates``), as the tuner would measure them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from tabletune.cost import StepCost
from tabletune.policies.base import MODEL, NGRAM
from tabletune.profile import StepPoint, StepProfile
from tabletune.sim.workload import PRESETS, Workload

EAGLE_DRAFT_SHARE = 0.04

GENERAL = Workload("general", (0.80, 0.75, 0.70, 0.65, 0.60, 0.55, 0.50))


@dataclass(frozen=True)
class Setting:
    name: str
    description: str
    workload: Workload
    draft_ms: Callable[[StepProfile, int, int], float]  # extra drafting cost d(b, k) on top of V(b, k)
    default_drafter: int = MODEL
    draft_share: float = 0.5  # the one-constant mixed-length rule (0 for CPU / one-pass drafting)

    def profile(self, eagle: StepProfile) -> StepProfile:
        """T(b, k) = V(b, k) + draft_ms(b, k), with V from the EAGLE-like profile (module docstring)."""
        points = []
        for p in eagle.points:
            t0 = eagle.step_ms(p.batch_size, 0)
            v = p.median_ms - EAGLE_DRAFT_SHARE * p.k * t0
            points.append(StepPoint(p.batch_size, p.k, (max(v + self.draft_ms(eagle, p.batch_size, p.k), 1e-3),)))
        fp = dataclasses.replace(eagle.fingerprint, drafter=self.name,
                                 command=f"derived from {eagle.source} ({self.name}, tabletune.experiments.settings)")
        return StepProfile(points=tuple(points), context_len=eagle.context_len, fingerprint=fp, source=eagle.source)

    def cost(self, eagle: StepProfile, rule: str = "split") -> StepCost:
        """The step cost: ``split`` (drafting D = draft_ms for the longest chain) or ``share`` (draft_share)."""
        if rule == "split":
            return StepCost.split(self.profile(eagle), lambda b, k: self.draft_ms(eagle, b, k))
        if rule == "share":
            return StepCost(self.profile(eagle), self.draft_share)
        raise ValueError(f"cost rule must be 'split' or 'share', got {rule!r}")


def _eagle(p: StepProfile, b: int, k: int) -> float:
    return EAGLE_DRAFT_SHARE * k * p.step_ms(b, 0)


def _draft_model(p: StepProfile, b: int, k: int) -> float:
    return 0.12 * k * p.step_ms(b, 0)


def _ngram(p: StepProfile, b: int, k: int) -> float:
    return 0.0


def _parallel_block(p: StepProfile, b: int, k: int) -> float:
    return 0.15 * p.step_ms(b, 0) if k > 0 else 0.0


def _weak(p: StepProfile, b: int, k: int) -> float:
    t1 = p.step_ms(1, 0)
    return k * (0.3 * t1 + 0.6 * (p.step_ms(b, 0) - t1))


SETTINGS: dict[str, Setting] = {
    s.name: s for s in (
        Setting("eagle", "EAGLE-like (one-layer head), general text", GENERAL, _eagle),
        Setting("draft-model", "separate small draft model", GENERAL.with_rates(
            (0.76, 0.74, 0.72, 0.70, 0.68, 0.66, 0.64)), _draft_model),
        Setting("ngram-code-edit", "n-gram (prompt lookup) on code edits",
                dataclasses.replace(PRESETS["code-edit"], name="code-edit"), _ngram, NGRAM, 0.0),
        Setting("parallel-block", "parallel-block drafter (DFlash-like)", GENERAL.with_rates(
            (0.86, 0.83, 0.80, 0.78, 0.76, 0.74, 0.72)), _parallel_block, MODEL, 0.0),
        Setting("weak-drafter", "4-bit copy of the target as drafter", GENERAL.with_rates(
            (0.92, 0.90, 0.89, 0.88, 0.87, 0.86, 0.85)), _weak),
    )
}

#: The five settings of Table 1, in order.
TABLE1 = ("eagle", "draft-model", "ngram-code-edit", "parallel-block", "weak-drafter")

# Fig 4b: the EAGLE-like drafter on code, then on math (the workload switch).
SETTINGS["eagle-code"] = dataclasses.replace(SETTINGS["eagle"], name="eagle-code", workload=PRESETS["code"])
SETTINGS["eagle-math"] = dataclasses.replace(SETTINGS["eagle"], name="eagle-math", workload=PRESETS["math"])

