"""Per-token traces of a trained head (accepted, top-1, entropy, margin, n-gram match) on held-out workloads, one
file per workload and temperature (the simulator's and the engine's replay take their calibration and scoring
halves by prompt, ``token_trace.prompt_half``), with the held-out table of all prompts and of each half.

The continuations are a training run's ``eval_trajectories.json`` (``tabletune drafter train --eval-prompts``,
generated on the GPU) or, without it, generated on the CPU as ``tabletune acceptance`` does; the head is replayed
along them on the CPU (``integrations.hf.measure``). Writes ``OUT/NAME_W_TT.csv.gz`` per workload W and
temperature T. ``--drafter ngram`` replays the n-gram lookup along the same continuations instead: the head's
traces' n-gram partner (``benchmarks/policies_sim.py``, ``trace_files``).

    python benchmarks/drafter_traces.py --head out/drafter/head --trajectories out/drafter/eval_trajectories.json \
        --name eagle-h200 --out profiles/traces
    python benchmarks/drafter_traces.py --drafter ngram --trajectories out/drafter/eval_trajectories.json \
        --workloads code-edit --temperatures 0 --name ngram-full --out profiles/traces
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tabletune.acceptance import AcceptanceCounts
from tabletune.drafter.evaluate import format_table, held_out_row, read_trajectories, split_by_prompt
from tabletune.integrations.hf.measure import AcceptanceRun, measure, write_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", choices=("eagle", "ngram"), default="eagle")
    ap.add_argument("--head", help="the trained head's folder (--drafter eagle)")
    ap.add_argument("--trajectories", help="a training run's eval_trajectories.json")
    ap.add_argument("--workloads", default="code,code-edit,chat")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--max-prompts", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--name", default="eagle")
    ap.add_argument("--out", default="profiles/traces")
    args = ap.parse_args()
    if args.drafter == "eagle" and not args.head:
        ap.error("--drafter eagle needs --head")
    rows = []
    for w in args.workloads.split(","):
        for t in (float(x) for x in args.temperatures.split(",")):
            run = AcceptanceRun(drafter=args.drafter, workload=w, temperature=t, k_max=args.k_max,
                                num_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens,
                                draft_model=args.head if args.drafter == "eagle" else None)
            trajs = read_trajectories(Path(args.trajectories), w, t, args.max_prompts) if args.trajectories else None
            m = measure(run, trajs=trajs)
            path = Path(args.out) / f"{args.name}_{w}_T{t:g}.csv.gz"
            write_trace(path, m.trace)
            print(f"wrote {path}: {len({r[0] for r in m.trace})} requests", flush=True)
            for label, part in zip(("all", "calibration", "scoring"), (m.trace, *split_by_prompt(m.trace))):
                counts, drafts = AcceptanceCounts(k_max=args.k_max), {}
                for r in part:  # a draft's rows (request, draft start) end at its first rejection
                    drafts.setdefault((r[0], r[1]), []).append(r[9])
                for acc in drafts.values():
                    counts.observe_draft(len(acc), acc.index(0) if 0 in acc else len(acc))
                num = len({r[0] for r in part})
                rows.append(held_out_row(counts, f"{w} ({label})", t, num, min(4, args.k_max)))
    print(format_table(rows))


if __name__ == "__main__":
    main()
