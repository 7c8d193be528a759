"""TableTune + controller: the vLLM plugin's ``tabletune.controller.Controller``, driven by the simulator.

Rule: the same class the vLLM plugin installs (no second controller here). Each
step takes ``Controller.k_for(b)`` (the current table's k, or k_max on a bounded
share of exploration steps), then feeds the step's exact (k_i, accepted_i) counts
back as a ``StepObservation`` and lets ``maybe_rebuild(now_s)`` install a re-optimised
table when it beats the current one (hysteresis and rates in the controller's docstring).

Options (``controller:key=value,...``): ``start=tuned|documented|documented-div4|FILE``
(the starting table; default the table tuned on the prior), ``prior=R1/R2/...`` (prior
rates, '/'-separated; default ``ctx.prior_rates``), and any ``ControllerConfig`` field.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tabletune.controller import Controller, ControllerConfig
from tabletune.errors import InputError
from tabletune.controller.estimator import StepObservation
from tabletune.policies import parse_options
from tabletune.policies.base import BatchPolicy, BatchState, PolicyContext, StepOutcome, nearest_k
from tabletune.table import VLLM_DOCUMENTED_DIV4_RANGES, VLLM_DOCUMENTED_RANGES, DraftTable

STARTS = {"documented": VLLM_DOCUMENTED_RANGES, "documented-div4": VLLM_DOCUMENTED_DIV4_RANGES}


def observation(outcome: StepOutcome, k_max: int, time_s: float, asked_k: int = 0) -> StepObservation:
    """Exact censored counts of one step: drafted_j = #{k_i >= j}, accepted_j = #{m_i >= j},
    reached_j = #{k_i >= j and m_i >= j - 1} (position j = 1..k_max); with ``asked_k`` >= 1 the rows
    whose drafter proposed nothing count as undrafted (the draft rate q), and a drafting row reaches
    every position up to ``asked_k`` while its prefix is accepted (reached_j = #{k_i >= 1, asked_k >= j,
    m_i >= j - 1})."""
    ks, m = outcome.ks, outcome.accepted
    j = np.arange(1, k_max + 1)[:, None]  # [k_max, 1]
    drafted = (ks[None, :] >= j).sum(axis=1)
    accepted = (m[None, :] >= j).sum(axis=1)
    # a row whose drafter proposed fewer than the asked k (an n-gram match ran out) reached the positions
    # it did not propose: they count as rejected, so the rates fold in the match length
    asked = np.maximum(ks, asked_k)[None, :] if asked_k > 0 else ks[None, :]
    reached = ((ks[None, :] > 0) & (asked >= j) & (m[None, :] >= j - 1)).sum(axis=1)
    k_step = int(ks.max()) if len(ks) else 0
    undrafted = int((ks == 0).sum()) if asked_k > 0 else 0
    return StepObservation(len(ks), k_step, int((ks > 0).sum()), tuple(reached.tolist()),
                           tuple(accepted.tolist()), tuple(drafted.tolist()), time_s, undrafted)


class ControllerPolicy(BatchPolicy):
    name: ClassVar[str] = "controller"

    def __init__(self, ctx: PolicyContext, start: DraftTable | None = None, prior: tuple[float, ...] | None = None,
                 config: ControllerConfig | None = None, label: str = "controller") -> None:
        super().__init__(ctx)
        cfg = config or ControllerConfig()
        partial = {}
        if ctx.prior_draft_rate < 1.0 and cfg.draft_rate_prior is None and not cfg.model_draft_rate:
            # a drafter that does not always propose: rebuild with the estimated q (partial-draft model)
            partial = {"draft_rate_prior": ctx.prior_draft_rate, "model_draft_rate": True,
                       "draft_share": ctx.cost.draft_share}
        cfg = ControllerConfig(**{**cfg.__dict__, "ks": ctx.ks, "max_batch": ctx.max_num_seqs,
                                  "k_max": ctx.k_max, **partial})
        self.controller = Controller(ctx.cost.profile, list(prior or ctx.prior_rates), cfg, table=start)
        self.label = label
        self.asked_k = 0  # the k asked for in the current step (rows without a proposal are undrafted)

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> ControllerPolicy:
        opts = parse_options(arg)
        start_name = str(opts.pop("start", "tuned"))
        start = None
        if start_name in STARTS:
            start = DraftTable(STARTS[start_name])
        elif start_name != "tuned":
            start = DraftTable.load(start_name)
        prior = opts.pop("prior", None)
        prior_rates = tuple(float(x) for x in str(prior).split("/")) if prior is not None else None
        try:
            config = ControllerConfig(**opts)
        except TypeError as exc:
            raise InputError("--policy", "controller", arg, str(exc)) from None
        return cls(ctx, start, prior_rates, config, label=f"controller:{arg}" if arg else "controller")

    def k_for(self, state: BatchState) -> int:
        self.asked_k = nearest_k(self.controller.k_for(max(state.batch_size, 1)), self.ctx.ks)
        return self.asked_k

    def observe(self, outcome: StepOutcome) -> None:
        now_s = outcome.state.time_s + outcome.step_ms / 1000.0
        self.controller.observe(observation(outcome, self.controller.k_max, now_s, self.asked_k))
        self.controller.maybe_rebuild(now_s)
