"""Host time of a policy: a wrapper that times ``decide``, ``keep_drafting`` and ``observe`` per step.

``timed(policy)`` behaves as the policy (same name, features, stop rule) and appends, after each
``observe``, the step's host milliseconds (decide + every keep_drafting call + observe, wall
clock of this process) to ``host_ms``, and to ``critical_ms`` those that stay on the critical path of an engine
that runs ``observe`` while the next step runs and evaluates a stop rule on the device where the policy gives one
(``device_stop_rule``): decide, and keep_drafting where no device rule stands for it. A benchmark reports their
means over its measured steps as ``host_ms_per_step`` and ``host_ms_critical``.
"""

from __future__ import annotations

import time

import numpy as np

from tabletune.policies.base import (ALWAYS_DRAFT, BatchState, Decision, DraftFeatures, Policy, StepOutcome,
                                     draft_stop_of)


class Timed:
    """A policy with its host time per step recorded in ``host_ms``."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.label = getattr(inner, "label", None) or inner.name
        self.uses_features = inner.uses_features
        self.uses_lookup = bool(getattr(inner, "uses_lookup", False))
        self.observe_may_lag = bool(getattr(inner, "observe_may_lag", False))
        self.host_ms: list[float] = []
        self.critical_ms: list[float] = []
        self._pending_s = 0.0
        self._critical_s = 0.0

    @property
    def decides_ahead(self) -> bool:
        """The inner policy's, read when asked (it may change from step to step)."""
        return bool(getattr(self.inner, "decides_ahead", False))

    @property
    def launch_depth(self) -> int | None:
        """The inner policy's (``tabletune.sim.loop``: a launch that fixed the drafting depth), None without one."""
        return getattr(self.inner, "launch_depth", None)

    def decide(self, state: BatchState) -> Decision:
        t0 = time.perf_counter()
        out = self.inner.decide(state)
        spent = time.perf_counter() - t0
        self._pending_s += spent
        self._critical_s += spent
        return out

    def observe(self, outcome: StepOutcome) -> None:
        t0 = time.perf_counter()
        self.inner.observe(outcome)
        self.host_ms.append((self._pending_s + time.perf_counter() - t0) * 1e3)
        self.critical_ms.append(self._critical_s * 1e3)
        self._pending_s = self._critical_s = 0.0

    def mean_ms(self, start: int = 0) -> float:
        """Mean host ms per step over steps ``start``.. (NaN without steps)."""
        tail = self.host_ms[start:]
        return float(np.mean(tail)) if tail else float("nan")


class TimedStop(Timed):
    """``Timed`` for a policy that ends drafts (``DraftStop``)."""

    def keep_drafting(self, state: BatchState, features: DraftFeatures | None, j: int,
                      active: np.ndarray) -> np.ndarray:
        rule_of = getattr(self.inner, "device_stop_rule", None)
        on_device = rule_of is not None and rule_of(state) is not None  # an engine evaluates it there
        t0 = time.perf_counter()
        out = self.inner.keep_drafting(state, features, j, active)  # type: ignore[attr-defined]
        spent = time.perf_counter() - t0
        self._pending_s += spent
        if not on_device:
            self._critical_s += spent
        return out

    def device_stop_rule(self, state: BatchState):
        """The inner policy's rule for a device-side draft loop (None without one); its host time counts."""
        rule_of = getattr(self.inner, "device_stop_rule", None)
        if rule_of is None:
            return None
        t0 = time.perf_counter()
        out = rule_of(state)
        spent = time.perf_counter() - t0
        self._pending_s += spent
        self._critical_s += spent
        return out


def timed(policy: Policy) -> Timed:
    """The policy wrapped to record its host time per step."""
    return TimedStop(policy) if draft_stop_of(policy) is not ALWAYS_DRAFT else Timed(policy)
