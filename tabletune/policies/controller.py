"""TableTune + controller: the vLLM plugin's ``tabletune.controller.Controller``, driven by the simulator.

Rule: the same class the vLLM plugin installs (no second controller here). Each
step takes ``Controller.k_for(b)`` (the current table's k, or k_max on a bounded
share of exploration steps), then feeds the step's exact (k_i, accepted_i) counts
back as a ``StepObservation`` and lets ``maybe_rebuild(now_s)`` install a re-optimised
table when it beats the current one (hysteresis and rates in the controller's docstring).

Options (``controller:key=value,...``): ``start=tuned|documented|documented-div4|FILE``
(the starting table; default the table tuned on the prior), ``prior=R1/R2/...`` (prior
rates, '/'-separated; default ``ctx.prior_rates``), and any ``ControllerConfig`` field.

``controller:per-request[,key=value,...]`` is the same controller with a request level on top
(``PerRequestController``; the simulator's default policy): per-row draft lengths, drafting stops
and drafter choice priced by the step cost (``tabletune.controller.per_request``). Its own options:
``explore_max_batch``, ``ngram``, ``refit_every``, ``memory``, ``ema``, ``all_caps_max_batch``, ``stop``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tabletune.controller import Controller, ControllerConfig
from tabletune.controller.calibration import LogitCalibration
from tabletune.controller.mode_gate import BATCH, ModeGate
from tabletune.controller.per_request import ClassPlans, Plan, choose_plan, class_plans, marginal_ms
from tabletune.errors import InputError
from tabletune.controller.estimator import StepObservation
from tabletune.policies import parse_options
from tabletune.policies.adaptive_verification import ConfidenceCalibrator
from tabletune.policies.base import (MODEL, NGRAM, BatchPolicy, BatchState, Decision, DraftFeatures, PolicyContext,
                                     StepOutcome, nearest_k)
from tabletune.policies.ngram_table import NgramTable
from tabletune.policies.per_request import accepted_mask, default_features, require_features, tested_mask
from tabletune.policies.stop_rule import LogitStopRule, threshold
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
    observe_may_lag: ClassVar[bool] = True  # the k it asked is kept by step
    decides_ahead: ClassVar[bool] = True  # its k needs the batch size and what it learnt, nothing of the last step

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
        self._asked: dict[int, int] = {}  # step -> the k asked for it, until observed

    @classmethod
    def from_spec(cls, ctx: PolicyContext, arg: str | None) -> ControllerPolicy:
        parts = [x for x in (arg or "").split(",") if x.strip()]
        per_request = "per-request" in [x.strip() for x in parts]
        if per_request:
            parts = [x for x in parts if x.strip() != "per-request"]
        opts = parse_options(",".join(parts))
        extra = {key: opts.pop(key) for key in PerRequestController.OPTIONS if key in opts} if per_request else {}
        if per_request:
            opts.setdefault("explore_fraction", PerRequestController.EXPLORE_FRACTION)
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
        label = f"controller:{arg}" if arg else "controller"
        if per_request:
            return PerRequestController(ctx, start, prior_rates, config, label=label, **extra)  # type: ignore[arg-type]
        return cls(ctx, start, prior_rates, config, label=label)

    def k_for(self, state: BatchState) -> int:
        self.asked_k = self._asked[state.step] = nearest_k(self.controller.k_for(max(state.batch_size, 1)),
                                                           self.ctx.ks)
        return self.asked_k

    def observe(self, outcome: StepOutcome) -> None:
        now_s = outcome.state.time_s + outcome.step_ms / 1000.0
        asked = self._asked.pop(outcome.state.step, self.asked_k)
        self.controller.observe(observation(outcome, self.controller.k_max, now_s, asked))
        self.controller.maybe_rebuild(now_s)


@dataclass(frozen=True)
class Ahead:
    """The per-request controller's blind plans of the next step (``PerRequestController.plans_ahead``)."""

    plans: ClassPlans
    next_rates: np.ndarray  # [k_max] the estimator's a_j they were made with
    rules: dict[int, LogitStopRule | None]  # cap -> the model rows' stop rule


