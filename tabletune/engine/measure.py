"""Measure StepProfiles of the built-in engine (GPU): T(b, k) of the whole speculative step.

One step = the drafter's k proposals + the target's verify forward over k+1
tokens + verification + state update, replayed from its CUDA graph, timed by
wall clock from the inputs' upload to the read-back of the emitted tokens (the
step's one host sync). Every sample starts from ``context_len`` cached tokens.

    python -m tabletune.engine.measure --model qwen3-8b --drafter eagle --context 1024 \\
        --max-batch 256 --out profiles/h200/qwen3-8b_eagle_ctx1024.json

Several ``--job model:drafter:context:max_batch:out`` run in one process (the
GEMM choices made at start-up are shared between them).
"""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
import traceback

import torch

from tabletune.engine.profiling import ENGINE_VERSION, RUNNER, build_engine, device_name, time_steps
from tabletune.padding import geometric_batch_sizes
from tabletune.profile import Fingerprint, StepPoint, StepProfile


def measure_profile(model: str, drafter: str, context_len: int, max_batch: int, k_max: int, steps: int,
                    command: str, draft_model: str = "qwen3-0.6b") -> StepProfile:
    buckets = tuple(geometric_batch_sizes(max_batch))
    t0 = time.perf_counter()
    engine = build_engine(model, drafter, k_max, max_batch, context_len, buckets=buckets, draft_model=draft_model)
    print(f"[{model} {drafter} ctx{context_len}] built + {len(engine.graphs)} graphs in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    points = []
    for b in buckets:
        engine.set_context(b, context_len)
        for k in range(k_max + 1):
            samples = time_steps(engine, b, k, steps, context_len)
            points.append(StepPoint(b, k, tuple(round(s, 4) for s in samples), tuple([b * (k + 1)] * len(samples))))
        print(f"  b={b:4d} " + " ".join(f"{p.median_ms:7.2f}" for p in points[-k_max - 1:]), flush=True)
    fp = Fingerprint(engine="builtin", engine_version=ENGINE_VERSION, device=device_name(engine),
                     model=f"{model} (shape, random bf16 weights)", dtype="bfloat16", runner=RUNNER,
                     drafter=drafter + (f" ({draft_model} shape)" if drafter == "draft_model" else ""),
                     command=command)
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return StepProfile(points=tuple(points), context_len=context_len, fingerprint=fp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--drafter", default="eagle")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--job", action="append", default=[], help="model:drafter:context:max_batch:out (repeatable)")
    args = ap.parse_args(argv)
    command = "python -m tabletune.engine.measure " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    jobs = [j.split(":") for j in args.job] or [[args.model, args.drafter, str(args.context),
                                                  str(args.max_batch), args.out]]
    failed = 0
    for model, drafter, ctx, max_b, out in jobs:
        try:
            prof = measure_profile(model, drafter, int(ctx), int(max_b), args.k_max, args.steps, command)
            prof.save(out)
            print(f"wrote {out}", flush=True)
        except Exception:  # one failed job must not lose the others' profiles
            failed += 1
            traceback.print_exc()
            gc.collect()
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
