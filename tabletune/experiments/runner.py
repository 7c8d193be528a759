"""Running simulation points for the experiments: settings x policies x loads x seeds, cached.

Every point is one closed-loop simulation (``tabletune.sim``) of ``duration_s`` simulated
seconds, costed with the setting's measured step profile and drawing acceptance from its
measured rates (n-gram: replaying its trace). Policies get a PolicyContext whose prior rates
and draft rate q were *measured offline* by a calibration run (fixed k_max, load 16, a seed no
experiment uses), as the tuner would measure them, unless an experiment passes another prior
(e.g. a mismatched one).
Seeds give common random numbers: under one seed every policy sees the same requests.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tabletune.cost import StepCost
from tabletune.goodput import DraftYield
from tabletune.policies import make_policy
from tabletune.policies.base import NGRAM, PolicyContext, StepOutcome
from tabletune.policies.fixed import FixedK
from tabletune.sim import Schedule, SimConfig, Simulator
from tabletune.sim.replay import NgramStreams, load_ngram_trace
from tabletune.experiments.settings import SETTINGS, Setting

DEFAULT_LOADS = (1, 2, 4, 8, 16, 32, 64, 96, 128)
DEFAULT_SEEDS = (0, 1, 2)
CALIBRATION_SEED = 10_000


@dataclass(frozen=True)
class Point:
    setting: str
    policy: str
    load: int
    seed: int
    throughput_tok_s: float
    mean_k: float
    acceptance: float
    tpot_ms: float


class _Measuring(FixedK):
    """Fixed k_max that also counts censored per-position acceptance (reached / accepted) and the draft rate."""

    def __init__(self, ctx: PolicyContext, k: int) -> None:
        super().__init__(ctx, k)
        self.reached = np.zeros(ctx.k_max)
        self.accepted = np.zeros(ctx.k_max)
        self.num_drafts = 0  # request-steps that drafted
        self.num_request_steps = 0
        self.num_tokens = 0  # accepted + 1 per request-step (before output-length truncation)

    def observe(self, outcome: StepOutcome) -> None:
        # Position j is reached by every row that drafted and had j - 1 accepted, whether or not its drafter
        # proposed j (an n-gram match can be shorter than k): a_j then folds the match length in, and
        # E[tokens | k] = 1 + sum_j prod a_i holds for a drafter that proposes min(k, its match).
        j = np.arange(1, len(self.reached) + 1)[:, None]
        ks, m = outcome.ks[None, :], outcome.accepted[None, :]
        self.reached += ((ks > 0) & (m >= j - 1)).sum(axis=1)
        self.accepted += (m >= j).sum(axis=1)
        self.num_drafts += int((outcome.ks > 0).sum())
        self.num_request_steps += len(outcome.ks)
        self.num_tokens += int(outcome.accepted.sum()) + len(outcome.ks)


@dataclass
class Lab:
    """Caches loaded profiles, measured priors and simulated points.

    ``root`` is the profiles folder (``Setting`` paths are relative to it); ``draft_share`` the f of the
    mixed-step cost (``tabletune.cost``), measured on the engine the profiles come from; that engine drafts
    every row until the longest draft ends (``draft_rows = "batch"``).
    """

    root: Path
    draft_share: float = 1.0
    draft_share_source: str = "the engine's padding rule"
    duration_s: float = 20.0
    max_num_seqs: int = 128
    noise_cv: float = 0.0
    jobs: int = 1  # worker processes for grid()
    points: dict[tuple, Point] = field(default_factory=dict)
    _costs: dict[str, StepCost] = field(default_factory=dict)
    _priors: dict[str, tuple[tuple[float, ...], float]] = field(default_factory=dict)
    _yields: dict[str, tuple[DraftYield, ...]] = field(default_factory=dict)
    _traces: dict[str, NgramStreams] = field(default_factory=dict)

    def cost(self, setting: Setting) -> StepCost:
        if setting.profile not in self._costs:
            self._costs[setting.profile] = StepCost(setting.step_profile(self.root), self.draft_share,
                                                     draft_rows="batch")
        return self._costs[setting.profile]

    def ngram_replay(self, setting: Setting) -> NgramStreams | None:
        if setting.ngram_trace is None:
            return None
        if setting.ngram_trace not in self._traces:
            self._traces[setting.ngram_trace] = load_ngram_trace(self.root / setting.ngram_trace)
        return self._traces[setting.ngram_trace]

    def simulator(self, setting: Setting, load: int, seed: int, schedule: Schedule | None = None,
                  duration_s: float | None = None) -> Simulator:
        config = SimConfig(duration_s=duration_s or self.duration_s, load=load, max_num_seqs=self.max_num_seqs,
                           noise_cv=self.noise_cv, seed=seed)
        return Simulator(self.cost(setting), schedule or Schedule.constant(setting.workload(self.root)), config,
                         default_drafter=setting.default_drafter, ngram_replay=self.ngram_replay(setting))

    def measured_prior(self, setting: Setting) -> tuple[tuple[float, ...], float]:
        """Offline (rates, q): acceptance accepted_j / reached_j (censoring-correct) and the share of
        request-steps that drafted, at fixed k_max, as the tuner measures them."""
        if setting.name not in self._priors:
            self._priors[setting.name] = measure_prior(self.simulator(setting, 16, CALIBRATION_SEED, duration_s=30.0))
        return self._priors[setting.name]

    def measured_rates(self, setting: Setting) -> tuple[float, ...]:
        return self.measured_prior(setting)[0]

    def measured_yields(self, setting: Setting) -> tuple[DraftYield, ...]:
        """A drafter that proposes only on a match (n-gram): tokens per request-step and q at each k, from
        calibration runs at fixed k (load 16, the calibration seed), as the tuner would measure them."""
        if setting.default_drafter != NGRAM:
            return ()
        if setting.name not in self._yields:
            ks = [k for k in self.cost(setting).ks if k <= len(self.measured_rates(setting))]
            self._yields[setting.name] = tuple(
                measure_yield(self.simulator(setting, 16, CALIBRATION_SEED, duration_s=20.0), k) for k in ks)
        return self._yields[setting.name]

    def run(self, setting_name: str, policy: str, load: int, seed: int, *, prior: Sequence[float] | None = None,
            schedule: Schedule | None = None, duration_s: float | None = None, tag: str = ""):
        """Simulate one point (cached by its arguments); returns the SimResult's Point."""
        key = (setting_name, policy, load, seed, tuple(prior) if prior else None, tag, duration_s)
        if key not in self.points:
            setting = SETTINGS[setting_name]
            sim = self.simulator(setting, load, seed, schedule, duration_s)
            rates, q = self.measured_prior(setting)
            ctx = sim.context(prior_rates=tuple(prior) if prior else rates, prior_draft_rate=q)
            ctx = dataclasses.replace(ctx, prior_yields=self.measured_yields(setting))
            result = sim.run(make_policy(policy, ctx))
            self.points[key] = Point(setting_name, policy, load, seed, result.throughput_tok_s, result.mean_k,
                                     result.acceptance, result.tpot_ms)
            self.last_result = result
        return self.points[key]

    def grid(self, setting: str, policies: Sequence[str], loads: Sequence[int], seeds: Sequence[int],
             prior: Sequence[float] | None = None) -> list[Point]:
        """All (policy, load, seed) points, simulated on ``jobs`` processes when there is more than one."""
        tasks = [(setting, p, n, s, tuple(prior) if prior else None) for p in policies for n in loads for s in seeds]
        todo = [t for t in tasks if (*t, "", None) not in self.points]
        if self.jobs > 1 and len(todo) > 1:
            self.measured_prior(SETTINGS[setting])  # once, before the workers fork
            self.measured_yields(SETTINGS[setting])
            self.ngram_replay(SETTINGS[setting])
            for t, point in zip(todo, self.parallel(_work, todo)):
                self.points[(*t, "", None)] = point
        return [self.run(setting, p, n, s, prior=prior) for (_, p, n, s, _) in tasks]


    def parallel(self, fn: Callable[[tuple], object], tasks: Sequence[tuple]) -> list:
        """[fn(t) for t in tasks] on ``jobs`` forked processes; fn is module-level and may use ``lab()``."""
        global _LAB
        _LAB = self
        if self.jobs <= 1 or len(tasks) <= 1:
            return [fn(t) for t in tasks]
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(self.jobs, mp_context=ctx) as pool:
            return list(pool.map(fn, tasks, chunksize=max(1, len(tasks) // (4 * self.jobs))))


def lab() -> Lab:
    """The Lab of the process that forked this worker (set by ``Lab.parallel``)."""
    assert _LAB is not None
    return _LAB


def measure_prior(sim: Simulator) -> tuple[tuple[float, ...], float]:
    """(rates, q) of a calibration run at fixed k_max (``Lab.measured_prior``)."""
    ctx = sim.context()
    policy = _Measuring(ctx, ctx.k_max)
    sim.run(policy)
    reached = np.maximum(policy.reached, 1.0)
    rates = np.clip(policy.accepted / reached, 1e-3, 1.0)
    q = policy.num_drafts / max(policy.num_request_steps, 1)
    return tuple(round(float(r), 4) for r in rates), round(min(max(q, 1e-3), 1.0), 4)


def fixed_policies(lab: Lab, setting: str) -> list[str]:
    ks = [k for k in lab.cost(SETTINGS[setting]).ks if k <= len(lab.measured_rates(SETTINGS[setting]))]
    return [f"fixed:{k}" for k in ks]


_LAB: Lab | None = None  # the parent's Lab, inherited by forked workers


def _work(task: tuple) -> Point:
    setting, policy, load, seed, prior = task
    return lab().run(setting, policy, load, seed, prior=prior)



def measure_yield(sim: Simulator, k: int) -> DraftYield:
    """Tokens per request-step and draft rate of a run at fixed k."""
    policy = _Measuring(sim.context(), k)
    sim.run(policy)
    steps = max(policy.num_request_steps, 1)
    return DraftYield(k, min(policy.num_tokens / steps, k + 1.0), policy.num_drafts / steps)


def measure_rates(sim: Simulator) -> tuple[float, ...]:
    """The rates of ``measure_prior`` alone."""
    return measure_prior(sim)[0]
