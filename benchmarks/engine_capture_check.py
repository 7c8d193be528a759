"""Why a graph captured at start-up replays slower than the same step captured later (GPU diagnostic).

Engine 0.3's roofline run saw b=1, k=0 replay at 4.85 ms from the start-up graph and 4.62 ms
from a graph of the same step captured later in the run. This times, interleaved, for a few
(b, k): the start-up graph and re-captures of the same step body (into the engine's shared
pool, and into a private pool), each replayed (a) straight after the host call, as the
roofline's GPU timing does, and (b) behind a ~0.3 ms sleep kernel, so the GPU never waits for
the host's graph launch. It also reports the host time of ``graph.replay()`` itself, and
compares the step's input upload as the graph's first node (engine 0.4) with a separate
copy before the replay (engine 0.3) and with no upload, GPU and wall time.

    python benchmarks/engine_capture_check.py --out $OUT/capture_check
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tabletune import fileio
from tabletune.engine.profiling import build_engine
from tabletune.padding import geometric_batch_sizes as power_of_two_buckets

SLEEP_CYCLES = 600_000  # ~0.3 ms at ~2 GHz


def _time(engine, g, b: int, ctx: int, busy: bool) -> tuple[float, float]:
    """(GPU ms between events around the replay, host µs of the replay call)."""
    engine.reset_rows(b, ctx)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if busy:
        torch.cuda._sleep(SLEEP_CYCLES)
    e0.record()
    t0 = time.perf_counter()
    g.replay()
    host_us = (time.perf_counter() - t0) * 1e6
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1), host_us


def _time_upload(engine, g_plain, b: int, k: int, ctx: int, variant: str) -> tuple[float, float]:
    """(GPU ms from before the host's input write to the end of the step, wall ms to the read-back)."""
    slots = list(range(b))
    engine.reset_rows(b, ctx)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    e0.record()
    if variant == "in-graph upload":  # engine.launch: host write, the graph copies it in
        buf = engine.launch(slots, k)
    else:
        buf = engine.buffers[b]
        host = buf.host.numpy()
        host[0, :b], host[1, :b] = slots, k
        if variant == "upload + replay":  # engine 0.3: a separate copy before the replay
            buf.inputs.copy_(buf.host, non_blocking=True)
        g_plain.replay()
    e1.record()
    buf.out[:b, : k + 2].tolist()
    wall = (time.perf_counter() - t0) * 1e3
    return e0.elapsed_time(e1), wall


def upload_variants(engine, points, ctx: int, reps: int) -> list[str]:
    lines = []
    for b, k in points:
        engine.set_context(b, ctx)
        g_plain = engine.capture_step(b, k, torch.cuda.graph_pool_handle(), upload=False)
        variants = ("in-graph upload", "upload + replay", "replay only")
        got = {v: [] for v in variants}
        for _ in range(reps):
            for v in variants:
                got[v].append(_time_upload(engine, g_plain, b, k, ctx, v))
        lines.append(f"b={b:3d} k={k}: " + ", ".join(
            f"{v} {statistics.median(x[0] for x in got[v]):.3f} GPU / {statistics.median(x[1] for x in got[v]):.3f} wall"
            for v in variants) + " ms")
        print(lines[-1], flush=True)
        del g_plain
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--out", default="capture_check")
    args = ap.parse_args(argv)
    buckets = tuple(power_of_two_buckets(args.max_batch))
    t0 = time.perf_counter()
    engine = build_engine(args.model, "replay", 7, args.max_batch, args.context, buckets=buckets)
    print(f"built + {len(engine.graphs)} graphs in {time.perf_counter() - t0:.1f} s, "
          f"reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB", flush=True)
    lines = upload_variants(engine, [(b, k) for b, k in ((1, 0), (1, 7), (8, 3), (32, 7)) if b <= args.max_batch],
                            args.context, args.reps)
    rows = []
    for b, k in ((1, 0), (1, 7), (8, 3), (16, 5), (32, 7)):
        if b > args.max_batch:
            continue
        engine.set_context(b, args.context)
        engine.buffers[b].slots.copy_(torch.arange(b))
        engine.buffers[b].cap.fill_(k)
        graphs = {"startup": engine.graphs[(b, k)], "shared": engine.capture_step(b, k, engine.graph_pool, upload=False),
                  "private": engine.capture_step(b, k, torch.cuda.graph_pool_handle(), upload=False)}
        samples = {(n, busy): [] for n in graphs for busy in (False, True)}
        hosts = {n: [] for n in graphs}
        for _ in range(args.reps):
            for (name, busy), out in samples.items():
                ms, host = _time(engine, graphs[name], b, args.context, busy)
                out.append(ms)
                hosts[name].append(host)
        med = {key: statistics.median(v) for key, v in samples.items()}
        row = {"batch_size": b, "k": k, **{f"{n}_{'busy' if busy else 'plain'}_ms": round(v, 4)
                                           for (n, busy), v in med.items()},
               **{f"{n}_host_us": round(statistics.median(v), 1) for n, v in hosts.items()}}
        rows.append(row)
        line = (f"b={b:3d} k={k}: " + ", ".join(f"{n}{'+sleep' if busy else ''} {v:.3f}" for (n, busy), v in med.items())
                + " ms; host replay " + ", ".join(f"{n} {statistics.median(v):.0f}us" for n, v in hosts.items()))
        print(line, flush=True)
        lines.append(line)
        del graphs
    fileio.write_json(args.out + ".json", {"model": args.model, "context_len": args.context, "rows": rows})
    fileio.write_text(args.out + ".md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
