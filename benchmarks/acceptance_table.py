"""The committed acceptance set of SmolLM2-135M: measure it, and summarise it as markdown tables.

Three modes:

* ``--measure [ngram] [early-exit]``: first measure every drafter x workload x temperature on the CPU
  (``tabletune acceptance``, niced), writing ``profiles/acceptance/<drafter>_<workload>_T<t>.json`` (+ ``.detail.json``)
  and ``profiles/traces/<drafter>_<workload>_T<t>.csv.gz``. Target continuations are cached under
  ``.cache/tabletune/trajectories`` and shared by the drafters. Sizes: the first ``--num-prompts`` prompts of
  each workload (extraction has 10), up to ``--max-new-tokens`` generated tokens, k = 8; the early-exit drafter
  uses the first ``--exit-layer`` of SmolLM2's 30 layers (28, as ``tabletune acceptance``).
* default: a_1..a_8 per (workload, drafter, temperature) of the n-gram and early-exit profiles, written to
  ``benchmarks/results/acceptance_table.md`` (summarised in docs/results.md) and printed.
* ``--eagle``: the held-out table of the trained EAGLE head from ``profiles/acceptance/eagle_*.json``, the
  table ``tabletune drafter eval`` prints (``tabletune.drafter.evaluate``), with a_1 .. a_7; printed only.

    python benchmarks/acceptance_table.py --measure            # measure all phases, then the table
    python benchmarks/acceptance_table.py --measure ngram      # one phase: ngram | early-exit
    python benchmarks/acceptance_table.py                      # the table of the committed profiles
    python benchmarks/acceptance_table.py --eagle              # the trained head's held-out table
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tabletune import fileio
from tabletune.acceptance import AcceptanceProfile
from tabletune.assets import WORKLOADS
from tabletune.drafter.evaluate import format_table, held_out_row
from tabletune.integrations.hf.measure import detail_path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "profiles" / "acceptance"
TRACES = ROOT / "profiles" / "traces"
OUT = Path(__file__).resolve().parent / "results" / "acceptance_table.md"
PHASES = ("ngram", "early-exit")
MEASURED = ("code", "code-edit", "chat", "math", "extraction")


def measure(phases: list[str], num_prompts: int, max_new_tokens: int, exit_layer: int) -> None:
    """``tabletune acceptance`` for every workload and T in 0, 1 of each phase's drafter (module docstring)."""
    env = {**os.environ, "TABLETUNE_TORCH_THREADS": os.environ.get("TABLETUNE_TORCH_THREADS", "1")}
    for drafter in phases:
        extra = ["--exit-layer", str(exit_layer)] if drafter == "early-exit" else []
        for t in (0, 1):
            for w in MEASURED:
                name = f"{drafter}_{w}_T{t}"
                cmd = ["nice", "-n", "19", sys.executable, "-m", "tabletune", "acceptance", "--drafter", drafter,
                       "--workload", w, "--temperature", str(t), "--k-max", "8", "--num-prompts", str(num_prompts),
                       "--max-new-tokens", str(max_new_tokens), "--batch-size", str(num_prompts),
                       "--out", str(PROFILES / f"{name}.json"), "--trace-out", str(TRACES / f"{name}.csv.gz"), *extra]
                subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def drift(detail: dict) -> str:
    """a_1 in the first and the last generation-position bucket that has >= 10 drafts."""
    buckets = [b for b in detail["by_generation_position"] if b["num_drafts"] >= 10 and b["rates"][0] is not None]
    if len(buckets) < 2:
        return "-"
    return f"{buckets[0]['rates'][0]:.2f}→{buckets[-1]['rates'][0]:.2f}"


def row(path: Path) -> str | None:
    if not path.exists():
        return None
    entry = AcceptanceProfile.load(path).entries[0]
    detail = json.loads(detail_path(path).read_text())
    rates = " | ".join("-" if r is None else f"{r:.2f}" for r in entry.rates())
    per_request = [r["mean_accepted_length"] for r in detail["requests"] if r["mean_accepted_length"] is not None]
    spread = (f"{min(per_request):.1f}/{statistics.median(per_request):.1f}/{max(per_request):.1f}"
              if per_request else "-")
    return (f"| {entry.workload} | {entry.drafter} | {entry.temperature:g} | {rates} | {entry.num_drafts} "
            f"| {entry.mean_accepted_length():.2f} | {detail['tokens_per_step']:.2f} | {spread} | {drift(detail)} |")


def drafter_table() -> str:
    """The n-gram and early-exit profiles, one row per (workload, T, drafter)."""
    lines = ["| workload | drafter | T | " + " | ".join(f"a_{j}" for j in range(1, 9)) +
             " | drafts | mean acc. | tok/step | per-request acc. min/med/max | a_1 drift |",
             "|" + "---|" * 16]
    for w in WORKLOADS:
        for t in ("0", "1"):
            for d in PHASES:
                line = row(PROFILES / f"{d}_{w}_T{t}.json")
                if line:
                    lines.append(line)
    return "\n".join(lines) + "\n"


def eagle_table() -> str:
    """The trained head's held-out table (``tabletune drafter eval``), k = 4."""
    rows = []
    for w in ("code", "chat"):
        for t in (0, 1):
            path = PROFILES / f"eagle_{w}_T{t}.json"
            if path.exists():
                detail = json.loads(detail_path(path).read_text())
                rows.append(held_out_row(AcceptanceProfile.load(path).entries[0], w, t, detail["num_prompts"], k=4))
    return format_table(rows, num_rates=7)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", nargs="*", choices=PHASES, metavar="PHASE",
                    help="measure the set before the table (phases: ngram, early-exit; none given: both)")
    ap.add_argument("--eagle", action="store_true", help="print the trained EAGLE head's held-out table instead")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--exit-layer", type=int, default=28)
    args = ap.parse_args(argv)
    if args.measure is not None:
        measure(args.measure or list(PHASES), args.num_prompts, args.max_new_tokens, args.exit_layer)
    if args.eagle:
        print(eagle_table())
        return 0
    text = drafter_table()
    fileio.write_text(OUT, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
