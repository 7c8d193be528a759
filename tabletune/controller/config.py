"""Controller options (``TABLETUNE_CONTROLLER`` JSON), validated on construction.

See ``tabletune.controller.controller`` for what each option steers. No torch, no vllm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from tabletune.errors import InputError

DEFAULT_HALF_LIFE_TOKENS = 2000.0


@dataclass(frozen=True)
class ControllerConfig:
    k_max: int | None = None  # default: the largest k in the step profile
    max_batch: int | None = None  # default: the profile's largest batch size
    ks: tuple[int, ...] | None = None  # allowed k (e.g. those with CUDA graphs)
    prior_weight: float = 20.0  # pseudo-drafts per position
    prior_workload: str | None = None  # entry of the AcceptanceProfile to use as prior
    prior_temperature: float | None = None
    half_life_tokens: float | None = None  # draft tokens verified per position (default 2000)
    half_life_s: float | None = None  # or seconds
    explore_fraction: float = 0.02
    explore_min_evidence: float = 20.0  # also explore once a window while position k+1 has fewer drafts (0: off)
    min_gain: float = 0.01  # install only if some b gains more than this (modelled)
    min_install_interval_s: float = 1.0
    rebuild_interval_s: float = 0.2
    rebuild_every_steps: int = 32  # and at most once per this many observed steps
    rebuild_min_change: float = 0.002  # skip a rebuild while no rate moved this much since the last one
    warmup_drafts: int = 0  # drafts to see before the first install (the prior alone may justify one)
    observe_every_steps: int = 8  # engines batch this many steps into one observation (amortises its cost)
    draft_rate_prior: float | None = None  # prior draft rate q (default: the prior profile's, else 1)
    model_draft_rate: bool = False  # rebuild with the estimated q (opt-in; otherwise q is only reported)
    draft_share: float | None = None  # measured f of the partial-draft cost (``cost.partial_draft_ms``); None: linear

    def __post_init__(self) -> None:
        if self.half_life_s is None and self.half_life_tokens is None:
            object.__setattr__(self, "half_life_tokens", DEFAULT_HALF_LIFE_TOKENS)
        checks = [
            ("k_max", self.k_max, self.k_max is None or self.k_max >= 1, "must be >= 1"),
            ("max_batch", self.max_batch, self.max_batch is None or self.max_batch >= 1, "must be >= 1"),
            ("ks", self.ks, self.ks is None or (len(self.ks) > 0 and min(self.ks) >= 0),
             "must be non-empty and >= 0"),
            ("prior_weight", self.prior_weight, self.prior_weight >= 0, "must be >= 0"),
            ("half_life", (self.half_life_tokens, self.half_life_s),
             (self.half_life_tokens is None) != (self.half_life_s is None), "set exactly one of the two"),
            ("half_life_tokens", self.half_life_tokens, self.half_life_tokens is None or self.half_life_tokens > 0,
             "must be > 0"),
            ("half_life_s", self.half_life_s, self.half_life_s is None or self.half_life_s > 0, "must be > 0"),
            ("explore_fraction", self.explore_fraction, 0 <= self.explore_fraction <= 0.5, "must lie in [0, 0.5]"),
            ("explore_min_evidence", self.explore_min_evidence, self.explore_min_evidence >= 0, "must be >= 0"),
            ("min_gain", self.min_gain, self.min_gain >= 0, "must be >= 0"),
            ("min_install_interval_s", self.min_install_interval_s, self.min_install_interval_s >= 0, "must be >= 0"),
            ("rebuild_interval_s", self.rebuild_interval_s, self.rebuild_interval_s >= 0, "must be >= 0"),
            ("rebuild_every_steps", self.rebuild_every_steps, self.rebuild_every_steps >= 1, "must be >= 1"),
            ("rebuild_min_change", self.rebuild_min_change, self.rebuild_min_change >= 0, "must be >= 0"),
            ("warmup_drafts", self.warmup_drafts, self.warmup_drafts >= 0, "must be >= 0"),
            ("draft_rate_prior", self.draft_rate_prior,
             self.draft_rate_prior is None or 0 < self.draft_rate_prior <= 1, "must lie in (0, 1]"),
            ("draft_share", self.draft_share, self.draft_share is None or 0 <= self.draft_share <= 1,
             "must lie in [0, 1]"),
            ("observe_every_steps", self.observe_every_steps,
             self.observe_every_steps >= 1 and float(self.observe_every_steps).is_integer(), "must be an integer >= 1"),
        ]
        for name, value, ok, problem in checks:
            if not ok:
                raise InputError("controller config", name, value, problem)

    @classmethod
    def from_json(cls, obj: object, source: str = "TABLETUNE_CONTROLLER") -> ControllerConfig:
        """Options from a JSON object; unknown keys and wrong types are InputErrors."""
        if not isinstance(obj, Mapping):
            raise InputError(source, "<root>", obj, "must be a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in obj.items():
            if key not in fields:
                raise InputError(source, key, value, f"unknown option; known: {sorted(fields)}")
            if key == "ks" and value is not None:
                if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
                    raise InputError(source, key, value, "must be a list of integers")
                value = tuple(value)
            elif key == "model_draft_rate":
                if not isinstance(value, bool):
                    raise InputError(source, key, value, "must be true or false")
            elif value is not None and key not in ("prior_workload",):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise InputError(source, key, value, "must be a number")
            kwargs[key] = value
        return cls(**kwargs)
