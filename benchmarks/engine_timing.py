"""Step times of the built-in engine for ``engine_policies.py``, and the engine's cost built from them.

T(b, k) of uniform steps (``measure_profile``; ``probe_step_ms`` for the estimate), ragged steps against
``StepCost.mixed_ms`` (``mixed_check``), planned steps with n-gram rows (``plan_check``) and drafting alone,
D(b, k) (``draft_profile``); ``engine_cost`` prices steps from them, ``reprice`` a file's checks by a cost.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from tabletune.cost import MixedStep, StepCost, fit_active_share, fit_draft_share
from tabletune.engine.profiling import time_steps
from tabletune.engine.runner import SpecEngine
from tabletune.policies.base import MODEL, NGRAM
from tabletune.profile import Fingerprint, StepPoint, StepProfile


def probe_step_ms(engine: SpecEngine, args, loads: list[int]) -> float:
    """Mean of T(b, k_max / 2) over the loads, a few steps each (for the estimate)."""
    ctx = args.prompt_len + args.output_len // 2
    times = []
    for b in loads:
        engine.set_context(b, ctx)
        times.append(statistics.median(time_steps(engine, b, args.k_max // 2, 3, ctx, warmup=1)))
    return sum(times) / len(times)


def measure_profile(engine: SpecEngine, args, fp: Fingerprint) -> StepProfile:
    ctx = args.prompt_len + args.output_len // 2
    points = []
    for b in engine.buckets:
        engine.set_context(b, ctx)
        for k in range(args.k_max + 1):
            s = time_steps(engine, b, k, args.profile_steps, ctx)
            points.append(StepPoint(b, k, tuple(round(x, 4) for x in s)))
    return StepProfile(points=tuple(points), context_len=ctx, fingerprint=fp)


def median_step_ms(engine: SpecEngine, num_rows: int, ctx: int, steps: int, step: Callable[[], None]) -> float:
    """Median wall ms of ``step()`` (which ends with a read), rows 0..num_rows-1 reset to ctx before each, after
    2 untimed runs."""
    out = []
    for i in range(steps + 2):
        engine.reset_rows(num_rows, ctx)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if i >= 2:
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def time_ragged(engine: SpecEngine, ks: list[int], steps: int, ctx: int, split: bool) -> float:
    """Median wall ms of a ragged step of these k_i (rows 0..b-1 reset to ctx before each); ``split``: draft
    k_max, read the signals, verify (a feature policy's step)."""
    if not split:
        return statistics.median(time_steps(engine, len(ks), ks, steps, ctx))
    slots = list(range(len(ks)))

    def step() -> None:
        for j in range(engine.k_max):
            engine.draft_position(slots, j, engine.k_max)
        engine.read_drafts(slots, engine.k_max)
        engine.read(engine.verify_drafted(slots, ks), len(ks), engine.k_max)
    return median_step_ms(engine, len(ks), ctx, steps, step)


def mixed_check(engine: SpecEngine, profile: StepProfile, args, loads: list[int]) -> dict:
    """Ragged step times against ``StepCost.mixed_ms`` (verification by tokens, D = f (T - T0)) at the simulator's
    f = 0.5 and at the f fitted to them, under the drafting rule (rows still drafting, ``fit_active_share``; or
    every row until the longest draft ends, ``fit_draft_share``) whose worst error is smaller."""
    ctx, k_top, rng = profile.context_len, args.k_max, random.Random(0)
    rows, ragged = [], []
    for b in loads:
        engine.set_context(b, ctx)
        patterns = {"one-long": [k_top] + [0] * (b - 1), "half": [k_top if i % 2 else 1 for i in range(b)],
                    "random": [rng.randrange(k_top + 1) for _ in range(b - 1)] + [k_top]}
        for name, ks in patterns.items():
            fused = time_ragged(engine, ks, args.profile_steps, ctx, False)
            split = time_ragged(engine, ks, args.profile_steps, ctx, True)
            ragged.append((np.array(ks), fused))
            rows.append({"batch_size": b, "pattern": name, "ks": ks if b <= 16 else None, "k_top": max(ks),
                         "k_bar": round(sum(ks) / b, 4), "measured_ms": round(fused, 4),
                         "split_ms": round(split, 4)})
    fits = {}
    for rows_rule in ("active", "batch"):  # an engine that compacts the draft batch, or one that drafts every row
        try:
            if rows_rule == "active":
                f = fit_active_share(profile, ragged)
            else:
                f = fit_draft_share(profile, [MixedStep(len(ks), int(ks.max()), float(ks.mean()), ms)
                                              for ks, ms in ragged])
        except ValueError:  # no mixed step (a batch of one): nothing to fit
            f = 1.0
        cost = StepCost(profile, draft_share=f, draft_rows=rows_rule)
        worst = max(abs(ms / cost.mixed_ms(ks) - 1) for ks, ms in ragged)
        fits[rows_rule] = (worst, f)
    rows_rule = min(fits, key=lambda r: fits[r][0])
    share = fits[rows_rule][1]
    for r, (ks, _) in zip(rows, ragged):
        for label, cost in (("sim_default", StepCost(profile, draft_share=0.5)),
                            ("fitted", StepCost(profile, draft_share=share, draft_rows=rows_rule))):
            pred = cost.mixed_ms(ks)
            r[f"predicted_ms_{label}"] = round(pred, 4)
            r[f"error_{label}"] = round(r["measured_ms"] / pred - 1, 4)
    return {"fitted_draft_share": round(share, 4), "draft_rows": rows_rule,
            "worst_abs_error_by_rule": {k: round(v[0], 4) for k, v in fits.items()}, "rows": rows,
            "worst_abs_error_sim_default": max(abs(r["error_sim_default"]) for r in rows),
            "worst_abs_error_fitted": max(abs(r["error_fitted"]) for r in rows)}


PLAN_CHECK_LOADS = (4, 16, 64, 128)
# (model rows' k, n-gram rows' k); (1, 7) and (4, 4) verify the same tokens, (1 + 1 + 7 + 1) / 2 = 4 + 1 a row, with
# rows padded to 8 positions and to 5: their verify_ms apart is the padding's cost
PLAN_CHECK_KS = ((2, 7), (2, 4), (1, 7), (4, 4))


def time_plan(engine: SpecEngine, ks: list[int], kinds: list[int], steps: int, ctx: int, split: bool,
              draft: bool = True, read: str = "") -> float:
    """Median ms of a planned step whose n-gram rows (``kinds``) verify the lookup's proposal: split as the
    scheduler runs it when they outrun the model rows (draft the model rows only, look up the n-gram rows, verify),
    or fused (every row drafts the longest k, the n-gram rows' drafts replaced by the lookup). ``draft=False``: the
    split step without its model drafting (the lookup and the verification alone). ``read``: the split step with
    its drafted signals read back on the host, ``"once"`` after the drafting (a policy that decides on them) or
    ``"each"`` after every drafted position (a stop rule evaluated on the host): the device waits from each read to
    the next launch."""
    slots = list(range(len(ks)))
    model = [s for s, g in zip(slots, kinds) if g == MODEL]
    ngram = [s for s, g in zip(slots, kinds) if g == NGRAM]
    k_model = max((k for k, g in zip(ks, kinds) if g == MODEL), default=0)

    def step() -> None:
        if split:
            for j in range(k_model if draft else 0):
                engine.draft_position(model, j, k_model)
                if read == "each" or (read == "once" and j == k_model - 1):
                    engine.read_drafts(model, j + 1)
            engine.lookup_rows(ngram)
            buf = engine.verify_drafted(slots, ks, kinds=kinds)
        else:
            buf = engine.launch(slots, ks, kinds=kinds)
        engine.read(buf, len(ks), engine.k_max)
    return median_step_ms(engine, len(ks), ctx, steps, step)


def plan_check(engine: SpecEngine, cost: StepCost, args, max_load: int) -> dict:
    """Planned steps with n-gram rows (half the rows, verifying longer than the model rows draft, or as long) against
    ``StepCost.mixed_ms``, which prices their verification only: the split step as the scheduler runs it, the fused
    one, the split one without its drafting (``verify_ms``, against ``StepCost.verify_ms`` at the mean verified
    length), and what the split costs beyond the price (``split_extra_ms``, per batch size, the median over
    patterns)."""
    ctx = cost.profile.context_len
    loads = [b for b in PLAN_CHECK_LOADS if b <= max_load] or [max(max_load, 2)]
    rows = []
    for b in loads:
        engine.set_context(b, ctx)
        for k_model, k_ngram in PLAN_CHECK_KS:
            k_model, k_ngram = min(k_model, args.k_max), min(k_ngram, args.k_max)
            ks, kinds = plan_rows(b, k_model, k_ngram)
            rows.append({"batch_size": b, "k_model": k_model, "k_ngram": k_ngram,
                         "split_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True), 4),
                         "fused_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, False), 4),
                         "verify_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True, draft=False),
                                            4),
                         "read_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True, read="once"), 4),
                         "read_each_ms": round(time_plan(engine, ks, kinds, args.profile_steps, ctx, True,
                                                         read="each"), 4),
                         **plan_price(cost, ks, kinds)})
    return {"rows": rows, "split_extra_ms": split_extra_ms(rows), **read_extra_ms(rows)}


