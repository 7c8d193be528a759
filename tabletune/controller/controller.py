"""The online controller: re-estimate acceptance while serving and correct the table.

Engine-agnostic (no torch, no vllm). The vLLM plugin, the Prometheus sidecar and
the simulator's ``controller`` policy all drive this one class::

    c = Controller(step_profile, prior, ControllerConfig(...), table=initial_table)
    every step:
        c.observe(StepObservation.from_drafts(batch_size, k, [(k_i, m_i), ...], time_s))
        k_next = c.k_for(batch_size)        # the table's k, or k_max on an exploration step
        new = c.maybe_rebuild(now_s)         # a DraftTable to install, or None
    c.state()                                # JSON-able dict: table, acceptance, installs, steps, ...

Estimator: per-position conditional acceptance from censored counts with a prior
and exponential decay (``tabletune.controller.estimator.DecayedAcceptance``).

Exploration: when the table drafts k < k_max, positions above k get no evidence.
We draft k_max on a bounded fraction ``explore_fraction`` of steps (credit
scheme: each step earns ``explore_fraction`` credit, capped at 1; an exploration
step spends 1), only when the table's k at the current batch size is < k_max.
So credit-paid exploration steps <= explore_fraction * steps + 1, and their modelled
goodput cost is at most explore_fraction * (1 - G(b, k_max) / G(b, table k)) at each b;
``state()['explore_cost']`` reports the cost of all exploration, averaged over the steps.

Evidence-driven exploration: a table that drafts k at the current batch size never
tests position k + 1. While that position's (decayed) evidence is below
``explore_min_evidence`` drafts, i.e. while the prior still outweighs the data there,
the controller also explores once per ``observe_every_steps`` steps (one per
observation window, so the evidence is counted before it asks again), without
spending credit. This is what makes learning fast when the start table drafts little:
a mistuned table with k = 0 at large batches would otherwise wait 1 / explore_fraction
steps (50 at the default) for its first draft. Evidence at a position decays only
with new tokens verified there, so once collected it stays until a detected workload
shift drops it, which re-arms this exploration exactly when it is needed. With
``explore_fraction`` 0 the controller never explores.
We chose this over an optimistic (UCB) estimate because its cost is bounded and
known in advance, while UCB installs whole optimistic tables whose cost depends
on how wrong the optimism is.

Rebuild: exactly ``tabletune.optimizer.optimize_table(step_profile, rates, ...)``
(the optimizer of ``tabletune table --exact``). Hysteresis: the new table is installed only
if its modelled goodput beats the current table's by more than ``min_gain`` at
some batch size, at most once per ``min_install_interval_s``, and only after
``warmup_drafts`` drafts were observed. Rebuilds are evaluated at most once per
``rebuild_interval_s``. Every table is validated with ``DraftTable.from_ranges``.

Draft rate: drafters that propose only on a match (n-gram) draft in a share q of
request-steps. Observations carry the request-steps that could draft but did not
(``StepObservation.undrafted``); q is estimated like the rates (decayed counts, a
prior from the tuner's ``AcceptanceCounts.draft_rate``, ``estimator.DecayedDraftRate``)
and reported in ``state()``. Rebuilds optimise with it only with ``model_draft_rate``
(opt-in): the linear cost model of ``tabletune.goodput`` mispredicts vLLM's n-gram
path on CPU (see the README), so by default every request is modelled as drafting.

Pinning: ``pin(table)`` installs an operator's table (e.g. from ``TABLETUNE_TABLE_FILE``) and
freezes it: the controller keeps observing, so its estimate (and the exported series) stay
current, but it neither installs nor explores until ``unpin()``: an exploration step would
draft k_max where the operator pinned a smaller k. Exploration credit does not accrue while
pinned. The next rebuild after ``unpin()`` starts from the pinned table and the estimate at
that time.

Safety: observations with NaN, negative or inconsistent counts are ignored and
counted in ``state()['ignored']``. Memory is bounded: fixed-size counters, a
batch-size histogram capped at ``max_batch``, and the last 16 installs.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
from tabletune.controller.config import ControllerConfig
from tabletune.controller.estimator import DecayedAcceptance, DecayedDraftRate, StepObservation
from tabletune.errors import InputError
from tabletune.optimizer import OptimizeOptions, optimize_table, predict
from tabletune.profile import StepProfile
from tabletune.table import DraftTable

__all__ = ["Controller", "ControllerConfig", "StepObservation", "load_controller", "prior_rates"]

HISTORY = 16


def prior_draft_rate(prior: AcceptanceProfile | AcceptanceCounts | Sequence[float], workload: str | None = None,
                     temperature: float | None = None) -> float:
    """The prior's draft rate q (1.0 when the prior is plain rates)."""
    if isinstance(prior, AcceptanceProfile):
        prior = prior.select(workload, temperature)
    return prior.draft_rate if isinstance(prior, AcceptanceCounts) else 1.0


