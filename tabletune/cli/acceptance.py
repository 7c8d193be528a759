"""``tabletune acceptance``: measure a drafter's per-position acceptance on a real model and workload."""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tabletune.assets import WORKLOADS
from tabletune.cli.common import command_line


def _progress_bar() -> tuple[Progress, Callable[[str, int, int], None]]:
    bar = Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=False)
    tasks: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    return bar, update


@click.command("acceptance")
@click.option("--model", type=click.Choice(["smollm2-135m"]), default="smollm2-135m", show_default=True)
@click.option("--drafter", type=click.Choice(["ngram", "early-exit", "eagle"]), required=True)
@click.option("--workload", required=True, help=f"one of {', '.join(WORKLOADS)}, or a prompts .jsonl")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy; > 0 = lossless sampling")
@click.option("--k-max", "k_max", type=int, default=8, show_default=True, help="draft length k of every draft")
@click.option("--num-prompts", type=int, default=None, help="first N prompts of the workload (default: all)")
@click.option("--max-new-tokens", type=int, default=256, show_default=True)
@click.option("--exit-layer", type=int, default=28, show_default=True,
              help="early-exit drafter: first m layers")
@click.option("--ngram-min", type=int, default=2, show_default=True)
@click.option("--ngram-max", type=int, default=5, show_default=True)
@click.option("--draft-model", type=click.Path(exists=True, file_okay=False), default=None,
              help="eagle: the trained head's folder (e.g. profiles/drafters/smollm2-135m-eagle)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True, help="prompts generated together")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="AcceptanceProfile JSON (+ .detail.json)")
@click.option("--trace-out", type=click.Path(dir_okay=False), default=None, help="per-token trace (.csv.gz)")
def acceptance_cmd(model, drafter, workload, temperature, k_max, num_prompts, max_new_tokens, exit_layer,
                   ngram_min, ngram_max, draft_model, seed, batch_size, out, trace_out):
    """Measure censored per-position acceptance (a_1..a_k) of a drafter on real prompts."""
    from tabletune.integrations.hf.measure import AcceptanceRun, measure, write_outputs

    run = AcceptanceRun(drafter=drafter, workload=workload, temperature=temperature, model=model, k_max=k_max,
                        num_prompts=num_prompts, max_new_tokens=max_new_tokens, exit_layer=exit_layer,
                        ngram_min=ngram_min, ngram_max=ngram_max, seed=seed, batch_size=batch_size,
                        draft_model=draft_model)
    bar, update = _progress_bar()
    with bar:
        result = measure(run, update, command=command_line())
    for path in write_outputs(result, out, trace_out):
        click.echo(f"wrote {path}")
    entry = result.profile.entries[0]
    rates = " ".join("-" if r is None else f"{r:.3f}" for r in entry.rates())
    click.echo(f"{drafter} {workload} T={temperature:g}: {entry.num_drafts} drafts, "
               f"mean accepted {entry.mean_accepted_length():.3f}, a_1..a_{k_max} = {rates}")
