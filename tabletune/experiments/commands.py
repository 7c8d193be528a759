"""The ``tabletune simulate`` and ``tabletune experiment`` commands (registered in ``tabletune.cli``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from tabletune.acceptance import load_rates, parse_rates
from tabletune.errors import InputError
from tabletune.profile import StepProfile, parse_int_list


def _input_errors_exit_2(fn):
    from tabletune.cli import input_errors_exit_2

    return input_errors_exit_2(fn)


@click.command("simulate")
@click.option("--policy", required=True, help="NAME[:ARG], e.g. fixed:3, off, table:FILE, tabletune, controller")
@click.option("--load", type=int, default=32, show_default=True, help="closed loop: open requests")
@click.option("--arrival-rate", type=float, default=None, help="open loop instead: Poisson requests/s")
@click.option("--step-times", required=True, help="CSV (batch_size,k,step_ms) or step_profile.json")
@click.option("--acceptance", required=True, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--prior", default=None, help="rates the policy is told (default: --acceptance)")
@click.option("--duration", type=float, default=60.0, show_default=True, help="simulated seconds")
@click.option("--output-len", type=int, default=None, help="fix every request's output length (tokens)")
@click.option("--workload", default="chat", show_default=True, help="preset for lengths and copyable spans")
@click.option("--heterogeneity", type=float, default=0.0, show_default=True,
              help="sd of each request's logit shift of the rates")
@click.option("--drafter", type=click.Choice(["model", "ngram"]), default="model", show_default=True)
@click.option("--draft-share", type=float, default=0.5, show_default=True, help="mixed-k step cost rule")
@click.option("--max-num-seqs", type=int, default=128, show_default=True)
@click.option("--noise-cv", type=float, default=0.0, show_default=True, help="step-time noise")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@_input_errors_exit_2
def simulate_cmd(policy, load, arrival_rate, step_times, acceptance, prior, duration, output_len, workload,
                 heterogeneity, drafter, draft_share, max_num_seqs, noise_cv, seed, as_json):
    """Simulate one serving point and print throughput and the other metrics."""
    from tabletune.policies import make_policy
    from tabletune.policies.base import MODEL, NGRAM
    from tabletune.cost import StepCost
    from tabletune.sim import Schedule, SimConfig, Simulator, preset

    profile = StepProfile.load(step_times)
    rates = load_rates(acceptance)
    base = preset(workload)
    w = dataclasses.replace(base, rates=tuple(rates), heterogeneity=heterogeneity,
                            output_len=output_len if output_len is not None else base.output_len)
    config = SimConfig(duration_s=duration, load=load, arrival_rate=arrival_rate, max_num_seqs=max_num_seqs,
                       noise_cv=noise_cv, seed=seed)
    sim = Simulator(StepCost(profile, draft_share), Schedule.constant(w), config,
                    default_drafter=NGRAM if drafter == "ngram" else MODEL)
    prior_rates = tuple(parse_rates(prior, "--prior")) if prior else None
    result = sim.run(make_policy(policy, sim.context(prior_rates=prior_rates)))
    summary = result.summary()
    if as_json:
        click.echo(json.dumps(summary))
        return
    for key, value in summary.items():
        click.echo(f"{key:28s} {value}")


@click.command("experiment")
@click.argument("name", type=click.Choice(["fig1", "table1", "fig3", "table2", "fig4b", "all"]))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="output folder")
@click.option("--step-times", default="profiles/starter/h200_qwen3-8b-shape_ctx1024_eagle-like.csv",
              show_default=True, help="EAGLE-like T(b,k) the settings derive from")
@click.option("--loads", default="1,2,4,8,16,32,64,96,128", show_default=True)
@click.option("--seeds", type=int, default=3, show_default=True, help="number of seeds")
@click.option("--duration", type=float, default=20.0, show_default=True, help="simulated seconds per point")
@click.option("--fig3-settings", default="eagle", show_default=True, help="comma-separated Table 1 settings")
@click.option("--fig4b-loads", default="32", show_default=True)
@click.option("--no-per-request", is_flag=True, help="skip the per-request policies in fig3")
@click.option("--jobs", type=int, default=2, show_default=True, help="worker processes")
@_input_errors_exit_2
def experiment_cmd(name, out_dir, step_times, loads, seeds, duration, fig3_settings, fig4b_loads, no_per_request,
                   jobs):
    """Run one of the paper's experiments (or all) in the simulator: CSV, PNG and markdown to --out."""
    from tabletune.experiments.report import ExperimentOptions, run_experiments

    if seeds < 1:
        raise InputError("--seeds", "seeds", seeds, "must be >= 1")
    opts = ExperimentOptions(
        loads=tuple(parse_int_list(loads, "--loads", "loads")), seeds=tuple(range(seeds)), duration_s=duration,
        fig3_settings=tuple(s.strip() for s in fig3_settings.split(",") if s.strip()),
        fig4b_loads=tuple(parse_int_list(fig4b_loads, "--fig4b-loads", "loads")), per_request=not no_per_request,
        jobs=jobs)
    out = Path(out_dir)
    sections = run_experiments([name], step_times, out, opts)
    for section in sections:
        click.echo(f"{section.key}: wrote {', '.join(section.files)} and {section.key}.md to {out}")
    if name == "all":
        click.echo(f"report: {out / 'report.md'}")
