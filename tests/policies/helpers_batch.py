"""Small builders for the per-step policy tests: a context on a hand-made profile, states and outcomes."""

from __future__ import annotations

import numpy as np

from tabletune.policies.base import MODEL, BatchState, PolicyContext, StepOutcome
from tabletune.profile import StepPoint, StepProfile
from tabletune.cost import StepCost


def linear_profile(bs=(1, 8, 64, 128), ks=range(6), t0=10.0, per_b=0.1, per_k=1.0, per_bk=0.05) -> StepProfile:
    """T(b, k) = t0 + per_b b + per_k k + per_bk b k: cheap k at small b, expensive at large b."""
    pts = [StepPoint(b, k, (t0 + per_b * b + per_k * k + per_bk * b * k,)) for b in bs for k in ks]
    return StepProfile(points=tuple(pts), context_len=0)


def ctx(rates=(0.8, 0.75, 0.7, 0.65, 0.6), profile=None, max_num_seqs=128) -> PolicyContext:
    profile = profile or linear_profile()
    ks = tuple(k for k in profile.ks if k <= len(rates))
    return PolicyContext(cost=StepCost(profile), prior_rates=tuple(rates), ks=ks,
                         max_num_seqs=max_num_seqs)


def state(b: int, step: int = 0, time_s: float = 0.0) -> BatchState:
    return BatchState(step=step, time_s=time_s, request_ids=np.arange(b, dtype=np.int64),
                      num_generated=np.zeros(b, np.int64))


def outcome(st: BatchState, ks, accepted, step_ms: float = 10.0) -> StepOutcome:
    ks = np.asarray(ks, dtype=np.int64)
    return StepOutcome(state=st, ks=ks, drafter=np.full(len(ks), MODEL), accepted=np.asarray(accepted, np.int64),
                       step_ms=step_ms)
