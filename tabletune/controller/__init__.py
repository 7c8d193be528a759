"""The online controller: re-estimate acceptance while serving and correct the draft table.

``controller`` (the ``Controller`` class), ``estimator`` (observations and decayed
censored counts), ``config`` (``ControllerConfig``). No torch, no vllm.
"""

from tabletune.controller.config import ControllerConfig
from tabletune.controller.controller import Controller, load_controller, prior_draft_rate, prior_rates
from tabletune.controller.estimator import (
    CumulativeCounters,
    DecayedAcceptance,
    DecayedDraftRate,
    StepObservation,
)

__all__ = [
    "Controller",
    "ControllerConfig",
    "CumulativeCounters",
    "DecayedAcceptance",
    "DecayedDraftRate",
    "StepObservation",
    "load_controller",
    "prior_draft_rate",
    "prior_rates",
]