def prior_rates(prior: AcceptanceProfile | AcceptanceCounts | Sequence[float], k_max: int,
                workload: str | None = None, temperature: float | None = None) -> list[float]:
    """k_max conditional rates from a prior; positions without evidence repeat the last known rate."""
    if isinstance(prior, AcceptanceProfile):
        prior = prior.select(workload, temperature)
    if isinstance(prior, AcceptanceCounts):
        rates = prior.known_rates()
    else:
        rates = [float(r) for r in prior]
    if not rates:
        raise InputError("prior", "rates", list(rates), "the prior has no acceptance evidence")
    rates = [min(max(r, 1e-3), 1.0) for r in rates[:k_max]]
    return rates + [rates[-1]] * (k_max - len(rates))


class Controller:
    """Online estimator + table rebuild; see the module docstring."""

    def __init__(self, step_profile: StepProfile, prior: AcceptanceProfile | AcceptanceCounts | Sequence[float],
                 config: ControllerConfig = ControllerConfig(), table: DraftTable | None = None) -> None:
        self.profile = step_profile
        self.config = config
        measured = [k for k in step_profile.ks if config.ks is None or k in config.ks]
        self.k_max = min(config.k_max or max(step_profile.ks), max(measured))
        if self.k_max < 1:
            raise InputError(step_profile.source, "k", step_profile.ks, "the profile measures no k >= 1")
        self.max_batch = config.max_batch or step_profile.max_batch_size
        self.options = OptimizeOptions(max_batch=self.max_batch, k_max=self.k_max, ks=config.ks)
        self.estimator = DecayedAcceptance(
            prior_rates(prior, self.k_max, config.prior_workload, config.prior_temperature),
            config.prior_weight, config.half_life_tokens, config.half_life_s)
        q0 = config.draft_rate_prior
        if q0 is None:
            q0 = prior_draft_rate(prior, config.prior_workload, config.prior_temperature)
        self.draft_rate = DecayedDraftRate(q0, config.prior_weight, config.half_life_tokens, config.half_life_s)
        if table is None:
            table = optimize_table(step_profile, self.estimator.prior, self.current_options()).table
        self.table = DraftTable.from_ranges(table.as_lists()).clamped(self.k_max)
        self.steps = 0
        self.drafts = 0
        self.explore_steps = 0
        self.installs = 0
        self.ignored: dict[str, int] = {}
        self.batch_hist = [0] * (self.max_batch + 1)
        self.last_batch_size = 1
        self.last_gain = 0.0
        self.history: deque[dict] = deque(maxlen=HISTORY)
        self.pinned = False
        self.pins = 0
        self.evidence_explore_steps = 0
        self._credit = 0.0
        self._calls = 0
        self._last_evidence_call: int | None = None
        self._last_eval_s: float | None = None
        self._last_install_s: float | None = None
        self._last_rates: list[float] = []
        self._eval_steps = 0

    # ---- per step --------------------------------------------------------------

    def observe(self, obs: StepObservation, batch_sizes: Sequence[int] | None = None) -> bool:
        """Count one step, or the steps of ``batch_sizes`` when obs pools several steps' drafts.

        Returns False (and counts why) when the observation is ignored. Pooling n steps
        into one observation gives the same estimate as n observations, up to the decay
        inside the window (evidence of the window's first step is not decayed by the
        rest of the window; the decay factor of the window is the product of its steps').
        """
        problem = obs.problem()
        if problem is None and self.config.half_life_s is not None and obs.time_s is None:
            problem = "no_time"
        if problem is not None:
            self.ignored[problem] = self.ignored.get(problem, 0) + 1
            return False
        sizes = (obs.batch_size,) if batch_sizes is None else batch_sizes
        self.steps += len(sizes)
        self.drafts += obs.num_drafts
        b = self.last_batch_size
        for size in sizes:
            b = min(max(int(size), 1), self.max_batch)
            self.batch_hist[b] += 1
        self.last_batch_size = b
        if obs.num_drafts or obs.time_s is not None:
            self.estimator.update(obs)
        if obs.num_drafts or obs.undrafted:
            self.draft_rate.update(obs.num_drafts, obs.undrafted, obs.time_s)
        return True

    def current_options(self) -> OptimizeOptions:
        """The optimizer's options; with ``model_draft_rate``, the current draft-rate estimate."""
        if not self.config.model_draft_rate:
            return self.options
        return dataclasses.replace(self.options, draft_rate=self.draft_rate.rate, draft_share=self.config.draft_share)

    def explore_next(self, batch_size: int | None = None) -> bool:
        """Whether the next step drafts k_max; call once per step (it spends credit). Never while pinned."""
        cfg = self.config
        if self.pinned:
            return False
        self._credit = min(self._credit + cfg.explore_fraction, 1.0)
        self._calls += 1
        b = self.last_batch_size if batch_size is None else batch_size
        k = self.table.k_for(max(b, 1))
        if k >= self.k_max:
            return False
        waited = self._last_evidence_call is None or self._calls - self._last_evidence_call >= cfg.observe_every_steps
        if cfg.explore_fraction > 0 and self.estimator.reached[k] < cfg.explore_min_evidence and waited:
            self._last_evidence_call = self._calls
            self.explore_steps += 1
            self.evidence_explore_steps += 1
            return True
        if self._credit >= 1.0:
            self._credit -= 1.0
            self.explore_steps += 1
            return True
        return False

    def k_for(self, batch_size: int) -> int:
        """The k for the next step at this batch size, exploration included."""
        return self.k_max if self.explore_next(batch_size) else min(self.table.k_for(batch_size), self.k_max)

    # ---- rebuild ----------------------------------------------------------------

    def maybe_rebuild(self, now_s: float) -> DraftTable | None:
        """Re-optimise from the current estimate; return a table worth installing, else None."""
        cfg = self.config
        if self.pinned:
            return None
        if self._last_eval_s is not None and (now_s - self._last_eval_s < cfg.rebuild_interval_s
                                              or self.steps - self._eval_steps < cfg.rebuild_every_steps):
            return None
        if self._last_install_s is not None and now_s - self._last_install_s < cfg.min_install_interval_s:
            return None
        if self.drafts < cfg.warmup_drafts:
            return None
        rates = self.estimator.rates()
        watched = [*rates, self.draft_rate.rate]
        if self._last_rates and max(abs(a - b) for a, b in zip(watched, self._last_rates)) < cfg.rebuild_min_change:
            return None
        self._last_eval_s, self._last_rates, self._eval_steps = now_s, watched, self.steps
        result = optimize_table(self.profile, rates, self.current_options())
        current = predict(self.table, [p.fixed_goodput for p in result.predictions])
        gain = max(new.goodput / cur.goodput - 1.0 for new, cur in zip(result.predictions, current))
        self.last_gain = gain
        if gain <= cfg.min_gain or result.table == self.table:
            return None
        self._install(DraftTable.from_ranges(result.table.as_lists(), self.k_max), now_s, gain, rates)
        return self.table

    def set_table(self, ranges: object, now_s: float | None = None) -> DraftTable:
        """Install a table by hand (validated); the controller rebuilds from it later."""
        table = DraftTable.from_ranges(ranges, self.k_max, source="set_table")
        self._install(table, now_s, None, self.estimator.rates())
        return table

    def pin(self, ranges: object, now_s: float | None = None, source: str = "pinned table") -> DraftTable:
        """Install this table (validated) and install nothing else until ``unpin``."""
        table = DraftTable.from_ranges(ranges, self.k_max, source=source)
        self.table = table
        self.pinned = True
        self.pins += 1
        self.history.append({"time_s": now_s, "table": table.as_lists(), "predicted_gain": None,
                             "acceptance": [round(r, 4) for r in self.estimator.rates()], "steps": self.steps,
                             "pinned": True})
        return table

    def unpin(self) -> None:
        """Resume: the next rebuild may replace the pinned table (the change filter starts over)."""
        self.pinned = False
        self._last_rates = []
        self._last_eval_s = None

    def _install(self, table: DraftTable, now_s: float | None, gain: float | None, rates: list[float]) -> None:
        self.table = table
        self.installs += 1
        if now_s is not None:
            self._last_install_s = now_s
        self.history.append({"time_s": now_s, "table": table.as_lists(), "predicted_gain": gain,
                             "acceptance": [round(r, 4) for r in rates], "steps": self.steps})

    # ---- introspection ------------------------------------------------------------

    def explore_cost(self) -> float:
        """Modelled goodput share lost to exploration: explore share x (1 - G(b,k_max)/G(b,table)), b-weighted."""
        if not self.steps:
            return 0.0
        result = optimize_table(self.profile, self.estimator.rates(), self.current_options())
        current = predict(self.table, [p.fixed_goodput for p in result.predictions])
        seen = sum(self.batch_hist)
        loss = sum(n * (1 - p.fixed_goodput[self.k_max] / p.goodput)
                   for n, p in zip(self.batch_hist[1:], current) if n)
        return self.explore_steps / self.steps * loss / seen

    def state(self, light: bool = False) -> dict:
        """JSON-able state; ``light`` skips the modelled exploration cost (an optimizer run) and history."""
        out = {
            "table": self.table.as_lists(),
            "acceptance": [round(r, 6) for r in self.estimator.rates()],
            "prior": [round(r, 6) for r in self.estimator.prior],
            "draft_rate": round(self.draft_rate.rate, 6),
            "evidence": [round(r, 2) for r in self.estimator.evidence()],
            "installs": self.installs,
            "steps": self.steps,
            "drafts": self.drafts,
            "explore_steps": self.explore_steps,
            "evidence_explore_steps": self.evidence_explore_steps,
            "shifts": self.estimator.shifts,
            "ignored": dict(self.ignored),
            "last_gain": round(self.last_gain, 6),
            "k_max": self.k_max,
            "pinned": self.pinned,
            "pins": self.pins,
        }
        if not light:
            out.update(explore_cost=round(self.explore_cost(), 6), history=list(self.history),
                       config=dataclasses.asdict(self.config))
        return out


