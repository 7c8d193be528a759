"""The tuner: a measurement plan over any ``Engine``, its close calls, and the files it writes.

* ``protocol``: what an engine adapter implements (``Engine``, ``EngineSpec``, ``StepSamples``);
* ``plan``: how long and where to measure (``TunePlan``, ``check_grid``);
* ``measure``: T(b, k) points, the interference filter and rechecks;
* ``close_calls``: refinement midpoints and close calls, re-measured;
* ``run``: one whole run (``run_plan`` -> ``TuneOutcome``);
* ``files``: the run's folder (``write_run``) and the gains it predicts; no plotting.

Nothing here imports torch, vllm or matplotlib.
"""

from tabletune.tuner.plan import TunePlan, check_grid
from tabletune.tuner.protocol import Engine, EngineSpec, StepSamples
from tabletune.tuner.run import TuneOutcome, run_plan

__all__ = ["Engine", "EngineSpec", "StepSamples", "TuneOutcome", "TunePlan", "check_grid", "run_plan"]
