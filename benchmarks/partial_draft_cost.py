"""T(b, k) with drafts that partly miss: the built-in engine's step time when only some rows draft.

A drafter that proposes only on a match (n-gram) leaves rows undrafted. This times ragged steps in
which n = round(q b) rows draft k tokens and the others none, beside uniform steps T(b, k), and fits
the draft share f of ``tabletune.cost`` (``fit_draft_share``): measured = T(b, k_bar) + f (T(b, k) -
T(b, k_bar)), k_bar = n k / b. f = 1: a step costs its longest draft whatever the others do (rows
padded); f = 0: it costs its drafted tokens. Each row then has the error of the partial-draft model at
the fitted f, and at f = 0 (the linear draft-rate model) for comparison.

The goals of packed verification, at b = ``--goal-batch`` (128): one row drafting 7 among rows drafting
0 costs at most 0.6 T(b, 7); a quarter of the rows drafting 4 at most 0.8 T(b, 4).

    python benchmarks/partial_draft_cost.py --out benchmarks/results/partial_draft_cost          # H200
    python benchmarks/partial_draft_cost.py --quick --out out/partial_draft_cost                # CPU smoke

Writes OUT.json and OUT.md; ``tabletune report`` takes f from OUT.json when it is in the results folder.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
import torch

from tabletune import fileio
from tabletune.cost import MixedStep, StepCost, fit_draft_share
from tabletune.engine.profiling import ENGINE_VERSION, RUNNER, build_engine, device_name, time_steps
from tabletune.padding import geometric_batch_sizes
from tabletune.profile import Fingerprint, StepPoint, StepProfile

QUICK = {"model": "tiny", "device": "cpu", "loads": "2,4,8", "ks": "2,4", "k_max": 4, "context": 64, "steps": 3,
         "goal_batch": 8}
# (rows drafting: a count or a share of the batch, k, the most the step may cost as a share of T(b, k))
GOALS = ((1, 7, 0.6), (0.25, 4, 0.8))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--drafter", default="ngram", help="the engine's drafter (ngram, eagle, draft_model, ...)")
    ap.add_argument("--loads", default="2,4,16,64,128,256", help="batch sizes of the ragged steps")
    ap.add_argument("--ks", default="2,4,7", help="draft lengths of the drafting rows")
    ap.add_argument("--qs", default="0.25,0.5,0.75", help="shares of rows that draft")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per point (median)")
    ap.add_argument("--goal-batch", type=int, default=128, help="batch size of the packed-verification goals")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shape, tiny grid")
    ap.add_argument("--out", default="benchmarks/results/partial_draft_cost")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python benchmarks/partial_draft_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    loads = [int(x) for x in str(args.loads).split(",")]
    ks = [int(x) for x in str(args.ks).split(",")]
    qs = [float(x) for x in str(args.qs).split(",")]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    max_load = max(loads)
    # built as ``tabletune.engine.measure`` builds the engine of the profiles in profiles/h200/
    engine = build_engine(args.model, args.drafter, args.k_max, max_load, args.context, device=args.device,
                          dtype=dtype, buckets=tuple(geometric_batch_sizes(max_load)))
    fp = Fingerprint(engine="builtin", engine_version=ENGINE_VERSION, device=device_name(engine),
                     model=f"{args.model} (shape, random weights)", dtype=str(dtype).removeprefix("torch."),
                     runner=RUNNER + "+ragged", drafter=args.drafter, command=command)
    points, rows = [], []
    for b in loads:
        engine.set_context(b, args.context)
        for k in range(args.k_max + 1):
            s = time_steps(engine, b, k, args.steps, args.context)
            points.append(StepPoint(b, k, tuple(round(x, 4) for x in s)))
        for k in ks:
            for q in qs:
                n = min(max(int(round(q * b)), 1), b - 1)
                pattern = [k] * n + [0] * (b - n)
                measured_ms = statistics.median(time_steps(engine, b, pattern, args.steps, args.context))
                rows.append({"batch_size": b, "k": k, "drafting_rows": n, "q": round(n / b, 4),
                             "measured_ms": round(measured_ms, 4)})
        print(f"b={b}: {len(points)} uniform points, {len(rows)} ragged", flush=True)
    profile = StepProfile(points=tuple(points), context_len=args.context, fingerprint=fp)
    steps = [MixedStep(r["batch_size"], r["k"], r["k"] * r["q"], r["measured_ms"]) for r in rows]
    f = fit_draft_share(profile, steps)
    for r in rows:
        ks_row = np.array([r["k"]] * r["drafting_rows"] + [0] * (r["batch_size"] - r["drafting_rows"]))
        for label, share in (("fitted", f), ("linear", 0.0), ("padded", 1.0)):
            pred = StepCost(profile, share).mixed_ms(ks_row)
            r[f"error_{label}"] = round(r["measured_ms"] / pred - 1, 4)
    worst = {label: max(abs(r[f"error_{label}"]) for r in rows) for label in ("fitted", "linear", "padded")}
    goals = goal_rows(engine, profile, args) if args.goal_batch in loads else []
    result = {"schema": "tabletune.partial_draft_cost", "version": 2, "device": fp.device, "command": command,
              "fitted_draft_share": round(f, 4), "worst_abs_error": worst, "profile": profile.to_json(),
              "rows": rows, "goals": goals}
    fileio.write_json(args.out + ".json", result)
    fileio.write_text(args.out + ".md", markdown(result))
    print(f"fitted draft share f = {f:.3f}; worst |error| fitted {worst['fitted']:.1%}, linear (f=0) "
          f"{worst['linear']:.1%}, padded (f=1) {worst['padded']:.1%}", flush=True)
    return 0


def goal_rows(engine, profile: StepProfile, args) -> list[dict]:
    """The GOALS at b = goal_batch (k clamped to k_max): measured step over the uniform T(b, k)."""
    b, out = args.goal_batch, []
    engine.set_context(b, args.context)
    for rows, k, limit in GOALS:
        k = min(k, args.k_max)
        n = rows if isinstance(rows, int) else int(round(rows * b))
        measured_ms = statistics.median(time_steps(engine, b, [k] * n + [0] * (b - n), args.steps, args.context))
        uniform_ms = profile.step_ms(b, k)
        out.append({"batch_size": b, "k": k, "drafting_rows": n, "measured_ms": round(measured_ms, 4),
                    "uniform_ms": round(uniform_ms, 4), "ratio": round(measured_ms / uniform_ms, 4), "limit": limit,
                    "met": measured_ms <= limit * uniform_ms})
        print(f"goal b={b} {n} rows of k={k}: {measured_ms:.3f} ms = {measured_ms / uniform_ms:.2f} x T(b, k) "
              f"(limit {limit})", flush=True)
    return out


def markdown(result: dict) -> str:
    w = result["worst_abs_error"]
    md = [f"# Partial-draft step cost: {result['device']}", "",
          f"Fitted draft share f = {result['fitted_draft_share']}; worst |error| of the partial-draft cost: "
          f"{w['fitted']:.1%} fitted, {w['linear']:.1%} linear (f = 0), {w['padded']:.1%} padded (f = 1).", "",
          "| b | k | drafting rows | measured ms | error fitted | error f=0 | error f=1 |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['batch_size']} | {r['k']} | {r['drafting_rows']} | {r['measured_ms']} | {r['error_fitted']:+.1%} | "
           f"{r['error_linear']:+.1%} | {r['error_padded']:+.1%} |" for r in result["rows"]]
    if result["goals"]:
        md += ["", "Packed verification goals: a ragged step against the uniform step of its longest draft.", "",
               "| b | k | drafting rows | measured ms | T(b, k) ms | ratio | limit | met |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {g['batch_size']} | {g['k']} | {g['drafting_rows']} | {g['measured_ms']} | {g['uniform_ms']} | "
               f"{g['ratio']:.2f} | {g['limit']} | {'yes' if g['met'] else 'no'} |" for g in result["goals"]]
    return "\n".join(md + ["", f"Command: `{result['command']}`"]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
