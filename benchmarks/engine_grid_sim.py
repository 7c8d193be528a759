"""The simulator side of ``engine_policies.py``'s grid, and what its engine side shares with it.

A measured cell simulated on the grid's inputs (``simulate_cell``: the host time the engine waited on charged by
``charged_host_ms``, by step with ``charged_lookup_ms``), each (workload, load)'s headroom oracle (``oracle_cell``);
``sim_only`` simulates every cell of OUT.json afresh (``grid_inputs``), ``add_ratios`` and ``markdown`` give the
ratios and OUT.md; ``GridGroup`` and ``what_if_main`` serve the what-ifs on a measured grid (``gate_predict.py``,
``plan_ahead.py``). Shared with the engine side: the protocol (``protocol_of``, ``protocol_from_key``), the
replayed traces (``workload_data``, ``trace_offset``) and the commands a file lists (``commands_of``,
``command_lines``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_timing import engine_cost, reprice  # noqa: E402
from policies_sim import Calibration, Protocol, calibrate, repeated_cell, trace_files  # noqa: E402

from tabletune import fileio  # noqa: E402
from tabletune.cost import StepCost  # noqa: E402
from tabletune.engine.trace_replay import (load_token_traces, ngram_length_rates, pair_traces,  # noqa: E402
                                           replay_rates)
from tabletune.profile import StepProfile  # noqa: E402
from tabletune.sim.oracle import headroom_share  # noqa: E402
from tabletune.sim.replay import prompt_half  # noqa: E402
from tabletune.sim.traces import auc  # noqa: E402


def protocol_of(args) -> Protocol:
    return Protocol(warmup_steps=args.warmup_steps, measured_steps=args.measured_steps, output_len=args.output_len,
                    prompt_len=args.prompt_len, fixed_repeats=args.fixed_repeats, overlap_observe=args.overlap_observe,
                    model_trace=args.model_trace,
                    measured_row_steps=getattr(args, "measured_row_steps", Protocol.measured_row_steps))


def span_fit(ngram: list) -> tuple[float, float]:
    """The simulator's copyable spans from an n-gram trace: (span_start_prob, span_mean_len).

    A span is a maximal run of positions with an n-gram row, one missing position bridged (the bonus token after
    a fully accepted draft has no row): span_mean_len = mean run length, span_start_prob = runs / positions
    outside runs (per emitted token).
    """
    runs, outside = [], 0
    for t in ngram:
        present = t.present.copy()
        present[1:-1] |= present[:-2] & present[2:]  # bridge single gaps
        length = 0
        for p in present.tolist() + [False]:
            if p:
                length += 1
            elif length:
                runs.append(length)
                length = 0
        outside += int((~present).sum())
    if not runs:
        return 0.0, 1.0
    return min(len(runs) / max(outside, 1), 1.0), max(float(np.mean(runs)), 1.0)


def workload_data(name: str, k_max: int, model_trace: str = "early-exit") -> dict:
    """The engine's replay pairs of the scoring half of the prompts, and the trace statistics of the workload."""
    model_file, ngram_file = trace_files(model_trace, name)
    model, ngram = load_token_traces(model_file), load_token_traces(ngram_file)
    top1 = np.concatenate([t.signals[t.present, 0] for t in model])
    ok = np.concatenate([t.accepted[t.present] for t in model])
    start_prob, mean_len = span_fit(ngram)
    pairs = [p for p in pair_traces(model, ngram) if prompt_half(p[0].request) == "scoring"]
    return {"pairs": pairs, "rates": replay_rates(model, k_max), "ngram_rates": ngram_length_rates(ngram),
            "top1_auc": auc(top1, ok), "span_start_prob": start_prob, "span_mean_len": mean_len}


def trace_offset(i: int, pair) -> int:
    """Request i's first row of its traces: drawn per request (as the simulator's ``Segments`` start), so that many
    requests over few traces do not run in step."""
    return int(np.random.default_rng(i).integers(len(pair[0].accepted)))


def charged_lookup_ms(cell: dict, cells: list[dict]) -> float | None:
    """Where some of a cell's steps were decided on the lookup and some not (``0 < lookup_share < 1``: the gated
    per-request controller), what the simulator charges a step decided on the lookup (``charged_host_ms`` of
    ``host_ms_critical_lookup``; the others are charged that of ``host_ms_critical_other``); None where every step
    is alike."""
    if not 0 < (cell.get("lookup_share") or 0) < 1:
        return None
    return charged_host_ms({**cell, "host_ms_critical": cell["host_ms_critical_lookup"]}, cells)