def load_controller(profile_dir: str | Path, options_json: str, table: DraftTable | None, k_max: int | None,
                    max_batch: int | None, source: str = "controller options") -> Controller:
    """A Controller from a ``tabletune tune`` folder (step_profile.json, acceptance.json).

    ``options_json``: a JSON object of ``ControllerConfig`` fields ('' for defaults); k_max and
    max_batch are the engine's limits. With several acceptance entries the first is the prior
    unless ``prior_workload`` says otherwise.
    """
    folder = Path(profile_dir)
    step_profile = StepProfile.load(folder / "step_profile.json")
    prior = AcceptanceProfile.load(folder / "acceptance.json")
    try:
        options = json.loads(options_json) if options_json.strip() else {}
    except json.JSONDecodeError as exc:
        raise InputError(source, "<json>", options_json, f"invalid JSON: {exc.msg}") from None
    if isinstance(options, dict):
        if k_max is not None:
            options["k_max"] = min(int(options.get("k_max") or k_max), k_max)
        if max_batch is not None:
            options["max_batch"] = max_batch
        if len(prior.entries) > 1 and options.get("prior_workload") is None:
            options["prior_workload"] = prior.entries[0].workload
    return Controller(step_profile, prior, ControllerConfig.from_json(options, source), table=table)
