"""Choose the early-exit layer m for SmolLM2-135M's self-speculative drafter.

For every m in --layers, replay the k=8 schedule along the cached greedy (T=0) trajectories of
every workload and measure a_1..a_8. Then estimate the speedup of drafting k tokens with the
first m layers, in parameters touched per token (the memory-bound regime of a GPU decode step):

    c(m)          = (m * P_layer + P_head) / (L * P_layer + P_head)     draft token / target token
    E_k           = 1 + sum_{j<=k} prod_{i<=j} a_i                      tokens per verify step
    speedup(m, k) = E_k / (1 + k * c(m))

(P_layer: parameters of one decoder layer, P_head: the tied LM head, L = 30.) Without LayerSkip-style
training no m reaches speedup > 1 (the LM head alone costs 0.21 of a target token), so the rule is
on quality: the chosen m is the smallest whose pooled greedy a_1 >= 0.5 (the drafter agrees with the
target at least half the time), else the deepest swept. Writes benchmarks/results/early_exit_layers.{json,md}.

    python benchmarks/early_exit_layer_sweep.py --num-prompts 12 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from tabletune import fileio
from tabletune.acceptance import AcceptanceCounts
from tabletune.assets import WORKLOADS
from tabletune.integrations.hf.smollm2 import smollm2_model_dir
from tabletune.integrations.hf.measure import AcceptanceRun, early_exit_proposer, trajectories
from tabletune.integrations.hf.replay import count, replay

RESULTS = Path(__file__).resolve().parent / "results"


def speedup(rates: list[float], k: int, cost: float) -> float:
    """E_k / (1 + k c): expected tokens per verify step over the cost of drafting k tokens."""
    survival, expected = 1.0, 1.0
    for a in rates[:k]:
        survival *= a
        expected += survival
    return expected / (1 + k * cost)


def sweep(args: argparse.Namespace) -> dict:
    from tabletune.integrations.hf.model import SmolLM2Runner

    runner = SmolLM2Runner(smollm2_model_dir(), threads=int(os.environ.get("TABLETUNE_TORCH_THREADS", "1")))
    cfg = runner.model.config
    head = cfg.vocab_size * cfg.hidden_size
    layer = (sum(p.numel() for p in runner.model.parameters()) - head - cfg.hidden_size) / cfg.num_hidden_layers
    pooled = {m: AcceptanceCounts(k_max=8) for m in args.layers}
    per_workload: dict[str, dict[int, list]] = {}
    for w in WORKLOADS:
        run = AcceptanceRun(drafter="early-exit", workload=w, temperature=0.0, num_prompts=args.num_prompts,
                            max_new_tokens=args.max_new_tokens, batch_size=args.num_prompts)
        replays = {m: [] for m in args.layers}
        for i, t in enumerate(trajectories(run, runner)):
            scores = runner.score(t.prompt, t.output, args.layers, 0.0)
            for m in args.layers:
                propose = early_exit_proposer(t.prompt + t.output, len(t.prompt), scores[m], run)
                replays[m].append(replay(t.id, len(t.output), 8, propose, np.random.default_rng(i)))
        per_workload[w] = {}
        for m in args.layers:
            c = count(replays[m], 8)
            per_workload[w][m] = [None if r is None else round(r, 4) for r in c.rates()]
            for field in ("reached", "accepted", "drafted"):
                getattr(pooled[m], field)[:] = [a + b for a, b in zip(getattr(pooled[m], field), getattr(c, field))]
            pooled[m].num_drafts += c.num_drafts
        print(w, {m: per_workload[w][m][0] for m in args.layers}, flush=True)
    rows = []
    for m in args.layers:
        rates = [r if r is not None else 0.0 for r in pooled[m].rates()]
        cost = (m * layer + head) / (cfg.num_hidden_layers * layer + head)
        best_k = max(range(1, 9), key=lambda k: speedup(rates, k, cost))
        rows.append({"exit_layer": m, "draft_cost": round(cost, 4), "rates": [round(r, 4) for r in rates],
                     "best_k": best_k, "speedup": round(speedup(rates, best_k, cost), 4)})
    good = [r["exit_layer"] for r in rows if r["rates"][0] >= 0.5]
    chosen = min(good) if good else max(args.layers)
    return {"layers": rows, "per_workload_rates": per_workload, "chosen_exit_layer": chosen,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
            "params_per_layer": int(layer), "params_lm_head": head}


def markdown(result: dict) -> str:
    lines = [f"Early-exit layer sweep, SmolLM2-135M, T=0, pooled over {', '.join(WORKLOADS)} "
             f"(first {result['num_prompts']} prompts each, up to {result['max_new_tokens']} tokens). "
             f"Chosen m = {result['chosen_exit_layer']}.", "",
             "| m | draft cost c(m) | a_1 | a_2 | a_3 | a_4 | best k | est. speedup |", "|---|---|---|---|---|---|---|---|"]
    for r in result["layers"]:
        a = r["rates"]
        lines.append(f"| {r['exit_layer']} | {r['draft_cost']:.3f} | {a[0]:.3f} | {a[1]:.3f} | {a[2]:.3f} | {a[3]:.3f} "
                     f"| {r['best_k']} | {r['speedup']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8, 12, 16, 20, 24, 26, 28])
    args = ap.parse_args()
    result = sweep(args)
    fileio.write_json(RESULTS / "early_exit_layers.json", result)
    fileio.write_text(RESULTS / "early_exit_layers.md", markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