def charged_host_ms(cell: dict, cells: list[dict]) -> float:
    """The host time the simulator charges a cell a step: what the engine's device waited on for it beyond what
    it waits on at a fixed k of the same (workload, load) (the step profile holds none of the scheduler's own
    bookkeeping, so every cell pays it alike): ``host_ms_critical`` minus the fixed-k cells' mean, at least 0;
    a file without ``host_ms_critical`` charges ``host_ms_per_step``."""
    if cell["policy"].startswith("fixed:"):
        return 0.0
    base = [c["host_ms_critical"] for c in cells if c["workload"] == cell["workload"] and c["load"] == cell["load"]
            and c["policy"].startswith("fixed:") and c.get("host_ms_critical") is not None]
    if cell.get("host_ms_critical") is None or not base:
        return cell.get("host_ms_per_step") or 0.0
    return max(cell["host_ms_critical"] - statistics.fmean(base), 0.0)


def measured_window(protocol: Protocol, cell: dict) -> Protocol:
    """``protocol`` with the window a measured cell held (its ``measured_steps``): the simulator measures what the
    engine measured (at load 1, 500 steps hold about 4 requests, and which ones moves a ratio by several points)."""
    steps = cell.get("measured_steps")
    return protocol if not steps else dataclasses.replace(protocol, measured_steps=int(steps), measured_row_steps=0)


def simulate_cell(cost, calib, args, policy_spec, load, cell, cells: list[dict]) -> dict:
    """The simulated cell (``policies_sim.repeated_cell``, the mean over the protocol's policy repeats): the engine's
    cost, scoring traces, prefill cost, and the host time the engine waited on for this policy
    (``charged_host_ms``; by step for a cell decided on the lookup on some steps only: ``charged_lookup_ms``)."""
    lookup = charged_lookup_ms(cell, cells)
    charged = charged_host_ms(cell if lookup is None else {**cell, "host_ms_critical": cell["host_ms_critical_other"]},
                              cells)
    protocol = measured_window(protocol_of(args), cell)
    out = repeated_cell(cost, calib, policy_spec, load, protocol, protocol.policy_repeats,
                        prefill_ms_per_token=cell.get("prefill_ms_per_token") or 0.0, host_ms_per_step=charged,
                        host_ms_lookup_step=lookup)
    return {"sim_tok_s": out["sim_tok_s"], "sim_device_tok_s": out["sim_device_tok_s"],
            "sim_host_ms_charged": round(charged, 4),
            **({} if lookup is None else {"sim_host_ms_charged_lookup": round(lookup, 4)})}


def oracle_cell(cost, calib, args, load, cells) -> dict:
    """The headroom oracle of one (workload, load), simulated (it needs each draft's fate)."""
    prefill = next((c.get("prefill_ms_per_token") for c in cells
                    if c["workload"] == calib.workload and c["load"] == load and c.get("prefill_ms_per_token")), 0.0)
    fixed = [c for c in cells if c["workload"] == calib.workload and c["load"] == load
             and c["policy"].startswith("fixed:")]
    protocol = measured_window(protocol_of(args), fixed[0] if fixed else {})
    out = repeated_cell(cost, calib, "oracle", load, protocol, protocol.policy_repeats,
                        prefill_ms_per_token=prefill or 0.0)
    return {"workload": calib.workload, "load": load, "policy": "oracle", "throughput_tok_s": None, "mean_k": None,
            "sim_tok_s": out["sim_tok_s"]}


def protocol_from_key(args, key: dict) -> None:
    """Set ``args``' protocol fields to those a file was measured with (its ``key``), the traces replayed among
    them (a file from before the key recorded them: early exit)."""
    args.prompt_len, args.output_len, args.k_max = key["prompt_len"], key["output_len"], key["k_max"]
    args.warmup_steps, args.measured_steps = key["warmup_steps"], key["measured_steps"]
    args.measured_row_steps = key.get("measured_row_steps", 0)  # a file from before: windows of measured_steps
    args.fixed_repeats = key["fixed_repeats"]
    args.model_trace = key.get("model_trace", "early-exit")
    args.overlap_observe = key.get("overlap_observe", args.overlap_observe)


def grid_inputs(args) -> tuple[dict, StepCost]:
    """OUT.json and the engine's cost from it (``args``' protocol set to the file's), its cells repriced: what the
    simulator side of a measured grid starts from."""
    out_json = Path(args.out + ".json")
    result = json.loads(out_json.read_text())
    protocol_from_key(args, result["key"])
    profile = StepProfile.from_json(result["profile"], str(out_json))
    reprice(result, engine_cost(profile, result["mixed_check"], result.get("draft_profile")))  # the rule alone
    return result, engine_cost(profile, result["mixed_check"], result.get("draft_profile"), result.get("plan_check"))


