"""The gated per-request controller (``controller:per-request,gate=1``) predicted on the engine grid's inputs.

Simulated from measured inputs, before the gate is measured on the GPU: the step profile and costs of
``benchmarks/results/engine_policies.json``, its calibration half, and as host time (``engine_policies
.simulate_cell``, by step): on a step decided on the lookup, what the per-request controller's cell waited on
(``host_ms_critical``), on the others what the batch controller's did, each beyond the fixed ks'. Beside it the
simulated and measured ratios of the two it chooses between.

    python benchmarks/gate_predict.py --groups chat:8,chat:32,code:8

Prints one line a group and writes ``benchmarks/results/gate_prediction.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_policies as ep  # noqa: E402

from tabletune import fileio  # noqa: E402

GATED = "controller:per-request,gate=1"


def predict(grid: str, groups: list[tuple[str, int]]) -> list[dict]:
    args = ep.parse_args(["--sim-only", "--out", grid])
    result, cost = ep.grid_inputs(args)
    cells = result["cells"]
    by = {(c["workload"], c["load"], c["policy"]): c for c in cells}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        calibs: dict = {}
        for w, load in groups:
            if w not in calibs:
                calibs[w] = ep.calibrate(w, args.k_max, cost, Path(tmp), ep.protocol_of(args))
            rows_cell, batch_cell = by[(w, load, "controller:per-request")], by[(w, load, "controller")]
            best = max(c["sim_tok_s"] for c in cells if c["workload"] == w and c["load"] == load
                       and c["policy"].startswith("fixed:") and c.get("sim_tok_s"))
            cell = {"workload": w, "load": load, "policy": GATED, "lookup_share": 0.5,
                    "host_ms_critical_lookup": rows_cell["host_ms_critical"],
                    "host_ms_critical_other": batch_cell["host_ms_critical"],
                    "prefill_ms_per_token": rows_cell.get("prefill_ms_per_token")}
            out = ep.simulate_cell(cost, calibs[w], args, GATED, load, cell, cells)
            rows.append({"workload": w, "load": load, "gated_sim_ratio": round(out["sim_tok_s"] / best, 4),
                         "per_request_sim_ratio": rows_cell["sim_ratio"], "per_request_ratio": rows_cell["ratio"],
                         "controller_sim_ratio": batch_cell["sim_ratio"], "controller_ratio": batch_cell["ratio"],
                         "charged_ms_lookup": out.get("sim_host_ms_charged_lookup"),
                         "charged_ms_other": out["sim_host_ms_charged"]})
            r = rows[-1]
            print(f"{w} {load}: gated {100 * r['gated_sim_ratio']:.1f}% simulated; per-request "
                  f"{100 * r['per_request_sim_ratio']:.1f} simulated, {100 * r['per_request_ratio']:.1f} measured; "
                  f"controller {100 * r['controller_sim_ratio']:.1f} simulated, {100 * r['controller_ratio']:.1f} "
                  "measured", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="benchmarks/results/engine_policies", help="the grid's OUT (OUT.json read)")
    ap.add_argument("--groups", default="chat:8,chat:32,code:8", help="workload:load,...")
    ap.add_argument("--out", default="benchmarks/results/gate_prediction.json")
    args = ap.parse_args(argv)
    groups = [(w, int(n)) for w, n in (g.split(":") for g in args.groups.split(","))]
    rows = predict(args.grid, groups)
    fileio.write_json(args.out, {"schema": "tabletune.gate_prediction", "version": 1, "grid": args.grid + ".json",
                                 "command": "python benchmarks/gate_predict.py --groups " + args.groups,
                                 "groups": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