def plan_rows(b: int, k_model: int, k_ngram: int) -> tuple[list[int], list[int]]:
    """(ks, kinds) of a plan-check step of b rows: the first b - b // 2 on the model chain at ``k_model``, the rest
    on the n-gram chain at ``k_ngram``."""
    kinds = [MODEL] * (b - b // 2) + [NGRAM] * (b // 2)
    return [k_model if g == MODEL else k_ngram for g in kinds], kinds


def plan_price(cost: StepCost, ks: list[int], kinds: list[int]) -> dict:
    """A plan-check step's price (its n-gram rows draft nothing) and its verification's at the mean verified
    length."""
    verified = np.array(ks)
    drafted = np.where(np.array(kinds) == MODEL, verified, 0)
    return {"priced_verify_ms": round(float(cost.verify_ms(len(ks), float(verified.mean()))), 4),
            "priced_ms": round(cost.mixed_ms(verified, drafted, drafted < verified), 4)}


def medians_by_batch(pairs) -> dict[str, float]:
    """(b, ms) pairs (one per plan-check pattern) as the median ms per batch size, keyed by b as a string."""
    by_b: dict[int, list[float]] = {}
    for b, ms in pairs:
        by_b.setdefault(b, []).append(ms)
    return {str(b): round(statistics.median(v), 4) for b, v in by_b.items()}


def split_extra_ms(rows: list[dict]) -> dict[str, float]:
    """Per batch size, the median over the plan check's patterns of what a split step costs beyond its price."""
    return medians_by_batch((r["batch_size"], r["split_ms"] - r["priced_ms"]) for r in rows)


def read_extra_ms(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per batch size, the medians over the plan check's patterns of what reading the drafted signals back costs a
    split step: once (``read_extra_ms``: read_ms - split_ms), and each read after a further drafted position
    (``position_read_extra_ms``: (read_each_ms - read_ms) / (model rows' k - 1), patterns drafting 2 or more);
    none from a plan check that did not time reads."""
    if any("read_ms" not in r for r in rows):
        return {}
    return {"read_extra_ms": medians_by_batch((r["batch_size"], r["read_ms"] - r["split_ms"]) for r in rows),
            "position_read_extra_ms": medians_by_batch(
                (r["batch_size"], (r["read_each_ms"] - r["read_ms"]) / (r["k_model"] - 1))
                for r in rows if r["k_model"] >= 2)}


def draft_profile(engine: SpecEngine, profile: StepProfile, args) -> dict:
    """D(b, k): the drafting of a step alone, timed at the profile's (b, k): positions 1..k of b rows (the split
    path's draft graphs), then a read of their signals, less the read alone. The rest of T(b, k) is verification;
    the share drafting takes falls with b as verifying k more tokens a row turns compute-bound."""
    ctx, rows = profile.context_len, []
    for b in profile.batch_sizes:
        engine.set_context(b, ctx)
        slots = list(range(b))

        def step(k: int = 0) -> None:
            for j in range(k):
                engine.draft_position(slots, j, k)
            engine.read_drafts(slots, max(k, 1))
        read_ms = median_step_ms(engine, b, ctx, args.profile_steps, step)
        rows.append({"batch_size": b, "draft_ms": [0.0] + [
            round(max(median_step_ms(engine, b, ctx, args.profile_steps, lambda k=k: step(k)) - read_ms, 0.0), 4)
            for k in range(1, args.k_max + 1)]})
    return {"rows": rows}


def engine_cost(profile: StepProfile, mixed: dict, drafts: dict | None = None, plans: dict | None = None) -> StepCost:
    """The engine's cost: its profile with the drafting rule the mixed-k check chose, drafting priced by the
    measured D(b, k) (``draft_profile``), else by the share of T(b, k) - T(b, 0) that check fitted, and a split
    step's extra (``StepCost.split_extra``) from the plan check where there is one."""
    rows_rule = mixed.get("draft_rows", "active")

    def pairs(name: str) -> tuple[tuple[int, float], ...]:  # (b, ms >= 0) of one of the plan check's extras
        return tuple(sorted((int(b), max(float(ms), 0.0)) for b, ms in (plans or {}).get(name, {}).items()))

    extras = {"split_extra": pairs("split_extra_ms"), "read_extra": pairs("read_extra_ms"),
              "position_read_extra": pairs("position_read_extra_ms")}
    if drafts is None:
        return StepCost(profile, draft_share=mixed["fitted_draft_share"], draft_rows=rows_rule, **extras)
    by_b = {r["batch_size"]: r["draft_ms"] for r in drafts["rows"]}
    # at most T(b, k) - T(b, 0): verifying k more tokens never costs less than verifying none
    cost = StepCost.split(profile, lambda b, k: min(by_b[b][k], profile.step_ms(b, k) - profile.step_ms(b, 0)),
                          draft_rows=rows_rule)
    return dataclasses.replace(cost, **extras)


def pricing(result: dict) -> str:
    """How the policies of a cell priced drafting: the measured D(b, k), or a share of T(b, k) - T(b, 0)."""
    return "draft profile" if result.get("draft_profile") else "draft share"


def reprice(result: dict, cost: StepCost) -> None:
    """The mixed-k and plan checks' steps priced by ``cost`` (the simulator's now, without a split step's extra,
    which the plan check's ``split_extra_ms`` then measures afresh)."""
    for r in result["mixed_check"]["rows"]:
        if r.get("ks") is not None:
            r["priced_ms"] = round(cost.mixed_ms(np.array(r["ks"])), 4)
    plans = result.get("plan_check")
    if plans:
        for r in plans["rows"]:
            r.update(plan_price(cost, *plan_rows(r["batch_size"], r["k_model"], r["k_ngram"])))
        plans["split_extra_ms"] = split_extra_ms(plans["rows"])