@dataclasses.dataclass(frozen=True)
class GridGroup:
    """One (workload, load) of a measured grid, with what a what-if simulated on its inputs needs."""

    workload: str
    load: int
    cost: StepCost
    calib: Calibration
    args: argparse.Namespace  # the grid's protocol (``protocol_from_key``)
    cells: list[dict]  # every cell of the grid
    best_sim_tok_s: float  # the best fixed k's simulated tok/s at this (workload, load)

    @property
    def protocol(self) -> Protocol:
        return protocol_of(self.args)

    def cell(self, policy: str, default: dict | None = None) -> dict:
        """This group's cell of ``policy``; ``default`` where it has none (else StopIteration)."""
        found = (c for c in self.cells
                 if c["workload"] == self.workload and c["load"] == self.load and c["policy"] == policy)
        return next(found) if default is None else next(found, default)


def what_if_main(argv: list[str] | None, doc: str, script: str, name: str, default_groups: str,
                 rows_of: Callable[[str, list[tuple[str, int]]], list[dict]]) -> int:
    """The command line of a what-if on a measured grid's groups (``benchmarks/SCRIPT``: ``gate_predict.py``,
    ``plan_ahead.py``): ``--grid``, ``--groups workload:load,...``; its rows go to ``--out``
    (benchmarks/results/NAME.json, schema tabletune.NAME)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--grid", default="benchmarks/results/engine_policies", help="the grid's OUT (OUT.json read)")
    ap.add_argument("--groups", default=default_groups, help="workload:load,...")
    ap.add_argument("--out", default=f"benchmarks/results/{name}.json")
    args = ap.parse_args(argv)
    groups = [(w, int(n)) for w, n in (g.split(":") for g in args.groups.split(","))]
    rows = rows_of(args.grid, groups)
    fileio.write_json(args.out, {"schema": f"tabletune.{name}", "version": 1, "grid": args.grid + ".json",
                                 "command": f"python benchmarks/{script} --groups {args.groups}", "groups": rows})
    return 0


def sim_only(args) -> int:
    """Simulate every measured cell of OUT.json and each (workload, load)'s oracle afresh (CPU, no engine): the
    simulator's side always comes from the current simulator."""
    out_json = Path(args.out + ".json")
    result, cost = grid_inputs(args)
    result["cells"] = [c for c in result["cells"] if c["policy"] != "oracle"]
    with tempfile.TemporaryDirectory() as tmp:
        calibs: dict = {}
        for cell in list(result["cells"]):
            w = cell["workload"]
            if w not in calibs:
                calibs[w] = calibrate(w, args.k_max, cost, Path(tmp), protocol_of(args))
            cell.update(simulate_cell(cost, calibs[w], args, cell["policy"], cell["load"], cell, result["cells"]))
            print(f"{w:9s} load {cell['load']:4d} {cell['policy']:24s} sim {cell['sim_tok_s']:9.1f} tok/s", flush=True)
        for w, load in sorted({(c["workload"], c["load"]) for c in result["cells"]}):
            result["cells"].append(oracle_cell(cost, calibs[w], args, load, result["cells"]))
    add_ratios(result["cells"])
    fileio.write_json(str(out_json), result)
    fileio.write_text(args.out + ".md", markdown(result))
    return 0


def add_ratios(cells: list[dict]) -> None:
    """Each cell's tok/s over the best fixed k of its (workload, load), measured and simulated; the oracle's
    ratio (simulated) and each policy's share of that headroom, measured and simulated."""
    for key, out in (("throughput_tok_s", "ratio"), ("sim_tok_s", "sim_ratio")):  # absent sim_tok_s: None
        best: dict[tuple, float] = {}
        for c in cells:
            if c["policy"].startswith("fixed:") and c.get(key):
                g = (c["workload"], c["load"])
                best[g] = max(best.get(g, 0.0), c[key])
        for c in cells:
            b = best.get((c["workload"], c["load"]))
            c[out] = round(c[key] / b, 4) if b and c.get(key) else None
    oracle = {(c["workload"], c["load"]): c["sim_ratio"] for c in cells if c["policy"] == "oracle"}
    for c in cells:
        c["difference"] = round(c["sim_ratio"] - c["ratio"], 4) if c.get("ratio") and c.get("sim_ratio") else None
        o = oracle.get((c["workload"], c["load"]))
        c["oracle_ratio"] = o
        for ratio, share in (("ratio", "headroom_share"), ("sim_ratio", "sim_headroom_share")):
            h = headroom_share(c[ratio], o) if o and c.get(ratio) else None
            c[share] = None if h is None else round(h, 3)


