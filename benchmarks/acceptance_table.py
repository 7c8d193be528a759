"""Summarise the committed acceptance profiles: a_1..a_8 per (workload, drafter, temperature).

Reads profiles/acceptance/<drafter>_<workload>_T<t>.json and its .detail.json; writes
benchmarks/results/acceptance_table.md (summarised in docs/results.md) and prints it.

    python benchmarks/acceptance_table.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tabletune import fileio
from tabletune.acceptance import AcceptanceProfile
from tabletune.assets import WORKLOADS
from tabletune.integrations.hf.measure import detail_path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "profiles" / "acceptance"
OUT = Path(__file__).resolve().parent / "results" / "acceptance_table.md"


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


def main() -> None:
    lines = ["| workload | drafter | T | " + " | ".join(f"a_{j}" for j in range(1, 9)) +
             " | drafts | mean acc. | tok/step | per-request acc. min/med/max | a_1 drift |",
             "|" + "---|" * 16]
    for w in WORKLOADS:
        for t in ("0", "1"):
            for d in ("ngram", "early-exit"):
                line = row(PROFILES / f"{d}_{w}_T{t}.json")
                if line:
                    lines.append(line)
    text = "\n".join(lines) + "\n"
    fileio.write_text(OUT, text)
    print(text)


if __name__ == "__main__":
    main()
