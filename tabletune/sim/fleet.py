"""Several engines behind a router, with open-loop arrivals (the shape of an llm-d deployment).

Each replica is one ``Simulator`` run (its own policy, its own acceptance draws, its own
clock); requests arrive in one Poisson stream at ``arrival_rate`` requests/s and a router
sends each to a replica when it arrives:

* ``round-robin``: replicas in turn;
* ``least-loaded``: the replica with the fewest running + waiting requests (ties: lowest index),
  as llm-d's load-aware scorers do in spirit (this is not llm-d's scorer).

Event order: the replica whose clock is furthest behind steps next; an arrival is routed as
soon as no replica's clock is behind it. A replica's state at routing time is therefore the
state after its last step that started before the arrival (llm-d likewise routes on scraped,
slightly stale load). Request attributes come from one stream in arrival order, so every
policy sees the same requests at the same times; each replica draws acceptance from its own
stream (seed, replica index). Pure numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tabletune.policies.base import Policy
from tabletune.sim.loop import _Run
from tabletune.sim.metrics import RequestLog, SimResult, StepLog
from tabletune.sim.simulator import Simulator

ROUTERS = ("round-robin", "least-loaded")


def route(router: str, loads: Sequence[int], turn: int) -> int:
    """The replica an arrival goes to.

    round-robin: ``turn mod n``, where ``turn`` counts the arrivals routed before this one;
    least-loaded: ``argmin_i loads[i]`` (running + waiting requests), ties to the lowest index.
    """
    if router == "round-robin":
        return turn % len(loads)
    return min(range(len(loads)), key=loads.__getitem__)


@dataclass(frozen=True)
class FleetResult:
    replicas: tuple[SimResult, ...]
    routes: tuple[int, ...] = ()  # the replica of each arrival, in arrival order

    @property
    def combined(self) -> SimResult:
        """All replicas' steps and requests as one result (time = the longest replica's)."""
        steps = StepLog(*(np.concatenate([getattr(r.steps, f.name) for r in self.replicas])
                          for f in dataclasses.fields(StepLog)))
        requests = RequestLog(*(np.concatenate([getattr(r.requests, f.name) for r in self.replicas])
                                for f in dataclasses.fields(RequestLog)))
        return SimResult(self.replicas[0].policy, max(r.duration_s for r in self.replicas), steps, requests)

    def summary(self) -> dict:
        out = self.combined.summary()
        out["replicas"] = [r.summary() for r in self.replicas]
        return out


def run_fleet(sim: Simulator, make_policy: Callable[[int], Policy], replicas: int, router: str) -> FleetResult:
    """``replicas`` engines, each with ``make_policy(i)``, fed by ``router``; ``sim.config`` must be open loop."""
    cfg = sim.config
    if cfg.arrival_rate is None:
        raise ValueError("a fleet needs open-loop arrivals (arrival_rate)")
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    runs = []
    for i in range(replicas):
        replica = Simulator(sim.cost, sim.schedule, dataclasses.replace(cfg, seed=cfg.seed * 1009 + i + 1),
                            default_drafter=sim.default_drafter, replay=sim.replay)
        run = _Run(replica, make_policy(i))
        run.external = True
        runs.append(run)
    rng_req = np.random.default_rng([cfg.seed, 1])
    rng_arrival = np.random.default_rng([cfg.seed, 2])
    next_arrival_s = rng_arrival.exponential(1.0 / cfg.arrival_rate)
    next_id = 0
    routes: list[int] = []
    while True:
        busy = [r.time_s if (len(r.reqs) or r.queue) else np.inf for r in runs]
        i = int(np.argmin(busy))
        if next_arrival_s <= busy[i]:
            if next_arrival_s >= cfg.duration_s:
                break
            routes.append(route(router, [len(r.reqs) + len(r.queue) for r in runs], len(routes)))
            target = runs[routes[-1]]
            target.queue.append(sim.new_requests(1, next_arrival_s, rng_req, next_id))
            next_id += 1
            if not (len(target.reqs) or len(target.queue) > 1):  # idle: its clock jumps to the arrival
                target.time_s = max(target.time_s, next_arrival_s)
            next_arrival_s += rng_arrival.exponential(1.0 / cfg.arrival_rate)
            continue
        run = runs[i]
        if run.time_s >= cfg.duration_s:
            break
        run.admit()
        run.step()
    return FleetResult(tuple(r.result() for r in runs), tuple(routes))
