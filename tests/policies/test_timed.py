"""The host-time wrapper: what it counts on the critical path, per step."""

import numpy as np
import pytest
from per_request_helpers import starter_cost

from tabletune.policies import make_policy
from tabletune.policies.timed import timed
from tabletune.sim import Schedule, SimConfig, Simulator, preset


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class _Slow:
    """Each hook advances the clock by a known time; a stop rule the device can evaluate when ``device`` is set."""

    name = label = "slow"
    uses_features = False
    observe_may_lag = True

    def __init__(self, clock: _Clock, device: bool) -> None:
        self.clock, self.device = clock, device

    def decide(self, state):
        self.clock.now_s += 0.002

    def keep_drafting(self, state, features, j, active):
        self.clock.now_s += 0.004
        return active

    def device_stop_rule(self, state):
        return "rule" if self.device else None

    def observe(self, outcome):
        self.clock.now_s += 0.008


def test_critical_ms_is_decide_and_the_stop_rule_the_device_cannot_take(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("tabletune.policies.timed.time.perf_counter", clock)
    for device, critical in ((True, 2.0), (False, 6.0)):
        policy = timed(_Slow(clock, device))
        for _ in range(3):
            policy.decide(None)
            policy.keep_drafting(None, None, 1, np.ones(2, bool))
            policy.observe(None)
        assert policy.host_ms == pytest.approx([14.0] * 3)
        assert policy.critical_ms == pytest.approx([critical] * 3)


def test_the_per_request_controller_keeps_its_stop_rule_and_observe_off_the_critical_path():
    """In the simulator (stop rules on the host) the controller's critical host time is its decide alone."""
    sim = Simulator(starter_cost(), Schedule.constant(preset("code")), SimConfig(duration_s=1.0, load=8, seed=0))
    policy = timed(make_policy("controller:per-request", sim.context()))
    assert sim.run(policy).throughput_tok_s > 0
    host, critical = np.array(policy.host_ms), np.array(policy.critical_ms)
    assert len(host) == len(critical) > 20 and (critical < host).all()
    assert critical.mean() < 0.5 * host.mean()
