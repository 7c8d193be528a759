"""Online adaptation of the EAGLE head across a code -> chat switch (CPU, transformers, k = 4).

Stream: ``--code`` HumanEval requests, then MT-Bench chat (writing, roleplay, humanities): the first half of
its prompts, each with its greedy and its sampled continuation (the adaptation phase), in that order. The
other half's greedy continuations are the held-out chat set, replayed without updates before and after the
stream. The same stream runs twice from the committed head: frozen, and adapting after every request
(``tabletune.drafter.online``). Each request is replayed at its continuation's temperature (greedy: T = 0,
sampled: T = 1); the held-out set is greedy. Trajectories: the cached ones of ``tabletune acceptance``.

    python benchmarks/drafter_online.py --out benchmarks/results/drafter_online.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tabletune import fileio
from tabletune.assets import cache_dir, load_prompts
from tabletune.drafter.online import OnlineConfig, serve_stream
from tabletune.integrations.hf.eagle import EagleScorer
from tabletune.integrations.hf.model import SmolLM2Runner
from tabletune.integrations.hf.smollm2 import smollm2_model_dir

HEAD = "profiles/drafters/smollm2-135m-eagle"


def _trajectories(workload: str, temperature: int) -> dict[str, tuple[list[int], list[int]]]:
    folder = cache_dir() / "trajectories"
    path = sorted(folder.glob(f"{workload}_T{temperature}_seed0_n*_len*.json"))[-1]
    return {t["id"]: (t["prompt"], t["output"]) for t in json.loads(path.read_text())["trajectories"]}


def _a1(results) -> float:
    return sum(r.accepted_1 for r in results) / max(1, sum(r.reached_1 for r in results))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--modes", default="frozen,adapting")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    code, chat0, chat1 = _trajectories("code", 0), _trajectories("chat", 0), _trajectories("chat", 1)
    code_ids = [p.id for p in load_prompts("code")][: args.code]
    chat_ids = [p.id for p in load_prompts("chat")]
    half = len(chat_ids) // 2
    stream = [(i, "code", 0.0, *code[i]) for i in code_ids]
    for i in chat_ids[:half]:
        stream += [(i + "/T0", "chat", 0.0, *chat0[i]), (i + "/T1", "chat", 1.0, *chat1[i])]
    held = [(i, "chat-held-out", 0.0, *chat0[i]) for i in chat_ids[half:]]
    runner = SmolLM2Runner(smollm2_model_dir())
    cfg = OnlineConfig(lr=args.lr, steps=args.steps)
    rows = {}
    for mode in args.modes.split(","):
        scorer = EagleScorer(runner, Path(HEAD))
        before = serve_stream(scorer, held, cfg, adapt=False) if mode == "adapting" else None
        res = serve_stream(scorer, stream, cfg, adapt=mode == "adapting")
        after = serve_stream(scorer, held, cfg, adapt=False)
        chat = [r for r in res if r.workload == "chat"]
        upd = [r.update_ms / r.num_steps for r in res if r.update_ms > 0]
        rows[mode] = {"code_a1": _a1([r for r in res if r.workload == "code"]), "chat_first10_a1": _a1(chat[:10]),
                      "chat_last10_a1": _a1(chat[-10:]), "held_before": _a1(before) if before else _a1(after),
                      "held_after": _a1(after),
                      "update_ms_per_request": statistics.median([r.update_ms for r in res]) if upd else 0.0,
                      "update_ms_per_decode_step": statistics.median(upd) if upd else 0.0}
        print(mode, rows[mode], flush=True)
    lines = ["| run | a_1 code | a_1 chat, first 10 | a_1 chat, last 10 | held-out chat a_1 before | after | "
             "update ms / request (median) | update ms / decode step |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['code_a1']:.3f} | {r['chat_first10_a1']:.3f} | {r['chat_last10_a1']:.3f} | "
                     f"{r['held_before']:.3f} | {r['held_after']:.3f} | {r['update_ms_per_request']:.0f} | "
                     f"{r['update_ms_per_decode_step']:.1f} |")
    header = (f"Online adaptation, lr {args.lr}, {args.steps} AdamW steps per finished request, k = 4; "
              f"{len(code_ids)} code requests, then {len(stream) - len(code_ids)} chat requests "
              f"({half} MT-Bench prompts x greedy and sampled continuations); held-out chat: {len(held)} other "
              f"MT-Bench prompts.\n\n")
    fileio.write_text(args.out, header + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
