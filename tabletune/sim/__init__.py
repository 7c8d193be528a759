"""Discrete-event serving simulator: continuous batching over measured step times and modelled acceptance.

Entry points: ``Simulator(cost, schedule, config).run(policy) -> SimResult``;
``Workload``/``Schedule`` (what requests look like over time), ``SimConfig`` (load,
duration, seed). Step times come from the core's ``tabletune.cost.StepCost``. The model
drafter's outcomes and signals are synthetic (``acceptance``) or replayed from measured
traces (``replay``, ``Simulator(..., replay=...)``). Pure numpy.
"""

from tabletune.sim.metrics import SimResult
from tabletune.sim.simulator import SimConfig, Simulator
from tabletune.sim.workload import PRESETS, Schedule, Workload, preset

__all__ = ["PRESETS", "Schedule", "SimConfig", "SimResult", "Simulator", "Workload", "preset"]
