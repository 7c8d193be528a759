"""``tabletune simulate``: one serving point in the discrete-event simulator (``tabletune.sim``)."""

from __future__ import annotations

import dataclasses
import json

import click

from tabletune.acceptance import load_rates, parse_rates
from tabletune.errors import InputError
from tabletune.profile import StepProfile


@click.command("simulate")
@click.option("--policy", default="tabletune", show_default=True,
              help="NAME[:ARG], e.g. fixed:3, off, table:FILE, tabletune, controller, vllm-av")
@click.option("--load", type=click.IntRange(min=1), default=32, show_default=True, help="closed loop: open requests")
@click.option("--arrival-rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="open loop instead: Poisson requests/s")
@click.option("--step-times", required=True, help="CSV (batch_size,k,step_ms) or step_profile.json")
@click.option("--acceptance", required=True, help="conditional rates a1,a2,... or acceptance.json")
@click.option("--prior", default=None, help="rates the policy is told (default: --acceptance)")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="simulated seconds")
@click.option("--output-len", type=int, default=None, help="fix every request's output length (tokens)")
@click.option("--workload", default="chat", show_default=True, help="preset for lengths and copyable spans")
@click.option("--heterogeneity", type=float, default=0.0, show_default=True,
              help="sd of each request's logit shift of the rates")
@click.option("--drafter", type=click.Choice(["model", "ngram"]), default="model", show_default=True)
@click.option("--draft-share", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="mixed-k step cost rule")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--noise-cv", type=click.FloatRange(min=0), default=0.0, show_default=True, help="step-time noise")
@click.option("--host-ms-per-step", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="the policy's host time a step, charged after each step (an engine that decides between steps)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="engines behind a router, each with its own policy (needs --arrival-rate)")
@click.option("--router", type=click.Choice(["round-robin", "least-loaded"]), default="round-robin",
              show_default=True, help="how --replicas share the arrivals")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def simulate_cmd(policy, load, arrival_rate, step_times, acceptance, prior, duration, output_len, workload,
                 heterogeneity, drafter, draft_share, max_num_seqs, noise_cv, host_ms_per_step, seed, replicas, router,
                 as_json):
    """Simulate one serving point and print throughput and the other metrics."""
    from tabletune.policies import make_policy
    from tabletune.policies.base import MODEL, NGRAM
    from tabletune.cost import StepCost
    from tabletune.sim import Schedule, SimConfig, Simulator, preset

    if replicas > 1 and arrival_rate is None:
        raise InputError("--replicas", "replicas", replicas, "a fleet needs open-loop arrivals: set --arrival-rate")
    if arrival_rate is None and load > max_num_seqs:
        raise InputError("--load", "load", load, f"must be <= --max-num-seqs={max_num_seqs} in a closed loop")
    profile = StepProfile.load(step_times)
    rates = load_rates(acceptance)
    base = preset(workload)
    w = dataclasses.replace(base, rates=tuple(rates), heterogeneity=heterogeneity,
                            output_len=output_len if output_len is not None else base.output_len)
    config = SimConfig(duration_s=duration, load=load, arrival_rate=arrival_rate, max_num_seqs=max_num_seqs,
                       noise_cv=noise_cv, seed=seed, host_ms_per_step=host_ms_per_step)
    sim = Simulator(StepCost(profile, draft_share), Schedule.constant(w), config,
                    default_drafter=NGRAM if drafter == "ngram" else MODEL)
    prior_rates = tuple(parse_rates(prior, "--prior")) if prior else None
    if replicas > 1:
        from tabletune.sim.fleet import run_fleet

        fleet = run_fleet(sim, lambda i: make_policy(policy, sim.context(prior_rates=prior_rates, seed=seed + i)),
                          replicas, router)
        summary = fleet.summary()
    else:
        summary = sim.run(make_policy(policy, sim.context(prior_rates=prior_rates))).summary()
    if as_json:
        click.echo(json.dumps(summary))
        return
    for key, value in summary.items():
        click.echo(f"{key:28s} {value}")
