"""Discrete-event serving simulator: continuous batching over measured step times and modelled acceptance.

Entry points: ``Simulator(cost, schedule, config).run(policy) -> SimResult``;
``StepCost`` (T(b,k) and mixed-length costing), ``Workload``/``Schedule`` (what
requests look like over time), ``SimConfig`` (load, duration, seed). Pure numpy.
"""

from tabletune.sim.cost import StepCost
from tabletune.sim.metrics import SimResult
from tabletune.sim.simulator import SimConfig, Simulator
from tabletune.sim.workload import PRESETS, Schedule, Workload, preset

__all__ = ["PRESETS", "Schedule", "SimConfig", "SimResult", "Simulator", "StepCost", "Workload", "preset"]
