"""The gated per-request controller (``controller:per-request,gate=1``) predicted on the engine grid's inputs.

Simulated from measured inputs, for the gate as the code stands (a gated cell of the grid ran the gate of its
``engine_version``; before 0.13.5 its batch mode took the plans' estimator, which the plans' model rows bias low):
the step profile and costs of
``benchmarks/results/engine_policies.json``, its calibration half, and as host time (``engine_grid_sim
.simulate_cell``, by step): on a step decided on the lookup, what the per-request controller's cell waited on
(``host_ms_critical``), on the others what the batch controller's did, each beyond the fixed ks'. Beside it the
simulated and measured ratios of the two it chooses between, and the measured gated cell with its version.

    python benchmarks/gate_predict.py --groups chat:8,chat:32,code:8

Prints one line a group and writes ``benchmarks/results/gate_prediction.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_grid_sim as gs  # noqa: E402
import engine_policies as ep  # noqa: E402

GATED = "controller:per-request,gate=1"


def predict(grid: str, groups: list[tuple[str, int]]) -> list[dict]:
    rows = []
    for g in ep.grid_groups(grid, groups):
        rows_cell, batch_cell = g.cell("controller:per-request"), g.cell("controller")
        cell = {"workload": g.workload, "load": g.load, "policy": GATED, "lookup_share": 0.5,
                "host_ms_critical_lookup": rows_cell["host_ms_critical"],
                "host_ms_critical_other": batch_cell["host_ms_critical"],
                "prefill_ms_per_token": rows_cell.get("prefill_ms_per_token")}
        out = gs.simulate_cell(g.cost, g.calib, g.args, GATED, g.load, cell, g.cells)
        measured = g.cell(GATED, {})
        rows.append({"workload": g.workload, "load": g.load,
                     "gated_sim_ratio": round(out["sim_tok_s"] / g.best_sim_tok_s, 4),
                     "gated_ratio": measured.get("ratio"), "gated_engine_version": measured.get("engine_version"),
                     "per_request_sim_ratio": rows_cell["sim_ratio"], "per_request_ratio": rows_cell["ratio"],
                     "controller_sim_ratio": batch_cell["sim_ratio"], "controller_ratio": batch_cell["ratio"],
                     "charged_ms_lookup": out.get("sim_host_ms_charged_lookup"),
                     "charged_ms_other": out["sim_host_ms_charged"]})
        r = rows[-1]
        was = ("" if r["gated_ratio"] is None
               else f" ({100 * r['gated_ratio']:.1f} measured, engine {r['gated_engine_version']})")
        print(f"{g.workload} {g.load}: gated {100 * r['gated_sim_ratio']:.1f}% simulated{was}; per-request "
              f"{100 * r['per_request_sim_ratio']:.1f} simulated, {100 * r['per_request_ratio']:.1f} measured; "
              f"controller {100 * r['controller_sim_ratio']:.1f} simulated, {100 * r['controller_ratio']:.1f} "
              "measured", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(gs.what_if_main(None, __doc__, "gate_predict.py", "gate_prediction", "chat:8,chat:32,code:8", predict))