def markdown(result: dict) -> str:
    mc = result["mixed_check"]
    key = result["key"]
    md = [f"# Policies on the built-in engine: {result['model']} shape, {result['device']}", "",
          f"Closed loop, prompt {result['prompt_len']} / output {result['output_len']} tokens, acceptance and "
          f"signals replayed from the scoring half of the traces ({key.get('model_trace', 'early-exit')} model "
          f"chain, n-gram chain); "
          f"every learned rule fit on the calibration half. Warm-up {key['warmup_steps']} steps, at least "
          f"{key['measured_steps']} measured steps wanted; fixed k repeated {key['fixed_repeats']} times. Ratio: "
          "tok/s over the best fixed k of the same workload and load; difference: simulated ratio - measured "
          "ratio; headroom: (ratio - 1) / (oracle ratio - 1), the oracle simulated.", "",
          f"Mixed-k cost (verification by tokens, drafting by {mc.get('draft_rows', 'active')} rows): fitted draft "
          f"share {mc['fitted_draft_share']}; worst |error| {mc['worst_abs_error_sim_default']:.1%} at the simulator's "
          f"0.5, {mc['worst_abs_error_fitted']:.1%} fitted.", "",
          "| workload | load | policy | mean k | tok/s | ratio | sim ratio | difference | oracle ratio | headroom |"
          " host ms/step | critical host ms | step ms | unpriced ms, fused / split (share split) | measured steps |"
          " noise band |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        tok = "" if c.get("throughput_tok_s") is None else f"{c['throughput_tok_s']:.0f}"
        unpriced = "" if "split_share" not in c else \
            f"{c['residual_ms_fused']} / {c['residual_ms_split']} ({c['split_share']})"
        md.append(f"| {c['workload']} | {c['load']} | {c['policy']} | {c.get('mean_k')} | {tok} | {c.get('ratio')} |"
                  f" {c.get('sim_ratio')} | {c.get('difference')} | {c.get('oracle_ratio')} | "
                  f"{c.get('headroom_share')} | {c.get('host_ms_per_step')} | {c.get('host_ms_critical')} | "
                  f"{c.get('step_ms')} | {unpriced} | "
                  f"{c.get('measured_steps')} | {c.get('noise_band', '')} |")
    md += ["", "| b | pattern | k_top | k_bar | measured ms | split ms | sim 0.5 ms | fitted ms | priced ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['batch_size']} | {r['pattern']} | {r['k_top']} | {r['k_bar']} | {r['measured_ms']} | "
           f"{r['split_ms']} | {r['predicted_ms_sim_default']} | {r['predicted_ms_fitted']} | "
           f"{r.get('priced_ms', '')} |" for r in mc["rows"]]
    drafts = result.get("draft_profile")
    if drafts:
        ks = range(len(drafts["rows"][0]["draft_ms"]))
        md += ["", "Drafting alone, D(b, k) ms (the draft profile; priced ms above and below use it), and its share "
               "of T(b, k) - T(b, 0):", "", "| b | " + " | ".join(f"k = {k}" for k in ks if k) + " | share at k_max |",
               "|---|" + "---|" * len(ks)]
        t = {(p["batch_size"], p["k"]): p["median_ms"] for p in result["profile"]["points"]}
        for r in drafts["rows"]:
            b, d = r["batch_size"], r["draft_ms"]
            span = t.get((b, len(d) - 1), 0.0) - t.get((b, 0), 0.0)
            share = f"{d[-1] / span:.2f}" if span > 0 else ""
            md.append(f"| {b} | " + " | ".join(str(x) for x in d[1:]) + f" | {share} |")
        n = sum(1 for c in result["cells"] if c.get("pricing") == "draft profile")
        md += ["", f"Cells whose policies priced drafting by the draft profile: {n} of "
               f"{sum(1 for c in result['cells'] if c['policy'] != 'oracle')} (the others by the fitted share)."]
    if result.get("plan_check"):
        md += ["", "Planned steps, half the rows on the n-gram chain (priced: their verification only; verify: the "
               "split step without its drafting, priced at the mean verified length):", "",
               "| b | model rows' k | n-gram rows' k | split ms | fused ms | priced ms | verify ms | priced verify ms"
               " | read once ms | read each ms |", "|---|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['batch_size']} | {r['k_model']} | {r['k_ngram']} | {r['split_ms']} | {r['fused_ms']} | "
               f"{r['priced_ms']} | {r.get('verify_ms', '')} | {r.get('priced_verify_ms', '')} | "
               f"{r.get('read_ms', '')} | {r.get('read_each_ms', '')} |"
               for r in result["plan_check"]["rows"]]
    return "\n".join(md + [""] + command_lines(result)) + "\n"


def commands_of(old: dict | None, command: str) -> list[str]:
    """The commands whose cells OUT.json holds, in order: those of the file resumed, then this one (once)."""
    before = (old.get("commands") or [old["command"]]) if old else []
    return before + [command] if command not in before else before


def command_lines(result: dict) -> list[str]:
    """The markdown's closing lines: every command that wrote cells (a resumed grid has several)."""
    commands = result.get("commands") or [result["command"]]
    if len(commands) == 1:
        return [f"Command: `{commands[0]}`"]
    return ["Commands (each resumed the file):", ""] + [f"- `{c}`" for c in commands]
