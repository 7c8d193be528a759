"""Fit the per-request policies' offline models from logged drafts; save them as JSON.

The logged (features, accepted) pairs are tested tokens only (nothing after a draft's first
rejection) of issue 7's measured per-token traces, CSV or CSV.gz files with a header that names
at least ``draft_pos, top1_prob, entropy, margin, ngram_len, accepted``
(``tabletune.integrations.hf.replay.TRACE_COLUMNS``): rows of model drafters train DISCO, rows
with NaN probabilities (n-gram drafters) fit Hybrid Spark's table. (DISCO trained on the
simulator's drafts instead: ``python -m tabletune.sim.traces``.)

Usage (writes atomically)::

    python -m tabletune.policies.trace_fit disco --traces FILE_OR_DIR... --out FILE
    python -m tabletune.policies.trace_fit ngram --traces FILE_OR_DIR... --out FILE
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.errors import InputError
from tabletune.policies.disco_model import train_disco
from tabletune.policies.ngram_table import NgramTable
from tabletune.token_trace import prompt_half

TRACE_FIELDS = ("draft_pos", "top1_prob", "entropy", "margin", "ngram_len", "accepted")


def read_traces(*paths: str | Path, half: str | None = None) -> dict[str, np.ndarray]:
    """Columns of ``TRACE_FIELDS`` from trace files, or every *.csv / *.csv.gz under folders; with ``half``,
    only the rows of that half's prompts (``tabletune.token_trace.prompt_half``: fit on "calibration")."""
    files: list[Path] = []
    for path in map(Path, paths):
        found = sorted(path.glob("**/*.csv")) + sorted(path.glob("**/*.csv.gz")) if path.is_dir() else [path]
        if not found:
            raise InputError(str(path), "<files>", str(path), "no .csv or .csv.gz trace files")
        files += found
    cols: dict[str, list[float]] = {f: [] for f in TRACE_FIELDS}
    for file in files:
        raw = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
        reader = csv.DictReader(io.StringIO(raw.decode()))
        needed = TRACE_FIELDS + (("request",) if half is not None else ())
        missing = [f for f in needed if f not in (reader.fieldnames or [])]
        if missing:
            raise InputError(str(file), "<header>", reader.fieldnames, f"missing columns {missing}")
        for row in reader:
            if half is not None and prompt_half(row["request"]) != half:
                continue
            for f in TRACE_FIELDS:
                cols[f].append(float(row[f]) if row[f] not in ("", "nan", "NaN") else float("nan"))
    return {f: np.array(v) for f, v in cols.items()}


def trace_rows(cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """DISCO rows from model-drafter trace rows (those with a top-1 probability)."""
    model = ~np.isnan(cols["top1_prob"])
    x = np.stack([cols[f][model] for f in ("top1_prob", "entropy", "margin", "draft_pos")], axis=1)
    return x, cols["accepted"][model].astype(np.int64)


def fit_ngram_table(cols: dict[str, np.ndarray], k_max: int, l_max: int = 64) -> NgramTable:
    """Hybrid Spark's match length x position table from n-gram trace rows.

    The prior of each cell is the pooled per-length rate r[L] = (acc_L + 1) / (tested_L + 2)
    spread over positions by ``NgramTable.from_length_rates``; cells with data move to it.
    """
    ngram = np.isnan(cols["top1_prob"])
    length = np.clip(cols["ngram_len"][ngram].astype(np.int64), 0, l_max)
    accepted = cols["accepted"][ngram]
    tested = np.bincount(length, minlength=l_max + 1)
    acc = np.bincount(length, weights=accepted, minlength=l_max + 1)
    prior = NgramTable.from_length_rates(tuple((acc + 1.0) / (tested + 2.0)), k_max)
    return NgramTable.fit(length, cols["draft_pos"][ngram], accepted, prior)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tabletune.policies.trace_fit", description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("disco", "ngram"))
    ap.add_argument("--traces", nargs="+", required=True, help="trace files or folders (issue 7)")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--half", choices=("calibration", "scoring"), help="fit on one half of the prompts only")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.what == "disco":
        x, y = trace_rows(read_traces(*args.traces, half=args.half))
        model = train_disco(x, y, trained_on="traces " + ",".join(Path(t).name for t in args.traces))
    else:
        table = fit_ngram_table(read_traces(*args.traces, half=args.half), args.k_max)
        fileio.write_json(args.out, table.to_json())
        print(f"wrote {args.out}: {table.rates.shape[0] - 1} match lengths x {table.rates.shape[1]} positions")
        return 0
    model.save(args.out)
    print(f"wrote {args.out}: coef {np.round(model.coef, 3).tolist()} threshold {model.threshold:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
