"""Which cells of an H200 grid the done line leaves room for, given how the engine runs (CPU, reads a grid JSON).

The done line (step <= 1.3x floor for b <= 32, <= 1.5x everywhere) is against the floor max(bytes / bandwidth,
FLOPs / matrix rate), which assumes attention (KV-bound) overlaps the GEMMs (FLOP-bound at large b). An engine that
runs them one after the other cannot beat the serial floor (``profiling.serial_floor_ms``), so a cell needs
wall <= line x floor / serial floor (``profiling.serial_headroom``) times the serial floor. This prints that
headroom for every cell of a grid written by ``engine_roofline.py`` (with the grid's own ceilings) next to what the
engine reached (wall / serial floor), and counts the cells where the headroom is under 1 (no serial engine meets
the line), under 1.1 (every kernel within 10% of its ceiling) and where the engine already meets it.

    python benchmarks/engine_done_line.py benchmarks/results/engine_roofline_h200.json \\
        --out benchmarks/results/engine_done_line_h200
"""

from __future__ import annotations

import argparse
import json

from tabletune import fileio
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import Ceilings, done_line, serial_headroom


def analyse(grid: dict) -> tuple[list[dict], list[str]]:
    cfg = resolve(grid["model"])
    ceil = Ceilings(grid["bandwidth_gb_s"], grid["matrix_tflop_s"])
    ctx = grid["context_len"]
    rows, lines = [], []
    for r in grid["rows"]:
        b, k = r["batch_size"], r["k"]
        head = serial_headroom(cfg, b, k, ctx, ceil)
        rows.append({"batch_size": b, "k": k, "line": done_line(b), "ratio": r["ratio"],
                     "serial_over_floor": round(r["serial_floor_ms"] / r["floor_ms"], 3),
                     "headroom": round(head, 3), "wall_over_serial": r["serial_ratio"],
                     "met": r["ratio"] <= done_line(b)})
    ks = sorted({r["k"] for r in rows})
    lines += [f"# Done-line headroom over the serial floor: {grid['model']}, context {ctx}, {grid['device']}, "
              f"engine {grid.get('engine_version')}", "",
              f"Ceilings of the grid: copy {ceil.bandwidth_gb_s:.0f} GB/s, bf16 matmul {ceil.matrix_tflop_s:.0f} "
              "TFLOP/s. Cell: headroom (line x floor / serial floor) / what the engine reached (wall / serial floor); "
              "`!` headroom under 1: no engine that serialises attention and the GEMMs meets the line; "
              "`*` met.", "",
              "| b | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for b in sorted({r["batch_size"] for r in rows}):
        cells = [f"{r['headroom']:.2f}{'!' if r['headroom'] < 1 else ''} / {r['wall_over_serial']:.2f}"
                 f"{'*' if r['met'] else ''}" for r in rows if r["batch_size"] == b]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    under1 = sum(r["headroom"] < 1 for r in rows)
    under11 = sum(r["headroom"] < 1.1 for r in rows)
    met = sum(r["met"] for r in rows)
    closed = ", ".join(f"({r['batch_size']}, {r['k']})" for r in rows if r["headroom"] < 1) or "none"
    lines += ["", f"{len(rows)} cells: {met} meet the line; headroom under 1 at {under1} ({closed}), "
              f"under 1.1 at {under11}."]
    return rows, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid", help="a JSON written by engine_roofline.py")
    ap.add_argument("--out", default="", help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    try:
        with open(args.grid) as f:
            grid = json.load(f)
        rows, lines = analyse(grid)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"engine_done_line: {args.grid}: {type(exc).__name__}: {exc}")
    print("\n".join(lines))
    if args.out:
        fileio.write_json(args.out + ".json", {"grid": args.grid, "rows": rows})
        fileio.write_text(args.out + ".md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
