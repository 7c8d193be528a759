"""What deciding the per-request plans ahead would buy, simulated on the engine grid's measured inputs.

The per-request controller plans each row on the n-gram lookup at the step's own positions, which the host knows
only after the last step's read-back, so the device waits 0.13-0.28 ms a step on the H100 while the host looks up
and decides. Two ways to take that off the critical path (issue 48, item 2), each priced here as the host time the
batch controller's cell waited on (it decides ahead: ``engine_grid_sim.charged_host_ms``), on the grid's step
profile, costs, calibration half and scoring traces (``benchmarks/results/engine_policies.json``):

* ``current``: the plan on the step's own lookup, made where it costs nothing. This is the bound of a plan
  computed on the device (the lookup's classes, the counts and the plan's gathers as tensor operations captured
  with the step).
* ``stale``: the plan made on the host for step t + 1 while step t runs, on one-step-old statistics, as vLLM's
  async scheduler does: each row's lookup class (match length, proposals) from the step before (a new request: no
  match). On the device each row verifies its planned chain, except a row planned on the n-gram chain whose lookup
  proposes nothing now, which takes the model chain at the batch controller's k (``StalePlans``).
* ``stale-no-fallback``: the same, such a row verifying nothing.
* ``device``: the plan on the step's own lookup as a plan computed on the device would run it. A CUDA graph's shape
  is fixed when it is launched, before the lookup: the launch takes the deepest model draft the plan of the step
  before wanted (the device reads that back with the step's tokens), every model row drafts that many positions,
  and a row the plan wants deeper is capped there (``DevicePlans``). The token bucket's padding is not charged, so
  this is still a bound from above.

Beside them, per-request as the grid simulates it (its own measured host time) and as measured.

    python benchmarks/plan_ahead.py --groups chat:1,chat:8,code:8

Prints one line a group and writes ``benchmarks/results/plan_ahead.json`` (% of the best fixed k, simulated).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_grid_sim as gs  # noqa: E402
import engine_policies as ep  # noqa: E402
import policies_sim as ps  # noqa: E402

from tabletune.policies.base import MODEL, NGRAM, BatchState, Decision  # noqa: E402

PER_REQUEST = "controller:per-request"


class StalePlans:
    """The per-request controller deciding on each row's lookup class of the step before (the rest of the policy
    passed through). ``fallback``: a row planned on the n-gram chain whose lookup proposes nothing at its own
    positions takes the model chain at the batch controller's k (True) or verifies nothing (False)."""

    def __init__(self, inner, fallback: bool) -> None:
        self.inner, self.fallback = inner, fallback
        self._last: dict[int, tuple[int, int]] = {}  # request id -> (match length, proposals) at its last step

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def decide(self, state: BatchState) -> Decision:
        if state.ngram_match_len is None:
            return self.inner.decide(state)
        ids, proposed = state.request_ids, np.asarray(state.ngram_num_proposed)
        old = np.array([self._last.get(int(i), (0, 0)) for i in ids], np.int64).reshape(-1, 2)
        self._last = {int(i): (int(m), int(p)) for i, m, p in zip(ids, state.ngram_match_len, proposed)}
        decision = self.inner.decide(dataclasses.replace(state, ngram_match_len=old[:, 0],
                                                         ngram_num_proposed=old[:, 1]))
        if decision.drafter is None:
            return decision
        ks, drafter = decision.ks_for(len(ids)).copy(), np.asarray(decision.drafter).copy()
        empty = (drafter == NGRAM) & (proposed == 0)
        if empty.any():
            ks[empty] = self.inner.controller.k_for(len(ids)) if self.fallback else 0
            drafter[empty] = MODEL if self.fallback else NGRAM
        return Decision.per_request(ks, drafter)


class DevicePlans:
    """The plan on the step's own lookup with the launch's drafting depth fixed by the plan of the step before
    (``plan_ahead`` docstring, ``device``): its deepest model draft, the first step's its own. Model rows deeper
    than the depth are capped at it; ``launch_depth`` tells the simulator every model row drafts it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self._wanted: int | None = None  # the deepest model draft the last plan wanted
        self.launch_depth = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def decide(self, state: BatchState) -> Decision:
        n = state.batch_size
        decision = self.inner.decide(state)
        ks = decision.ks_for(n).copy()
        drafter = (np.asarray(decision.drafter).copy() if decision.drafter is not None
                   else np.full(n, MODEL, np.int64))
        model = drafter == MODEL
        wanted = int(ks[model].max(initial=0))
        depth = wanted if self._wanted is None else self._wanted
        self._wanted, self.launch_depth = wanted, depth
        return Decision.per_request(np.where(model, np.minimum(ks, depth), ks), drafter)


VARIANTS = {"current": None, "stale": lambda p: StalePlans(p, True),
            "stale-no-fallback": lambda p: StalePlans(p, False), "device": DevicePlans}


def compare(grid: str, groups: list[tuple[str, int]]) -> list[dict]:
    rows = []
    for g in ep.grid_groups(grid, groups):
        cell = g.cell(PER_REQUEST)
        ahead_ms = gs.charged_host_ms(g.cell("controller"), g.cells)
        row = {"workload": g.workload, "load": g.load, "per_request_sim_ratio": cell["sim_ratio"],
               "per_request_ratio": cell["ratio"], "host_ms_charged": round(ahead_ms, 4)}
        protocol = g.protocol
        for name, wrap in VARIANTS.items():
            out = ps.repeated_cell(g.cost, g.calib, PER_REQUEST, g.load, protocol, protocol.policy_repeats,
                                   prefill_ms_per_token=cell.get("prefill_ms_per_token") or 0.0,
                                   host_ms_per_step=ahead_ms, wrap=wrap)
            row[name + "_sim_ratio"] = round(out["sim_tok_s"] / g.best_sim_tok_s, 4)
        rows.append(row)
        print(f"{g.workload} {g.load}: per-request {100 * row['per_request_sim_ratio']:.1f} simulated, "
              f"{100 * row['per_request_ratio']:.1f} measured; ahead: "
              + ", ".join(f"{name} {100 * row[name + '_sim_ratio']:.1f}" for name in VARIANTS), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(gs.what_if_main(None, __doc__, "plan_ahead.py", "plan_ahead",
                             "chat:1,chat:4,chat:8,chat:32,code:4,code:8,code-edit:8", compare))