class PerRequestController(ControllerPolicy):
    """``controller:per-request``: the controller's table at the batch level, per-row drafting and verification.

    Batch level: the ``Controller`` as in ``controller`` (table from the measured T(b, k),
    acceptance re-estimated online from the model-drafter rows and shrunk to the tuner's prior,
    rebuilt with hysteresis); its k at the step's batch size is the anchor plan. Request level
    (``tabletune.controller.per_request``), decided before anything is drafted (``DraftStop``: no
    model signal yet, on the engine as in the simulator): every model row's survival is the
    estimator's S_j = prod_{l<=j} a_l; each row takes the n-gram chain instead where its surplus
    is larger (its survival from the lookup's match length, known before drafting, priced by its
    verification only: an n-gram row takes no model drafting; ``ngram=0`` turns the chain off);
    the plan's cap bounds the model rows. With ``stop=1``, ``keep_drafting`` then stops each model row on its
    own drafted signals: row i drafts j + 1 while S_ij a_{j+1} > R dT_{j+1}(b, cap). The default ``stop=0`` drafts
    the plan's k_i whole: the rule needs the drafted lengths on the host before verification (one sync a step on
    a GPU engine), and in the simulator it gains -0.8% to +3.7% of device time (docs/engine.md, "The stop rule's
    price"), less than that sync costs at the loads where it gains.

    Signals (``stop=1``): S_ij = prod_{l<=j} p_il, p from ``LogitCalibration`` on the model drafter's top-1
    probability, refitted every ``refit_every`` steps on the last ``memory`` tested tokens and
    cleared when the estimator detects a workload shift (calibration per workload); before its
    first fit p_ij is the estimator's a_j. The n-gram chain's survival is the context's
    calibration table, re-calibrated online by a binned map from its confidence to acceptance.
    (Given every position's signals in ``decide``, as a test may, it plans on them directly.)

    Caps: every cap 1..k_max competes at batch sizes <= ``all_caps_max_batch`` (32), the table's k +- 2
    above (fewer step costs to price per step at large b).

    Exploration: at batch sizes <= ``explore_max_batch`` (every size by default) one row drafts k_max on the
    controller's exploration steps (``explore_fraction`` credit, 0.005 by default here, and a step while the
    table's next position lacks evidence): on a plan made with the signals the row whose draft survives best; on a
    blind plan (``explored``: no other row ever drafts past it, so without it an estimate that fell could not
    recover) its first model row to k_max, or, where the drafting costs what the batch costs, every model row, to
    the table's k + 1 for that position's evidence and to k_max on credit. An exploring step keeps the stop rule on
    the host.

    Gate (``gate=1``, with ``stop=0``; off by default): an online A/B test (``tabletune.controller.mode_gate``) between
    these plans (``ROWS``) and the batch controller alone (``BATCH``: a ``ControllerPolicy`` with its own estimator,
    fed by the batch steps only, and its own explore share), on the measured tokens per wall time of windows of
    steps. A ``BATCH`` step needs no lookup, so an engine decides it ahead and launches it before the
    last step's read-back (``decides_ahead``): where the lookup does not pay for the host time its plan costs
    between steps (chat), the gate keeps the batch controller and probes the plans one window in |D| / 0.5%. A
    workload shift restarts its trial.
    """

    uses_lookup: ClassVar[bool] = True  # plans before drafting, on the n-gram lookup
    observe_may_lag: ClassVar[bool] = True  # what it keeps from a step is keyed by that step
    EXPLORE_FRACTION: ClassVar[float] = 0.005  # its default credit share (the batch controller's is 0.02)
    OPTIONS: ClassVar[tuple[str, ...]] = ("explore_max_batch", "ngram", "refit_every", "memory", "ema",
                                          "all_caps_max_batch", "stop", "gate")

    def __init__(self, ctx: PolicyContext, start: DraftTable | None = None, prior: tuple[float, ...] | None = None,
                 config: ControllerConfig | None = None, label: str = "controller:per-request",
                 explore_max_batch: int = 1 << 30, ngram: int = 1, refit_every: int = 50, memory: int = 4096,
                 ema: float = 0.95, all_caps_max_batch: int = 32, stop: int = 0, gate: int = 0) -> None:
        super().__init__(ctx, start, prior, config or ControllerConfig(explore_fraction=self.EXPLORE_FRACTION), label)
        # stop=0: no stop rule, the plan's k_i are drafted whole; nothing is read back between drafting and
        # verification, and no drafted signal at all (the blind plan needs none)
        self.stops_drafts = bool(stop)
        self.all_caps_max_batch = int(all_caps_max_batch)
        if (explore_max_batch < 0 or refit_every < 1 or memory < 16 or not 0 <= ema < 1 or stop not in (0, 1)
                or gate not in (0, 1) or (gate and stop)):
            raise InputError("--policy", "controller:per-request",
                             dict(explore_max_batch=explore_max_batch, refit_every=refit_every, memory=memory, ema=ema,
                                  stop=stop, gate=gate), "needs explore_max_batch >= 0, refit_every >= 1, "
                             "memory >= 16, 0 <= ema < 1, stop 0 or 1, gate 0 or 1, not both gate and stop (a "
                             "stop rule reads back between positions, so no step goes ahead)")
        k_max = ctx.k_max
        self.explore_max_batch, self.refit_every, self.ema = int(explore_max_batch), int(refit_every), ema
        self.model_chain = ctx.default_drafter == MODEL
        self.use_ngram = bool(ngram) and self.model_chain
        self.calibration = LogitCalibration(k_max, int(memory))
        ng_prior = float(np.mean(ctx.ngram_rates[1:])) if len(ctx.ngram_rates) > 1 else 0.5
        self.ngram_cal = ConfidenceCalibrator(ng_prior, num_bins=10, prior_weight=20.0, decay=0.999)
        self.ngram_table = NgramTable.from_length_rates(ctx.ngram_rates or (0.0,), k_max)
        self.ema_tokens = self.ema_ms = 0.0
        self.steps = 0
        self._shifts = 0
        self._prices: dict[int, np.ndarray] = {}
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # b -> StepCost.rows_ms_tables
        self.plan: Plan | None = None
        self.explore_row = -1
        self._rule: LogitStopRule | None = None
        self._ahead: Ahead | None = None  # the blind plans of the next step, made by observe
        self._signals: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = {}  # step -> (top1, match length)
        self._top1: np.ndarray | None = None
        # the gate needs the lookup's chain to weigh: without it (ngram=0, an n-gram default drafter) every plan is
        # a blind one
        self.gate = ModeGate() if gate and self.use_ngram else None
        # the gate's batch mode is the batch controller itself, on its own estimator fed by the batch steps only:
        # a plan step's model rows are the rows the lookup did not take (on chat, the less predictable ones), so
        # their a_j, right for the plans, would bias the batch k low (chat 8 on the H100: k 1.1 against 2.1)
        self.batch = (ControllerPolicy(ctx, start, prior, dataclasses.replace(
            config or ControllerConfig(), explore_fraction=ControllerConfig().explore_fraction))
            if self.gate is not None else None)
        self._mode_of: dict[int, int] = {}  # step -> the gate's mode it was decided in, until observed
        self._gate_shifts = 0  # the estimator's shifts the gate has seen
        self._speed_off: dict[int, float] = {}  # b -> b / T(b, 0), tokens per ms without speculation

    @property
    def decides_ahead(self) -> bool:  # type: ignore[override]
        """While the gate is in its batch mode: the batch controller's k needs nothing of the last step."""
        return self.gate is not None and self.gate.mode == BATCH

    @property
    def uses_features(self) -> bool:  # type: ignore[override]
        """The drafted signals: the stop rule's calibration (none without the stop rule)."""
        return self.stops_drafts

    # ---- pricing ------------------------------------------------------------------

    def prices_ms(self, b: int) -> np.ndarray:
        """[caps, k_max]: row c - 1 is dT(b, c) at positions 1..k_max, computed once per batch size."""
        prices = self._prices.get(b)
        if prices is None:
            k_max = self.ctx.k_max
            prices = self._prices[b] = np.array([marginal_ms(self.ctx.cost, b, c, k_max) for c in range(1, k_max + 1)])
        return prices

    def ngram_prices_ms(self, b: int) -> np.ndarray:
        """[caps, k_max]: as ``prices_ms`` for a row on the n-gram chain (its verification only)."""
        key = -b
        prices = self._prices.get(key)
        if prices is None:
            k_max = self.ctx.k_max
            prices = self._prices[key] = np.array([marginal_ms(self.ctx.cost, b, c, k_max, free=True)
                                                   for c in range(1, k_max + 1)])
        return prices

    def rate(self, b: int, surv: np.ndarray, table_k: int) -> float:
        """R: the running tokens per ms; before the first step, the table's modelled rate."""
        if self.ema_ms > 0:
            return self.ema_tokens / self.ema_ms
        return (b + float(surv[:, :table_k].sum())) / self.ctx.cost.step_ms(b, table_k)

    def model_probs(self, top1: np.ndarray) -> np.ndarray:
        """[b, n] calibrated p_ij of the model chain (the estimator's a_j before the first fit)."""
        if self.calibration.fits:
            return self.calibration(top1)
        rates = np.asarray(self.controller.estimator.rates()[: top1.shape[1]])
        return np.broadcast_to(rates[None, :], top1.shape)

    def ngram_confidence(self, match_len: np.ndarray) -> np.ndarray:
        """[b, k_max] the lookup's per-position confidence: the calibration table's conditional acceptance at each
        row's match length (what ``ngram_cal`` maps to acceptance, and ``observe`` calibrates it on)."""
        rates = self.ngram_table.rates  # [l_max + 1, k_max]
        return rates[np.clip(match_len, 0, rates.shape[0] - 1)]

    def ngram_survival(self, match_len: np.ndarray | None, num_proposed: np.ndarray | None) -> np.ndarray | None:
        """[b, k_max] survival of the n-gram chain from the lookup (None: no chain, or no row matched)."""
        if not self.use_ngram or num_proposed is None or not np.any(num_proposed > 0):
            return None
        cond = self.ngram_confidence(match_len)
        proposed = np.arange(1, self.ctx.k_max + 1)[None, :] <= num_proposed[:, None]
        return np.cumprod(self.ngram_cal(cond), axis=1) * (proposed & (cond[:, :1] > 0))

    # ---- per step -------------------------------------------------------------------

    def decide(self, state: BatchState) -> Decision:
        """Before drafting (``state.features`` None with the model chain: the engine, or a simulated step
        before it drafts) every row's model survival is the estimator's S_j = prod_{l<=j} a_l (one cap for the
        model chain), the n-gram chain's comes from the lookup (``state.ngram_*``, known before drafting), and
        ``keep_drafting`` then stops the model rows on their own signals; such a plan does not explore. Its
        plans by n-gram class were made ahead (``plans_ahead``, by ``observe``): deciding sums the step's class
        counts. With the drafted signals, survival is calibrated per row."""
        b, k_max = state.batch_size, self.ctx.k_max
        if self.gate is not None:
            self._mode_of[state.step] = self.gate.mode
            if self.gate.mode == BATCH:  # the batch controller's k: no plan, no stop rule
                self.plan, self.explore_row, self._rule = None, -1, None
                decision = self.batch.decide(state)
                self._asked[state.step] = decision.k  # every row asked it: the estimator below counts it so
                return decision
        if self.model_chain and state.features is None:
            ahead = self._ahead if self._ahead is not None and self._ahead.plans.batch_size == b else None
            if ahead is None:
                ahead = self._ahead = self.plans_ahead(b)
            classes = self.row_classes(state.ngram_match_len, state.ngram_num_proposed)
            plan = ahead.plans.choose(classes)
            self._rate, self._next_rates, self._rule = ahead.plans.rate, ahead.next_rates, ahead.rules[plan.cap]
            self._top1, self.explore_row = None, -1
            evidence = self.controller.evidence_explore_steps
            if 0 < b <= self.explore_max_batch and self.controller.explore_next(b):
                # where the drafting costs the batch, a step for the next position's evidence drafts to it alone
                shallow = (self.ctx.cost.draft_rows == "batch"
                           and self.controller.evidence_explore_steps > evidence)
                depth = min(self.controller.table.k_for(b) + 1, k_max) if shallow else k_max
                plan = self.explored(plan, depth)
            self.plan = plan
            self._signals[state.step] = (None, None if classes is None else state.ngram_match_len)
            return Decision.per_request(plan.ks, plan.drafter)
        next_rates = np.asarray(self.controller.estimator.rates()[:k_max])
        if state.features is None and state.ngram_num_proposed is not None:  # the n-gram chain: its lookup
            nan = np.full((b, k_max), np.nan)                                 # is its signal
            state = BatchState(state.step, state.time_s, state.request_ids, state.num_generated,
                               DraftFeatures(nan, nan, nan, state.ngram_match_len, state.ngram_num_proposed))
        f = (require_features(state.features, self.label) if self.model_chain
             else default_features(state, self.ctx, self.label))
        top1 = f.top1_prob[:, :k_max]
        self._top1 = top1 if self.model_chain else None
        if self.model_chain:
            surv_m = np.cumprod(self.model_probs(top1), axis=1)
        else:
            surv_m = np.cumprod(self.ngram_cal(top1), axis=1) * (top1 > 0)
        surv_n = self.ngram_survival(f.ngram_match_len, f.ngram_num_proposed)
        table_k = nearest_k(self.controller.table.k_for(max(b, 1)), self.ctx.ks)
        rate = self.rate(b, surv_m, table_k)
        plan = choose_plan(self.ctx.cost, surv_m, surv_n, next_rates, self.prices_ms(b), rate, table_k,
                           None if b <= self.all_caps_max_batch else 2)
        if not self.model_chain:
            plan = Plan(plan.ks, np.full(b, NGRAM, np.int64), plan.cap, plan.expected_tokens, plan.step_ms)
        self.explore_row = -1
        if 0 < b <= self.explore_max_batch and self.model_chain and self.controller.explore_next(b):
            row = int(np.argmax(surv_m[:, -1]))
            ks, drafter = plan.ks.copy(), plan.drafter.copy()
            ks[row], drafter[row] = k_max, MODEL
            plan = Plan(ks, drafter, k_max, plan.expected_tokens, plan.step_ms)
            self.explore_row = row
        self.plan, self._rate, self._next_rates, self._rule = plan, rate, next_rates, None
        self._signals[state.step] = (self._top1, None if surv_n is None else f.ngram_match_len)
        return Decision.per_request(plan.ks, plan.drafter)

    def observe_gate(self, outcome: StepOutcome) -> None:
        """The step into the gate, with the mode it was decided in; a workload shift restarts the gate's trial."""
        mode = self._mode_of.pop(outcome.state.step, None)
        self._mode_of = {t: m for t, m in self._mode_of.items() if t > outcome.state.step}
        if self.controller.estimator.shifts != self._gate_shifts:
            self._gate_shifts = self.controller.estimator.shifts
            self.gate.shift()
            return
        if mode is None:
            return
        b = len(outcome.ks)
        speed = self._speed_off.get(b)
        if speed is None:
            speed = self._speed_off[b] = b / self.ctx.cost.step_ms(b, 0)
        self.gate.observe(mode, outcome.num_tokens, outcome.ended_s, speed, outcome.prefill_ms / 1e3)

    def explored(self, plan: Plan, depth: int) -> Plan:
        """A blind plan on one of the controller's exploration steps drafts model positions to ``depth``. Without
        it a blind plan never drafts past its own k, and an estimate that fell (a_j low on the tokens seen) could
        not recover.

        How follows the cost's drafting rule. Where drafting costs what the batch costs (``draft_rows ==
        "batch"``, the engine's fused step: every row drafts the longest draft) every model row drafts to
        ``depth``: the drafting is paid once, the other rows add only their verification, and the estimator learns
        from all of them. There a step for the next position's evidence drafts to the table's k + 1 only, and a
        step paid by the exploration credit to k_max (``decide``). Measured on an H100 (Qwen3-8B shape, b = 4): one
        row drafting 7 and three 0 took 11.9 ms, all four drafting 7 took 12.1 ms, the table's k = 2 7.9 ms.
        Where drafting is charged by the rows still drafting, one model row (else row 0, put on the model chain)
        drafts k_max on every exploring step."""
        ks, drafter = plan.ks.copy(), plan.drafter.copy()
        model_rows = np.flatnonzero(drafter == MODEL)
        if model_rows.size == 0:
            model_rows = np.array([0])
        elif self.ctx.cost.draft_rows != "batch":
            model_rows = model_rows[:1]
        ks[model_rows] = np.maximum(ks[model_rows], depth)
        drafter[model_rows] = MODEL
        self.explore_row, self._rule = int(model_rows[0]), None
        return Plan(ks, drafter, max(plan.cap, depth), plan.expected_tokens, plan.step_ms)

    def row_classes(self, match_len: np.ndarray | None, num_proposed: np.ndarray | None) -> np.ndarray | None:
        """[b] each row's n-gram class, L (k_max + 1) + P of its match length L <= l_max and proposal length
        P <= k_max (``class_ngram_survival``); None when no row has a proposal (or there is no n-gram chain)."""
        if not self.use_ngram or num_proposed is None or not num_proposed.any():
            return None
        k_max, l_max = self.ctx.k_max, self.ngram_table.rates.shape[0] - 1
        return np.minimum(match_len, l_max) * (k_max + 1) + np.minimum(num_proposed, k_max)  # lengths are >= 0

    def class_ngram_survival(self) -> np.ndarray:
        """[classes, k_max] the n-gram chain's calibrated survival of each class (``row_classes``; as
        ``ngram_survival`` computes it per row); one all-zero class without the chain."""
        k_max = self.ctx.k_max
        if not self.use_ngram:
            return np.zeros((1, k_max))
        rates = self.ngram_table.rates  # [l_max + 1, k_max]
        surv = np.cumprod(self.ngram_cal(rates), axis=1) * (rates[:, :1] > 0)
        proposed = np.arange(1, k_max + 1)[None, :] <= np.arange(k_max + 1)[:, None]  # [P + 1, k_max]
        return (surv[:, None, :] * proposed[None, :, :]).reshape(-1, k_max)

    def plans_ahead(self, b: int) -> Ahead:
        """The blind plans of a step of b rows by n-gram class, with their stop rules by cap: every row's model
        survival is the estimator's, the n-gram chain's its class's. They depend on b and on what ``observe``
        learnt only, so ``observe`` makes them for the batch it saw: an engine that overlaps ``observe`` with the
        next step finds them made, and its decide costs a few array operations."""
        k_max = self.ctx.k_max
        next_rates = np.asarray(self.controller.estimator.rates()[:k_max])
        surv_model = np.cumprod(next_rates)
        table_k = nearest_k(self.controller.table.k_for(max(b, 1)), self.ctx.ks)
        rate = self.rate(b, np.broadcast_to(surv_model[None, :], (b, k_max)), table_k)
        tables = self._tables.get(b)
        if tables is None:
            tables = self._tables[b] = self.ctx.cost.rows_ms_tables(b, k_max)
        plans = class_plans(self.ctx.cost, b, surv_model, self.class_ngram_survival(), next_rates,
                            self.prices_ms(b), self.ngram_prices_ms(b), rate, table_k,
                            None if b <= self.all_caps_max_batch else 2, tables)
        caps = {int(c) for c in plans.caps} | {plans.fallback.cap}
        return Ahead(plans, next_rates, {c: self.stop_rule(b, c, rate, next_rates) for c in caps})

    def device_stop_rule(self, state: BatchState | None = None) -> LogitStopRule | None:
        """This step's stop rule as numbers (``stop_rule``), for a draft loop that evaluates it on the device;
        None where only ``keep_drafting`` can (no plan, an exploring row, or the n-gram default drafter)."""
        if self.plan is None or self.explore_row >= 0 or not self.model_chain:
            return None
        return self.model_rule()

    def model_rule(self) -> LogitStopRule | None:
        """The current plan's stop rule of the model rows, made once a step."""
        if self._rule is None:
            self._rule = self.stop_rule(len(self.plan.ks), self.plan.cap, self._rate, self._next_rates)
        return self._rule

    def stop_rule(self, b: int, cap: int, rate: float, next_rates: np.ndarray) -> LogitStopRule | None:
        """The model rows' stop rule of a plan of b rows under ``cap`` (module ``stop_rule``); None for the n-gram
        default drafter or cap 0."""
        if not self.model_chain or cap < 1:
            return None
        k_max, prices = self.ctx.k_max, self.prices_ms(b)[cap - 1]
        cap = min(cap, k_max)
        if self.calibration.fits:
            slope, intercepts = float(self.calibration.coef[0]), self.calibration.coef[1:1 + k_max]
        else:  # p_ij = a_j: w = 0, c_j = logit(a_j)
            a = np.clip(next_rates, 1e-12, 1 - 1e-12)
            slope, intercepts = 0.0, np.log(a / (1 - a))
        thetas = [threshold(rate, prices[j], next_rates[j]) if j < cap else float("inf") for j in range(1, k_max + 1)]
        return LogitStopRule(slope, tuple(float(c) for c in intercepts), tuple(thetas))

    def keep_drafting(self, state: BatchState, features: DraftFeatures, j: int, active: np.ndarray) -> np.ndarray:
        """Row i drafts j + 1 while S_ij a_{j+1} > R dT_{j+1}(b, cap) and j < cap (module ``per_request``)."""
        plan = self.plan
        if plan is None or j >= min(plan.cap, self.ctx.k_max):
            return np.zeros_like(active)
        if self.model_chain:  # the rule a device evaluates the same (``device_stop_rule``)
            keep = self.model_rule().keep(features.top1_prob, j)
        else:
            probs = self.ngram_cal(default_features(state, self.ctx, self.label).top1_prob[:, :j])
            price = self._rate * self.prices_ms(state.batch_size)[plan.cap - 1][j]
            keep = np.prod(probs, axis=1) * self._next_rates[j] > price
        keep = active & keep & (plan.drafter == MODEL)
        if self.explore_row >= 0:
            keep[self.explore_row] = bool(active[self.explore_row])
        return keep

    def observe(self, outcome: StepOutcome) -> None:
        """The batch controller learns the model chain's a_j from the model rows only (an n-gram row's run of
        accepted tokens is not the model drafter's); the calibrations learn per chain."""
        model = outcome.drafter == MODEL
        if self.batch is not None and self._mode_of.get(outcome.state.step) == BATCH:
            self.batch.observe(outcome)
        # the k the step asked of every row: the batch controller's on the gate's batch steps (kept by step), none
        # on a plan (each row asked for its own k)
        self._asked.setdefault(outcome.state.step, 0)
        if not self.model_chain or model.all():
            super().observe(outcome)
        else:
            now_s = outcome.state.time_s + outcome.step_ms / 1000.0
            rows = dataclasses.replace(outcome, ks=outcome.ks[model], accepted=outcome.accepted[model],
                                       drafter=outcome.drafter[model])
            obs = dataclasses.replace(observation(rows, self.controller.k_max, now_s,
                                                  self._asked.pop(outcome.state.step)),
                                      batch_size=len(outcome.ks))
            self.controller.observe(obs)
            self.controller.maybe_rebuild(now_s)
        self.steps += 1
        k_max = self.ctx.k_max
        tested = tested_mask(outcome.ks, outcome.accepted, k_max)
        acc = accepted_mask(outcome.accepted, k_max)
        # the step's own signals (an engine may observe step t after deciding step t + 1)
        top1, match_len = self._signals.pop(outcome.state.step, (None, None))
        if top1 is None and self.model_chain and outcome.state.features is not None:
            top1 = outcome.state.features.top1_prob[:, :k_max]  # the signals drafted after a blind plan
        if top1 is not None:
            mask = tested & (outcome.drafter == MODEL)[:, None]
            rows, cols = np.nonzero(mask)
            self.calibration.add(top1[rows, cols], cols, acc[rows, cols].astype(float))
        if match_len is not None:
            mask = tested & (outcome.drafter == NGRAM)[:, None]
            if mask.any():
                self.ngram_cal.update(self.ngram_confidence(match_len)[mask], acc[mask])
        shifts = self.controller.estimator.shifts
        if shifts != self._shifts:  # a new workload: calibrate on its tokens only
            self._shifts = shifts
            self.calibration.clear()
        if self.steps % self.refit_every == 0:
            self.calibration.refit()
        w = self.ema if self.ema_ms > 0 else 0.0
        self.ema_tokens = w * self.ema_tokens + (1.0 - w) * outcome.num_tokens
        self.ema_ms = w * self.ema_ms + (1.0 - w) * outcome.step_ms
        self._signals = {t: v for t, v in self._signals.items() if t > outcome.state.step}
        if self.gate is not None:
            self.observe_gate(outcome)
        # the next step's blind plans, for the batch seen now (the likely one next step too)
        self._ahead = self.plans_ahead(len(outcome.ks)) if self.model_chain else None
