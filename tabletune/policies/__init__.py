"""The policy zoo and its registry: ``make_policy("fixed:3", ctx)``.

A spec is ``NAME`` or ``NAME:ARG``. Each registry entry names ``module:Class`` (or a
factory function); modules are imported lazily, so a missing optional module gives a
clear error only when its policy is asked for. A class is built with
``Class.from_spec(ctx, arg)`` when it defines it, else ``Class(ctx, **options)`` with
``options`` parsed from ``ARG`` = ``key=value,key=value`` (numbers become floats/ints).

The interface is in ``tabletune.policies.base``.
"""

from __future__ import annotations

import importlib

from tabletune.errors import InputError
from tabletune.policies.base import BatchState, Decision, DraftFeatures, Policy, PolicyContext, StepOutcome

REGISTRY: dict[str, str] = {
    "fixed": "tabletune.policies.fixed:FixedK",
    "off": "tabletune.policies.fixed:Off",
    "table": "tabletune.policies.static_table:StaticTable",
    "documented": "tabletune.policies.static_table:documented",
    "documented-div4": "tabletune.policies.static_table:documented_div4",
    "tabletune": "tabletune.policies.tuned_table:TunedTable",
    "controller": "tabletune.policies.controller:ControllerPolicy",
    "turbospec": "tabletune.policies.turbospec:TurboSpec",
    "nightjar": "tabletune.policies.nightjar:Nightjar",
    "sglang": "tabletune.policies.sglang:SglangPolicy",
    "disco": "tabletune.policies.disco:DiscoPolicy",
    "tapout": "tabletune.policies.tapout:TapOutPolicy",
    "dsde": "tabletune.policies.dsde:DsdePolicy",
    "gammatune": "tabletune.policies.gammatune:GammaTunePolicy",
    "adaptive-verification": "tabletune.policies.adaptive_verification:AdaptiveVerificationPolicy",
    "hybrid-spark": "tabletune.policies.hybrid_spark:HybridSparkPolicy",
    "hybrid-static": "tabletune.policies.hybrid_static:HybridStaticPolicy",
    "vllm-av": "tabletune.policies.vllm_av:VllmAdaptiveVerification",
}

#: Per-step (one k per batch) policies and per-request policies, for the experiments.
BATCH_POLICIES = ("fixed", "off", "table", "documented", "documented-div4", "tabletune", "controller",
                  "turbospec", "nightjar", "sglang")
PER_REQUEST_POLICIES = ("disco", "tapout", "dsde", "gammatune", "adaptive-verification", "hybrid-spark",
                        "hybrid-static", "vllm-av")


def parse_options(arg: str | None, source: str = "--policy") -> dict[str, object]:
    """'a=1,b=0.5,c=x' -> {'a': 1, 'b': 0.5, 'c': 'x'}."""
    out: dict[str, object] = {}
    if not arg:
        return out
    for part in arg.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise InputError(source, "policy options", arg, f"expected key=value, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        out[key.replace("-", "_")] = _number(value)
    return out


def _number(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def resolve(name: str) -> object:
    """The class or factory registered under ``name``; InputError if unknown or not importable."""
    if name not in REGISTRY:
        raise InputError("--policy", "name", name, f"unknown policy; choose one of {sorted(REGISTRY)}")
    module_name, attr = REGISTRY[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise InputError("--policy", "name", name, f"policy module {module_name} is not available") from None
        raise
    return getattr(module, attr)


def make_policy(spec: str, ctx: PolicyContext) -> Policy:
    """Build the policy ``NAME[:ARG]`` for a context."""
    name, _, arg = spec.partition(":")
    target = resolve(name.strip())
    arg = arg if arg != "" else None
    if hasattr(target, "from_spec"):
        return target.from_spec(ctx, arg)  # type: ignore[union-attr]
    if isinstance(target, type):
        try:
            return target(ctx, **parse_options(arg))
        except TypeError as exc:
            raise InputError("--policy", name, arg, str(exc)) from None
    return target(ctx, arg)  # type: ignore[operator]


__all__ = ["REGISTRY", "BatchState", "Decision", "DraftFeatures", "Policy", "PolicyContext", "StepOutcome",
           "make_policy", "parse_options", "resolve"]
