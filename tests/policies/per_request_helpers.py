"""Shared fixtures-as-functions for the per-request policy tests (DISCO, TapOut, DSDE, ...)."""

from __future__ import annotations

import pathlib

import numpy as np

from tabletune.cost import StepCost
from tabletune.policies import make_policy
from tabletune.policies.base import MODEL, BatchState, DraftFeatures, PolicyContext, StepOutcome
from tabletune.profile import StepPoint, StepProfile, step_profile_from_csv
from tabletune.sim import SimConfig, Simulator, preset
from tabletune.sim.workload import Schedule

STARTER_8B = pathlib.Path(__file__).resolve().parents[2] / "profiles" / "starter" / "h200_qwen3-8b-shape_ctx1024_eagle-like.csv"
_COST: list[StepCost] = []


def starter_cost() -> StepCost:
    if not _COST:
        _COST.append(StepCost(step_profile_from_csv(STARTER_8B)))
    return _COST[0]


def make_ctx(prior=(0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5), ngram_rates=()) -> PolicyContext:
    cost = starter_cost()
    return PolicyContext(cost=cost, prior_rates=tuple(prior), ks=tuple(cost.ks), ngram_rates=tuple(ngram_rates))


def make_state(top1, entropy=None, margin=None, ngram_match_len=None, ngram_num_proposed=None, ids=None,
               step=0) -> BatchState:
    """A BatchState from a [b, k_max] top1 array; other features default to values consistent with it."""
    top1 = np.asarray(top1, dtype=float)
    b = top1.shape[0]
    entropy = np.asarray(entropy, dtype=float) if entropy is not None else -np.log(top1)
    margin = np.asarray(margin, dtype=float) if margin is not None else top1 - (1 - top1) / 2
    f = DraftFeatures(top1, entropy, margin,
                      np.asarray(ngram_match_len if ngram_match_len is not None else np.zeros(b), dtype=np.int64),
                      np.asarray(ngram_num_proposed if ngram_num_proposed is not None else np.zeros(b), dtype=np.int64))
    ids = np.arange(b, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    return BatchState(step=step, time_s=0.0, request_ids=ids, num_generated=np.zeros(b, np.int64), features=f)


def make_outcome(state: BatchState, ks, accepted, kl=None, finished=(), drafter=None, step_ms=10.0) -> StepOutcome:
    ks = np.asarray(ks, dtype=np.int64)
    drafter = np.full(len(ks), MODEL, np.int64) if drafter is None else np.asarray(drafter, dtype=np.int64)
    return StepOutcome(state=state, ks=ks, drafter=drafter, accepted=np.asarray(accepted, dtype=np.int64),
                       step_ms=step_ms, kl=None if kl is None else np.asarray(kl, dtype=float),
                       finished_ids=np.asarray(finished, dtype=np.int64))


def run_sim(spec: str, workload: str = "code", load: int = 8, duration_s: float = 3.0, seed: int = 0,
            default_drafter: int = MODEL, recorder=None, observer=None):
    """Run one policy spec in the simulator; ``recorder(decision, state)`` sees every decision and
    ``observer(outcome)`` every outcome."""
    sim = Simulator(starter_cost(), Schedule.constant(preset(workload)),
                    SimConfig(duration_s=duration_s, load=load, seed=seed), default_drafter=default_drafter)
    policy = make_policy(spec, sim.context())
    if recorder is not None:
        decide = policy.decide

        def recording(state):
            decision = decide(state)
            recorder(decision, state)
            return decision

        policy.decide = recording
    if observer is not None:
        observe = policy.observe

        def observing(outcome):
            observer(outcome)
            observe(outcome)

        policy.observe = observing
    return sim.run(policy), policy


def linear_cost(base_ms=10.0, per_k_ms=5.0, k_max=2, draft_share=0.0) -> StepCost:
    """T(b, k) = base + per_k * k for b in {1, 2, 4}: every verified slot of a batch of b costs per_k / b."""
    points = tuple(StepPoint(b, k, (base_ms + per_k_ms * k,)) for b in (1, 2, 4) for k in range(k_max + 1))
    return StepCost(StepProfile(points=points, context_len=1024), draft_share=draft_share)
