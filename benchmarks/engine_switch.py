"""``engine_policies.py --switch``: code requests, then chat, through one engine at each load.

Two waves of code requests, then ``--rounds`` waves of chat, closed loop at each load for each of SWITCH_POLICIES
(``switch_run``, ``serve_switch``): throughput per window of ``--window-steps`` steps, and per load the share of the
stale table's loss recovered (``recovered``), in OUT.json and OUT.md (``switch_markdown``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_grid_sim import command_lines, commands_of, protocol_of, trace_offset, workload_data  # noqa: E402
from engine_serving import staggered_len  # noqa: E402
from policies_sim import calibrate  # noqa: E402

from tabletune import fileio  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, policy_context  # noqa: E402
from tabletune.policies import make_policy  # noqa: E402


class PhaseTable:
    """The switch's oracle: the table tuned for the first workload until a request of the second is admitted (id >=
    ``first_id``), then the table tuned for the second."""

    name, uses_features = "oracle (table per phase)", False

    def __init__(self, before, after, first_id: int) -> None:
        self.before, self.after, self.first_id, self.switched = before, after, first_id, False

    def decide(self, state):
        self.switched = self.switched or bool((state.request_ids >= self.first_id).any())
        return (self.after if self.switched else self.before).decide(state)

    def observe(self, outcome) -> None:
        (self.after if self.switched else self.before).observe(outcome)


SWITCH_POLICIES = ("stale", "oracle", "controller", "controller:per-request")
SWITCH_WINDOWS_AFTER = 3  # windows after the switch that the recovered share averages


def switch_run(engine, args, policy, load: int, prompts, oracle, pairs_a, pairs_b) -> dict:
    """``2 rounds`` waves of code requests, then ``rounds`` waves of chat, closed loop at ``load``; throughput per
    window of ``--window-steps`` steps, the switch at the step the first chat request is admitted."""
    n_a, n_b = 2 * load, max(4, args.rounds * load)
    pairs = [pairs_a[i % len(pairs_a)] for i in range(n_a)] + [pairs_b[i % len(pairs_b)] for i in range(n_b)]
    reqs = [Request(list(prompts[i % len(prompts)]), staggered_len(i, load, args.output_len), i,
                    oracle=oracle[i % len(prompts)], trace=pairs[i], trace_offset=trace_offset(i, pairs[i]))
            for i in range(n_a + n_b)]
    w = args.window_steps
    stats = Scheduler(engine, policy, max_num_seqs=load, seed=load, overlap_observe=args.overlap_observe).run(reqs)
    admitted = np.cumsum([0] + stats.step_admitted)  # requests admitted before step t (ids in order)
    switch = int(np.searchsorted(admitted, n_a, side="right")) - 1  # the step whose admissions include id n_a
    full = [t for t, b in enumerate(stats.step_batch_sizes) if b == load]
    last = full[-1] + 1 if full else 0
    starts = list(range(switch % w, last - w + 1, w))  # windows aligned on the switch
    tok = [sum(stats.step_tokens[t: t + w]) / sum(stats.step_wall_s[t: t + w]) for t in starts]
    mean_k = sum(stats.step_drafts) / max(sum(stats.step_batch_sizes), 1)
    # the step from which no code request runs (the last one retired before it)
    drained = max(stats.replaced_at_step.get(i, stats.num_steps) for i in range(n_a))
    return {"switch_step": switch, "drained_step": drained, "window_starts": starts,
            "tok_s": [round(x, 2) for x in tok], "num_steps": stats.num_steps, "mean_k": round(mean_k, 3)}


def recovered(runs: dict, start: str = "switch_step", skip: int = 0,
              count: int | None = SWITCH_WINDOWS_AFTER) -> dict[str, float] | None:
    """(policy - stale) / (oracle - stale) on the mean throughput of each run's windows from its step ``start``
    (``switch_step``, or ``drained_step``: no code request left), ``skip`` of them skipped, then ``count`` (None:
    to the end); None where the oracle gains under 0.5%, or a run lacks ``start``."""
    if any(start not in run for run in runs.values()):
        return None

    def after(run):
        tok = [x for t, x in zip(run["window_starts"], run["tok_s"]) if t >= run[start]][skip:]
        tok = tok if count is None else tok[:count]
        return statistics.fmean(tok) if tok else float("nan")
    stale, best = after(runs["stale"]), after(runs["oracle"])
    if not best > stale * 1.005:
        return None
    return {name: round((after(run) - stale) / (best - stale), 3) for name, run in runs.items()}


def serve_switch(engine, args, cost, loads, prompts, oracle, key, command, fp, profile, mixed, drafts, old) -> int:
    """``--switch``: each policy of SWITCH_POLICIES through the code -> chat stream at each load, checkpointed per
    (load, policy) in OUT.json; per load the recovered share (module ``recovered``)."""
    out_json = Path(args.out + ".json")
    result = {"schema": "tabletune.engine_switch", "version": 1, "key": key, "device": fp.device,
              "model": args.model, "command": command, "commands": commands_of(old, command),
              "profile": profile.to_json(), "mixed_check": mixed, "draft_profile": drafts,
              "runs": old.get("runs", {}) if old else {}}
    with tempfile.TemporaryDirectory() as tmp:
        calib = {w: calibrate(w, args.k_max, cost, Path(tmp) / w, protocol_of(args)) for w in ("code", "chat")}
    pairs = {w: workload_data(w, args.k_max, args.model_trace)["pairs"] for w in ("code", "chat")}
    ctx = {w: policy_context(engine, cost, calib[w].rates, calib[w].ngram_rates) for w in ("code", "chat")}
    for load in loads:
        runs = result["runs"].setdefault(str(load), {})
        for name in SWITCH_POLICIES:
            if name in runs:
                continue
            if name == "stale":
                policy = make_policy("tabletune", ctx["code"])
            elif name == "oracle":
                policy = PhaseTable(make_policy("tabletune", ctx["code"]), make_policy("tabletune", ctx["chat"]),
                                    2 * load)
            else:
                policy = make_policy(name, ctx["code"])
            t0 = time.perf_counter()
            runs[name] = switch_run(engine, args, policy, load, prompts, oracle, pairs["code"], pairs["chat"])
            fileio.write_json(str(out_json), result)
            print(f"switch load {load:4d} {name:24s} tok/s by window {runs[name]['tok_s']} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        if all(name in runs for name in SWITCH_POLICIES):
            set_recovered(result, str(load))
            fileio.write_json(str(out_json), result)
    fileio.write_text(args.out + ".md", switch_markdown(result))
    return 0


def set_recovered(result: dict, load: str) -> None:
    """The load's recovered shares (``recovered``): from the switch (the first SWITCH_WINDOWS_AFTER windows, and the
    windows after those to the end of the run) and from the step no code request is left."""
    runs = result["runs"][load]
    result.setdefault("recovered", {})[load] = recovered(runs)
    result.setdefault("recovered_later", {})[load] = recovered(runs, skip=SWITCH_WINDOWS_AFTER, count=None)
    result.setdefault("recovered_drained", {})[load] = recovered(runs, start="drained_step")


def switch_markdown(result: dict) -> str:
    w = SWITCH_WINDOWS_AFTER
    md = [f"# Workload switch code -> chat on the built-in engine ({result['device']})", "",
          "Throughput (tok/s) per window of steps; the switch at the step the first chat request is admitted, the "
          "drain at the step from which no code request runs. recovered = (policy - stale) / (oracle - stale) on "
          f"the mean of: the first {w} windows from the switch (`switch`), the windows after those to the end of the "
          f"run (`later`), the first {w} windows from the drain (`drained`); none where the oracle gains under 0.5%.",
          "", "| load | policy | switch step | drain step | tok/s by window | recovered: switch | later | drained |",
          "|---:|---|---:|---:|---|---:|---:|---:|"]
    for load, runs in result["runs"].items():
        recs = [(result.get(key) or {}).get(load) or {} for key in ("recovered", "recovered_later",
                                                                    "recovered_drained")]
        for name, run in runs.items():
            md.append(f"| {load} | {name} | {run['switch_step']} | {run.get('drained_step', '-')} | "
                      f"{' '.join(f'{x:.0f}' for x in run['tok_s'])} | "
                      + " | ".join(str(rec.get(name, '-')) for rec in recs) + " |")
    return "\n".join(md + [""] + command_lines(result)) + "\n"
