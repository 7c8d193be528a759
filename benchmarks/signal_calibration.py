"""Calibrate the simulator's confidence-signal noise against measured per-token traces.

    .venv/bin/python benchmarks/signal_calibration.py

For each temperature-0 trace under profiles/traces/ (issue 7) that has a top-1 column, the AUC of the drafter's top-1
probability for acceptance; then the signal noise tau that reproduces the pooled AUC for the
experiments' EAGLE-like general rates and for the code preset, and the AUC of the default tau.
Writes benchmarks/results/signal_calibration.md.
"""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path

from tabletune.experiments.settings import GENERAL
from tabletune.sim.traces import auc, draft_log, signal_noise_for_auc, trace_top1_auc
from tabletune.sim.workload import PRESETS

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    lines = ["# Confidence-signal calibration", "", "| trace | tokens | top-1 AUC |", "|---|---|---|"]
    measured = []
    for path in sorted(glob.glob(str(ROOT / "profiles" / "traces" / "*_T0.csv.gz"))):
        try:
            value, n = trace_top1_auc(path)
        except ValueError:
            continue  # no top-1 column (n-gram) or one class only
        if n:
            measured.append((value, n))
            lines.append(f"| {Path(path).name} | {n} | {value:.3f} |")
    pooled = sum(a * n for a, n in measured) / sum(n for _, n in measured)
    lines += ["", f"Pooled (token-weighted): {pooled:.3f}.", ""]
    for w in (GENERAL, PRESETS["code"], PRESETS["chat"]):
        tau = signal_noise_for_auc(pooled, w)
        x, y = draft_log(dataclasses.replace(w, signal_noise=2.0), 4000, 7, 0).training_rows()
        lines.append(f"- rates of `{w.name}`: tau matching the pooled AUC = {tau:.2f}; "
                     f"default tau 2.0 gives AUC {auc(x[:, 0], y):.3f}")
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results" / "signal_calibration.md").write_text(text)


if __name__ == "__main__":
    main()
