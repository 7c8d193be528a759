"""Best-kernel serial bound of the grid's cells against the done line (GPU: measure; CPU: from saved GEMM times).

For a cell (b, k), M = b (k + 1) rows: the fastest measured kernel of each of the layer's four GEMMs and of the LM
head, summed over the layers, plus attention at its floor, and nothing at all for RoPE, the norms, SiLU,
verification or launches (``profiling.best_kernel_serial_ms``). A cell whose bound is over line x floor cannot meet
the done line in an engine that runs these kernels one after another, whatever it does around them: it needs
GEMM kernels faster than every one measured here, or attention overlapped with the GEMMs.

The kernels (``--measure``, on the GPU): every candidate of the engine's GEMM chooser (``gemm.candidates``: cuBLAS
at M and on rows padded to 64 / 128, cuBLASLt's default, the first ``--lt-algos`` kernels of cuBLASLt's heuristic
list, the Triton configs and the Gluon wgmma configs), timed by the chooser's own harness (``gemm._fastest``: each
checked against torch, then 10 calls in a CUDA graph over L2-cold weights, copies rotated where one fits L2). The
LM head above ``model.LM_HEAD_CHOOSE_ROWS`` rows skips the Triton and wgmma configs, as the engine does. Ceilings
are measured before and after (the higher of each, as engine_roofline.py). Cells run from the largest M down and
the results are written after every M, so a cut run keeps what it measured.

    python benchmarks/engine_component_bound.py --measure --grid benchmarks/results/engine_roofline_h200_v7dev10.json \\
        --over-line --out $OUT/component_bound

On the CPU, from GEMM times saved by this script or by engine_gemm_sweep.py (a shape's time at M is its best at the
smallest saved M' >= M, marked "~" when M' > M: a kernel for more rows also serves fewer) and a grid's ceilings:

    python benchmarks/engine_component_bound.py --grid benchmarks/results/engine_roofline_h200_v7dev10.json \\
        --times benchmarks/results/engine_gemm_sweep_h200_lt.json --over-line --floor-missing \\
        --out benchmarks/results/engine_component_bound_cpu

(``--floor-missing``: engine_gemm_sweep.py's files hold no LM head, which then counts at its own floor.)
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

from tabletune import fileio
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import (Ceilings, best_kernel_serial_ms, command_line, done_line, gemm_floor_us,
                                        step_floor_ms)


class TimesError(ValueError):
    """A GEMM-times file or a grid that cannot serve the analysis; the message names the file, field and value."""


def load_times(paths: list[str]) -> dict[tuple[str, int], float]:
    """{(proj, M): fastest us} over the ``rows`` of each file (engine_gemm_sweep.py's format, which this script also
    writes)."""
    best: dict[tuple[str, int], float] = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        rows = doc.get("rows") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise TimesError(f"{path}: field 'rows' must be a list of GEMM timings, got {type(rows).__name__}")
        for key, us in best_times(rows, path).items():
            best[key] = min(best.get(key, math.inf), us)
    return best


def best_times(rows: list, source: str) -> dict[tuple[str, int], float]:
    """{(proj, M): the least of a row's ``*_us`` fields} (a null or infinite time: that kernel did not run)."""
    best: dict[tuple[str, int], float] = {}
    for i, r in enumerate(rows):
        try:
            key = (str(r["proj"]), int(r["m"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise TimesError(f"{source}: rows[{i}] needs 'proj' and an integer 'm' ({exc!r})") from None
        for field, v in r.items():
            if not field.endswith("_us") or v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise TimesError(f"{source}: rows[{i}].{field} must be a positive number of us, got {v!r}")
            if math.isfinite(v):
                best[key] = min(best.get(key, math.inf), float(v))
    return best


def lookup(times: dict[tuple[str, int], float], source: str, missing: Callable[[str, int], float] | None = None):
    """gemm_us(proj, M) for ``best_kernel_serial_ms``: the best time at the smallest saved M' >= M, recording in
    ``padded`` the (proj, M) that used a larger M'. A shape with no time at all: an error, or ``missing(proj, M)``
    (its floor: no kernel is faster, so the bound stays a bound), recorded in ``floored``."""
    padded: set[tuple[str, int]] = set()
    floored: set[tuple[str, int]] = set()

    def gemm_us(proj: str, m: int) -> float:
        ms = sorted(mm for p, mm in times if p == proj and mm >= m)
        if ms:
            if ms[0] != m:
                padded.add((proj, m))
            return times[(proj, ms[0])]
        if missing is None:
            raise TimesError(f"{source}: no GEMM time for {proj!r} at M >= {m}")
        floored.add((proj, m))
        return missing(proj, m)
    return gemm_us, padded, floored


def load_grid(path: str) -> dict:
    """A grid JSON of engine_roofline.py, with the fields this script reads checked (the error names the field)."""
    with open(path) as f:
        grid = json.load(f)
    for field in ("model", "context_len", "bandwidth_gb_s", "matrix_tflop_s", "rows"):
        if not isinstance(grid, dict) or field not in grid:
            raise TimesError(f"{path}: no field {field!r}; is it a grid of engine_roofline.py?")
    for i, r in enumerate(grid["rows"]):
        for field in ("batch_size", "k", "step_ms", "ratio"):
            if not isinstance(r.get(field), (int, float)) or isinstance(r.get(field), bool):
                raise TimesError(f"{path}: rows[{i}].{field} must be a number, got {r.get(field)!r}")
    return grid


def cells_of(grid: dict | None, buckets: list[int], k_max: int, over_line: bool) -> list[dict]:
    """The cells to bound: the grid's rows of ``buckets`` (only those over the done line with ``over_line``), else
    every (b, k) of ``buckets`` x 0..k_max."""
    if grid is None:
        return [{"batch_size": b, "k": k} for b in buckets for k in range(k_max + 1)]
    return [r for r in grid["rows"] if r["batch_size"] in buckets and r["k"] <= k_max
            and (not over_line or r["ratio"] > done_line(r["batch_size"]))]


def analyse(model: str, context_len: int, ceil: Ceilings, cells: list[dict], gemm_us, padded: set,
            floored: set = frozenset()) -> tuple[list[dict], list[str]]:
    cfg = resolve(model)
    rows = []
    for c in cells:
        b, k = c["batch_size"], c["k"]
        floor = step_floor_ms(cfg, b, k, context_len, ceil)
        bound = best_kernel_serial_ms(cfg, b, k, context_len, ceil, gemm_us)
        m = b * (k + 1)
        row = {"batch_size": b, "k": k, "m": m, "floor_ms": round(floor, 4), "bound_ms": round(bound, 4),
               "bound_ratio": round(bound / floor, 3), "line": done_line(b),
               "bound_over_line": bound > done_line(b) * floor,
               "padded": sorted(p for p, mm in padded if mm == m),
               "at_floor": sorted(p for p, mm in floored if mm == m)}
        if "step_ms" in c:
            row["step_ms"], row["ratio"] = c["step_ms"], round(c["step_ms"] / floor, 3)
        rows.append(row)
    over = [r for r in rows if r["bound_over_line"]]
    lines = [f"# Best-kernel serial bound against the done line: {model}, context {context_len}", "",
             f"Ceilings: copy {ceil.bandwidth_gb_s:.0f} GB/s, bf16 matmul {ceil.matrix_tflop_s:.0f} TFLOP/s. Bound: "
             "the fastest measured kernel of every GEMM (layers and LM head) plus attention at its floor, nothing "
             "else. Step: the grid's step time over this floor. `~`: a GEMM time taken at a larger M; `°`: a GEMM "
             "with no measured time, at its own floor.", "",
             "| b | k | M | floor ms | bound ms | bound / floor | line | step / floor | bound over the line |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        marks = ("~" if r["padded"] else "") + ("°" if r["at_floor"] else "")
        lines.append(f"| {r['batch_size']} | {r['k']} | {r['m']}{marks} | {r['floor_ms']:.2f} | {r['bound_ms']:.2f} | "
                     f"{r['bound_ratio']:.2f}x | {r['line']} | {step} | "
                     f"{'**yes**' if r['bound_over_line'] else 'no'} |")
    names = ", ".join(f"({r['batch_size']}, {r['k']}) {r['bound_ratio']:.2f}x" for r in over) or "none"
    lines += ["", f"{len(rows)} cells; the bound is over the line at {len(over)}: {names}."]
    return rows, lines


def measure(model: str, ms: list[int], lt_algos: int, write) -> tuple[Ceilings, list[dict], str]:
    """Ceilings, then every GEMM chooser candidate of each shape at each M (largest M first), timed alone by the
    chooser's own harness (``gemm._fastest``: checked against torch, weights rotated through more than L2); calls
    ``write(ceilings, rows)`` after every M."""
    import torch

    from tabletune.engine import gemm
    from tabletune.engine.model import LM_HEAD_CHOOSE_ROWS
    from tabletune.engine.profiling import measure_ceilings

    readings = [measure_ceilings()]
    gemm.LT_ALGOS, gemm.TIMING = lt_algos, "alone"
    cfg = resolve(model)
    shapes = cfg.step_gemm_shapes()
    weights = {name: torch.randn(n, kk, dtype=torch.bfloat16, device="cuda") for name, (n, kk) in shapes.items()}
    rows: list[dict] = []
    for m in sorted(set(ms), reverse=True):
        for name, (n, kk) in shapes.items():
            cands = gemm.candidates(m, False, weights[name])
            if name == "lm_head" and m > LM_HEAD_CHOOSE_ROWS:  # as the engine: cuBLAS kernels only up there
                cands = {c: fn for c, fn in cands.items() if _kind(c) not in ("triton", "wgmma")}
            key = (m, n, kk, False)
            gemm._fastest(key, weights[name], kk, cands, gemm._reference(False))
            times: dict[str, float] = {}
            labels: dict[str, str] = {}
            for choice, us in gemm._timings[key].items():
                kind = _kind(choice)
                if us < times.get(kind, math.inf):
                    times[kind], labels[kind] = us, str(choice)
            rows.append({"proj": name, "m": m, "n": n, "k": kk, "best_config": labels,
                         **{f"{kind}_us": round(us, 2) for kind, us in times.items() if math.isfinite(us)}})
            best = min(times.values())
            print(f"{name:8s} M={m:5d}: best {best:8.2f} us ({2 * m * n * kk / best / 1e6:4.0f} TF/s, "
                  f"{n * kk * 2 / best / 1e6:4.2f} TB/s) " + " ".join(f"{kd} {v:.1f}" for kd, v in times.items()),
                  flush=True)
        write(readings[0], rows)
    readings.append(measure_ceilings())
    ceil = Ceilings(max(r.bandwidth_gb_s for r in readings), max(r.matrix_tflop_s for r in readings))
    print(f"ceilings: {readings} -> {ceil}", flush=True)
    return ceil, rows, torch.cuda.get_device_name()


def _kind(choice) -> str:
    """The family of a chooser candidate: cuBLAS at M (None), cuBLAS on padded rows (an int), cuBLASLt's default,
    a kernel of cuBLASLt's list, a Triton config or a wgmma config."""
    from tabletune.engine import cublaslt, gemm, gemm_wgmma

    if choice is None:
        return "cublas"
    if isinstance(choice, int):
        return "cublas_pad"
    if choice == gemm.CUBLASLT:
        return "cublaslt"
    if isinstance(choice, cublaslt.Algo):
        return "lt_list"
    if isinstance(choice, gemm_wgmma.WgmmaConfig):
        return "wgmma"
    return "triton"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="", help="a JSON of engine_roofline.py: its cells, steps and (CPU) ceilings")
    ap.add_argument("--times", action="append", default=[], help="saved GEMM times (CPU mode; repeatable)")
    ap.add_argument("--measure", action="store_true", help="measure the GEMMs and ceilings on this GPU")
    ap.add_argument("--over-line", action="store_true", help="only the grid's cells over the done line")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--buckets", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--lt-algos", type=int, default=16, help="cuBLASLt heuristic kernels to time (--measure)")
    ap.add_argument("--floor-missing", action="store_true",
                    help="a GEMM shape with no saved time (the LM head in engine_gemm_sweep.py's files) at its floor")
    ap.add_argument("--out", default="", help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    if args.measure == bool(args.times):
        ap.error("give either --measure or at least one --times file")
    try:
        grid = load_grid(args.grid) if args.grid else None
        if grid is not None:
            args.model, args.context = grid["model"], int(grid["context_len"])
        cells = cells_of(grid, [int(v) for v in args.buckets.split(",")], args.k_max, args.over_line)
        if args.measure:
            def write(ceil: Ceilings, rows: list[dict]) -> None:
                if args.out:
                    fileio.write_json(args.out + ".json", {"model": args.model, "command": command_line(),
                                                          "ceilings": vars(ceil), "rows": rows})
            ms = [c["batch_size"] * (c["k"] + 1) for c in cells]
            ceil, gemm_rows, device = measure(args.model, ms, args.lt_algos, write)
            times, source = best_times(gemm_rows, "this run"), "this run"
        else:
            if grid is None:
                ap.error("CPU mode needs --grid for its ceilings")
            ceil = Ceilings(float(grid["bandwidth_gb_s"]), float(grid["matrix_tflop_s"]))
            times, source, gemm_rows = load_times(args.times), ", ".join(args.times), []
            device = grid.get("device", "")
        shapes = resolve(args.model).step_gemm_shapes()

        def at_floor(proj: str, m: int) -> float:
            return gemm_floor_us(*shapes[proj], m, ceil)
        gemm_us, padded, floored = lookup(times, source, at_floor if args.floor_missing else None)
        rows, lines = analyse(args.model, args.context, ceil, cells, gemm_us, padded, floored)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"engine_component_bound: {type(exc).__name__}: {exc}")
    print("\n".join(lines))
    if args.out:
        doc = {"model": args.model, "device": device, "context_len": args.context, "command": command_line(),
               "ceilings": vars(ceil), "grid": args.grid, "times": args.times, "cells": rows, "rows": gemm_rows}
        fileio.write_json(args.out + ".json", doc)
        fileio.write_text(args.out + ".md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
