"""Step time over the roofline floor for the built-in engine (run on the GPU, one invocation).

Measures the copy bandwidth and the bf16 matrix rate before and after the grid (the floor
uses the higher reading of each), and times the verify step
(target forward over q = k+1 tokens, LM head, greedy verification, state update;
the replay drafter costs a gather) of a random-weight model for every
b in 1, 2, 4, ..., max_batch and k in 0..k_max, and reports step / floor with
floor = max(bytes / bandwidth, FLOPs / matrix rate) (``tabletune.engine.profiling``).

    python benchmarks/engine_roofline.py --model qwen3-8b --context 1024 --out benchmarks/results/engine_roofline_h200
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import statistics
import time

import torch

from tabletune import fileio
from tabletune.engine import cublaslt, gemm, gemm_wgmma, kernels
from tabletune.engine.gpu_monitor import GpuMonitor, GpuWindow
from tabletune.engine.profiling import (ENGINE_VERSION, Ceilings, build_engine, command_line, device_name,
                                        measure_ceilings, serial_floor_ms, step_floor_ms, time_replays_gpu, time_steps)
from tabletune.engine.presets import resolve
from tabletune.padding import geometric_batch_sizes as power_of_two_buckets


def diagnose(model: str) -> list[str]:
    """Achieved bandwidth of the layer's GEMMs (as chosen by gemm.py) and of attention per split count,
    each timed as 10 calls inside a CUDA graph (``gemm._time_us``: no host launch cost)."""
    cfg = resolve(model)
    d = cfg.head_dim
    shapes = cfg.layer_gemm_shapes()
    lines = []
    for name, (n, kk) in shapes.items():
        ws = [torch.randn(n, kk, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
        for m in (1, 8, 16, 32, 64):
            x = torch.randn(m, kk, dtype=torch.bfloat16, device="cuda")
            i = [0]

            def f():
                i[0] = (i[0] + 1) % 4
                return gemm.linear(x, ws[i[0]])
            us = gemm._time_us(f)
            lines.append(f"gemm {name:8s} M={m:3d}: {us:7.1f} us {n * kk * 2 / us / 1e3:6.0f} GB/s "
                         f"{gemm._choice.get((m, n, kk, False))}")
    ctx = 1024
    for b in (1, 8, 32, 64, 128, 256):
        for q in (1, 3, 8):
            kc = torch.randn(b + 1, cfg.num_kv_heads, ctx + 16, d, dtype=torch.bfloat16, device="cuda")
            vc = torch.randn_like(kc)
            qq = torch.randn(b, q, cfg.num_heads, d, dtype=torch.bfloat16, device="cuda")
            start = torch.full((b,), ctx, dtype=torch.long, device="cuda")
            slots = torch.arange(b, device="cuda")
            kv = b * (ctx + q) * cfg.num_kv_heads * d * 2 * 2
            default = kernels.num_splits_for(b, cfg.num_kv_heads)
            cells = []
            for splits in sorted({1, 2, 3, 4, 8, 16, default}):
                us = gemm._time_us(lambda: kernels.attention(qq, kc, vc, start, slots, d ** -0.5, splits))
                cells.append(f"{splits}{'*' if splits == default else ''}:{us:.1f}us/{kv / us / 1e3:.0f}GB/s")
            lines.append(f"attn b={b:3d} q={q} (KV of one layer, L2-warm when small) " + " ".join(cells))
            del kc, vc
    return lines


def kernel_breakdown(engine, batch_size: int, k: int, context_len: int, top: int = 12) -> list[str]:
    """GPU time per kernel of one eager step (CUPTI), largest first."""
    from torch.profiler import ProfilerActivity, profile

    engine.set_context(batch_size, context_len)
    buf = engine.buffers[batch_size]
    buf.slots.copy_(torch.arange(batch_size))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine._step_body(buf, k)
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            name = ev.name[:60]
            n, us = rows.get(name, (0, 0.0))
            rows[name] = (n + 1, us + ev.device_time_total)
    total = sum(us for _, us in rows.values())
    lines = [f"kernels of one step b={batch_size} k={k}: {total / 1e3:.2f} ms GPU, {sum(n for n, _ in rows.values())} launches"]
    for name, (n, us) in sorted(rows.items(), key=lambda r: -r[1][1])[:top]:
        lines.append(f"  {us / 1e3:7.3f} ms {n:5d}x  {name}")
    return lines


def pdl_compare(engine, points, context_len: int, reps: int = 20) -> list[str]:
    """GPU time of one step's graph captured with PDL and the GEMM weight prefetch, with PDL alone, and with neither."""
    import os

    prefetch = gemm.PREFETCH_K
    variants = (("pdl+prefetch", "1", prefetch), ("pdl", "1", 0), ("off", "0", 0))
    lines = []
    for b, k in points:
        ms = {}
        for name, flag, pf in variants:
            os.environ["TABLETUNE_PDL"], gemm.PREFETCH_K = flag, pf
            buf = engine.buffers[b]
            engine.set_context(b, context_len)
            buf.slots.copy_(torch.arange(b))
            g = engine.capture_step(b, k, upload=False)  # compiles the kernels of this setting outside the capture
            ms[name] = statistics.median(engine.timed_ms(g.replay, b, context_len) for _ in range(reps))
            del g
        lines.append(f"b={b:3d} k={k}: " + ", ".join(f"{n} {t:.3f} ms" for n, t in ms.items()))
    os.environ["TABLETUNE_PDL"], gemm.PREFETCH_K = "1", prefetch
    return lines


def capture_variants(engine, b: int, k: int, variants: dict[str, dict], upload: bool) -> dict:
    """name -> the step of bucket b with k drafts captured with the engine attributes ``variants[name]`` set
    (restored after each capture); a variant that fails to capture is reported and left out."""
    graphs = {}
    for name, settings in variants.items():
        try:
            with engine_settings(engine, settings):
                graphs[name] = engine.capture_step(b, k, upload=upload)
        except Exception as exc:  # report and go on with the other variants
            print(f"b={b} k={k} {name}: {type(exc).__name__}: {exc}", flush=True)
    return graphs


@contextlib.contextmanager
def engine_settings(engine, settings: dict):
    """The engine attributes ``settings`` (name -> value; "kernels.<name>" / "gemm.<name>": that module attribute
    of ``tabletune.engine.kernels`` / ``gemm``) set for the block, the previous values back after it."""
    modules = {"kernels": kernels, "gemm": gemm}

    def owner(attr):
        prefix, _, name = attr.partition(".")
        return (modules[prefix], name) if name and prefix in modules else (engine, attr)
    saved = {attr: getattr(*owner(attr)) for attr in settings}
    for attr, value in settings.items():
        setattr(*owner(attr), value)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(*owner(attr), value)


def interleaved_replays(engine, graphs: dict, b: int, k: int, context_len: int, reps: int,
                        gpu_clock: bool) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """Replay each graph of bucket b in turn, ``reps`` rounds, each from the same state: ms per replay (CUDA
    events around the replay with ``gpu_clock``, else the host clock to the read-back) and each graph's last
    emitted tokens [b, k+2] on the host."""
    buf = engine.buffers[b]
    times = {name: [] for name in graphs}
    outs = {}
    for _ in range(reps):
        for name, graph in graphs.items():
            engine.reset_rows(b, context_len)
            engine.last_token[:b] = engine.history[:b, context_len]  # the other graph's step overwrote it
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            graph.replay()
            e1.record()
            outs[name] = buf.out[:b, : k + 2].cpu()  # the read-back (a sync)
            times[name].append(e0.elapsed_time(e1) if gpu_clock else (time.perf_counter() - t0) * 1e3)
    return times, outs


def variant_compare(engine, points, context_len: int, make_variants, reps: int = 15) -> tuple[list[str], list[dict]]:
    """GPU time of one step's graph per variant (``make_variants(b)`` -> name -> engine attributes; the first is
    the baseline), graphs captured here, replays interleaved, median of ``reps``; and whether every variant
    emits the same tokens as the baseline."""
    lines, rows = [], []
    for b, k in points:
        buf = engine.buffers[b]
        engine.set_context(b, context_len)
        buf.host[0, :b], buf.host[1, :b] = torch.arange(b), k
        buf.inputs.copy_(buf.host)
        variants = make_variants(b)
        base = next(iter(variants))
        graphs = capture_variants(engine, b, k, variants, upload=False)
        times, outs = interleaved_replays(engine, graphs, b, k, context_len, reps, gpu_clock=True)
        ref = statistics.median(times[base])
        row = {"batch_size": b, "k": k, f"{base}_ms": round(ref, 4)}
        cells = []
        for name in list(graphs)[1:]:
            ms = statistics.median(times[name])
            same = bool((outs[name] == outs[base]).all())
            row[name] = {"ms": round(ms, 4), "same_tokens": same}
            cells.append(f"{name} {ms:.3f} ms ({(ms / ref - 1) * 100:+.1f}%{'' if same else ', TOKENS DIFFER'})")
        lines.append(f"b={b:3d} k={k}: {base} {ref:.3f} ms; " + "; ".join(cells))
        rows.append(row)
        print(lines[-1], flush=True)
        del graphs
    return lines, rows


def prefetch_compare(engine, points, context_len: int, modes, programs=(16,), reps: int = 15
                     ) -> tuple[list[str], list[dict]]:
    """Each layer's o weight hinted into L2 during RoPE + attention (``EngineConfig.prefetch_max_batch``), per hint
    mode and prefetch-kernel program count, against no prefetch."""
    def variants(b):
        return {"off": {"prefetch_max_batch": 0},
                **{f"{mode}/{p}": {"prefetch_max_batch": b, "prefetch_mode": mode, "prefetch_programs": p}
                   for mode in modes for p in programs}}
    return variant_compare(engine, points, context_len, variants, reps)


def fusion_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """RoPE + cache write as their own launch (engine 0.5) against inside the attention launch (0.6), and with the
    fused-norm layers too (``EngineConfig.fuse_norm_max_rows``: steps of <= model.FUSED_NORM_MAX_M rows, 16 where
    the wgmma kernel's fused epilogues cannot run)."""
    from tabletune.engine.model import FUSED_NORM_MAX_M

    return variant_compare(engine, points, context_len,
                           lambda b: {"unfused": {"fuse_rope": False, "fuse_norm_max_rows": 0},
                                      "fused": {"fuse_rope": True, "fuse_norm_max_rows": 0},
                                      "fused+norm": {"fuse_rope": True, "fuse_norm_max_rows": FUSED_NORM_MAX_M}},
                           reps)


def attention_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Every attention launch with engine 0.7.dev2's fixed config (``kernels.default_attn_config``) against the
    configs ``kernels.choose_attention`` timed (0.7.dev3)."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"fixed-attn": {"kernels.attn_chooser": False}, "chosen-attn": {}}, reps)


def parse_cells(text: str) -> list[tuple[int, int]]:
    """"1:0,8:3" -> [(1, 0), (8, 3)]: the (b, k) cells a comparison times."""
    try:
        return [(int(b), int(k)) for b, k in (cell.split(":") for cell in text.split(","))]
    except ValueError:
        raise ValueError(f"cells {text!r}: expected b:k,b:k,...") from None


def parse_prefetch_variant(text: str) -> dict:
    """"w2a4" -> the kernels' L2-hint settings (``wN``: ``attn_prefetch_wait`` N tiles, ``aN``:
    ``attn_prefetch_ahead`` N tiles; either may be left out)."""
    m = re.fullmatch(r"(?:w(\d+))?(?:a(\d+))?", text)
    if not text or m is None:
        raise ValueError(f"--attn-prefetch-variants: {text!r} is not wN, aN or wNaM")
    wait, ahead = (int(v) if v else 0 for v in m.groups())
    for tiles in (wait, ahead):
        if tiles not in kernels.PREFETCH_TILES:
            raise ValueError(f"--attn-prefetch-variants: {text!r}: tiles must be one of {kernels.PREFETCH_TILES}")
    return {"kernels.attn_prefetch_wait": wait, "kernels.attn_prefetch_ahead": ahead}


def attn_prefetch_compare(engine, points, context_len: int, variants: list[str], reps: int = 15
                          ) -> tuple[list[str], list[dict]]:
    """The attention launches without L2 hints of the KV against each hint variant (``parse_prefetch_variant``)."""
    settings = {"no-kv-hints": {"kernels.attn_prefetch_wait": 0, "kernels.attn_prefetch_ahead": 0},
                **{v: parse_prefetch_variant(v) for v in variants}}
    return variant_compare(engine, points, context_len, lambda b: settings, reps)


def _tile_text(force) -> str:
    """A ``kernels.attn_force`` value as BLOCK_N/WARPS/STAGES/SPLITS, None as "start-up"."""
    return "start-up" if force is None else "/".join(str(v) for v in force)


def parse_attn_tile(text: str) -> tuple:
    """"64/4/3" -> (keys a tile, warps, stages, None: ``wave_splits``); "64/4/3/2": 2 splits (a value of
    ``kernels.attn_force``)."""
    parts = text.split("/")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts):
        raise ValueError(f"--attn-tile-variants: {text!r} is not BLOCK_N/WARPS/STAGES[/SPLITS]")
    block_n, warps, stages, *splits = (int(p) for p in parts)
    return block_n, warps, stages, (splits[0] if splits else None)


def attn_tile_compare(engine, points, context_len: int, variants: list[str], reps: int = 15
                      ) -> tuple[list[str], list[dict]]:
    """The step with its start-up attention configs against every launch forced to each tile (``parse_attn_tile``):
    what an in-step choice of the attention config would pick, where the chooser times launches alone."""
    settings = {"startup-attn": {"kernels.attn_force": None},
                **{v: {"kernels.attn_force": parse_attn_tile(v)} for v in variants}}
    return variant_compare(engine, points, context_len, lambda b: settings, reps)


def attn_step_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph without the in-step attention choice (every launch as the start-up chooser gives it)
    against the tiles the engine kept from timing them inside the step (``SpecEngine.attn_step_force``)."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"no-step-choice": {"attn_step_force": {}}, "step-choice": {}}, reps)


def attn_rows_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with every attention program taking all G x q query rows of its KV head (engine 0.7.dev5)
    against programs of at most 16 rows (``kernels.attn_max_rows``), with the splits kept and divided by the head
    groups."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"rows-all": {"kernels.attn_max_rows": 0},
                                      "rows16": {"kernels.attn_max_rows": 16, "kernels.attn_rows_halve_splits": False},
                                      "rows16-fewer-splits": {"kernels.attn_max_rows": 16,
                                                              "kernels.attn_rows_halve_splits": True}}, reps)


def gemm_atomic_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the split-K fix-up of the o and down GEMMs against their partials added atomically
    into an accumulator that the next add_rms_norm reads and zeroes (``gemm.atomic_split``; the same bits), at
    every M (the engine's default takes the atomics at M <= ``gemm.ATOMIC_MAX_ROWS`` only, from this A/B)."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"fix-up": {"gemm.atomic_split": False},
                                      "atomic": {"gemm.atomic_split": True, "gemm.ATOMIC_MAX_ROWS": 1 << 20}}, reps)


def gemm_lt_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the GEMM choices made without cuBLASLt's heuristic kernels (``gemm.use_lt`` off: the
    fastest other candidate) against the choices made with them."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"no-lt-algos": {"gemm.use_lt": False}, "lt-algos": {}}, reps)


def gemm_policy_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the GEMM chooser's picks against every GEMM as plain ``torch.mm`` (cuBLAS's own
    kernel choice, ``gemm.enabled`` off): whether the picks, timed alone, also pay inside the step."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"chooser": {}, "cublas-only": {"gemm.enabled": False}}, reps)


def gemm_triton_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the GEMM chooser's picks against every GEMM on its fastest Triton config where one
    was timed (``gemm.triton_only``: the PDL chain of the step kept at the cost of each GEMM's own time)."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"chooser": {}, "triton-only": {"gemm.triton_only": True}}, reps)


TRITON_ONLY = "/triton-only"


def with_own_step_choice(variants: dict) -> dict:
    """Each variant twice, with the start-up's record of in-step GEMM choices emptied: as captured, and under
    ``gemm.triton_only`` (``best_of_step_choice`` keeps the faster, as ``_choose_gemms_in_step`` would at a start-up
    with that variant's settings). Without this every variant inherits the choice made for the engine's own
    settings."""
    out = {}
    for name, settings in variants.items():
        out[name] = {**settings, "gemm_step_triton": {}}
        out[name + TRITON_ONLY] = {**settings, "gemm_step_triton": {}, "gemm.triton_only": True}
    return out


def best_of_step_choice(row: dict, names: list[str], max_rows: int) -> dict[str, float]:
    """variant -> ms of its faster capture in a ``variant_compare`` row of ``with_own_step_choice`` variants (the
    Triton-only capture counts only for steps of at most ``max_rows`` target rows, as at start-up)."""
    def ms(name):
        return row[f"{name}_ms"] if f"{name}_ms" in row else row[name]["ms"]
    small = row["batch_size"] * (row["k"] + 1) <= max_rows
    return {n: min(ms(n), ms(n + TRITON_ONLY)) if small else ms(n) for n in names}


def own_choice_compare(engine, points, context_len: int, off: str, on: str, off_settings: dict, reps: int = 15
                       ) -> tuple[list[str], list[dict]]:
    """Each step's graph with variant ``off`` (``off_settings``) against ``on`` (the engine's settings), each
    with its own in-step GEMM choice (``with_own_step_choice``); a line per cell compares the faster capture of
    each (``best_of_step_choice``)."""
    lines, rows = variant_compare(engine, points, context_len,
                                  lambda b: with_own_step_choice({off: off_settings, on: {}}), reps)
    for row in rows:
        best = best_of_step_choice(row, [off, on], engine.cfg.gemm_step_max_rows if engine.cfg.gemm_step_choice else 0)
        row["own_step_choice_ms"] = {n: round(v, 4) for n, v in best.items()}
        lines.append(f"b={row['batch_size']:3d} k={row['k']}, each with its own in-step choice: {off} "
                     f"{best[off]:.3f} ms; {on} {best[on]:.3f} ms ({(best[on] / best[off] - 1) * 100:+.1f}%)")
        print(lines[-1], flush=True)
    return lines, rows


def gemm_wgmma_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the GEMM choices made without the Gluon wgmma kernel (``gemm.use_wgmma`` off: the
    fastest other candidate) against the choices made with it (``gemm.WGMMA`` on: the chooser timed it), each
    variant with its own in-step GEMM choice."""
    return own_choice_compare(engine, points, context_len, "no-wgmma", "wgmma", {"gemm.use_wgmma": False}, reps)


def gemm_stream_k_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the GEMM choices made without the stream-K wgmma configs (``gemm.use_stream_k`` off)
    against those made with them, each variant with its own in-step GEMM choice; the chooser times them only with
    TABLETUNE_GEMM_WGMMA_STREAM_K=1 at start-up (else the two variants are the same)."""
    return own_choice_compare(engine, points, context_len, "no-stream-k", "stream-k", {"gemm.use_stream_k": False},
                              reps)


def gemm_context_compare(engine, points, context_len: int, reps: int = 15) -> tuple[list[str], list[dict]]:
    """Each step's graph with the GEMM choices made from timings alone against those made from timings in context
    (each candidate followed by a PDL kernel) at every M and at M >= ``gemm.CONTEXT_MIN_ROWS`` (the default); needs
    TABLETUNE_GEMM_TIMING=both at start-up."""
    return variant_compare(engine, points, context_len,
                           lambda b: {"timed-alone": {"gemm.use_context": False},
                                      "in-context-all": {"gemm.CONTEXT_MIN_ROWS": 1},
                                      f"in-context-m>={gemm.CONTEXT_MIN_ROWS}": {}}, reps)


def lt_summary() -> tuple[list[str], list[dict]]:
    """Where the chooser kept a cuBLASLt heuristic kernel: its time against the fastest other candidate."""
    rows = []
    for (m, n, kk, g), c in sorted(gemm._choice.items(), key=lambda kv: str(kv[0])):
        timed = gemm._scores((m, n, kk, g))
        others = {o: us for o, us in timed.items() if not isinstance(o, cublaslt.Algo)}
        if isinstance(c, cublaslt.Algo) and others:
            best = min(others, key=others.get)
            rows.append({"m": m, "n": n, "k": kk, "choice": c.label(), "us": round(timed[c], 2),
                         "best_other": _choice_label(best), "best_other_us": round(others[best], 2)})
    lines = [f"cuBLASLt heuristic kernel kept at {len(rows)} of {len(gemm._choice)} GEMM shapes"]
    lines += [f"  M={r['m']} N={r['n']} K={r['k']}: {r['choice']} {r['us']:.2f} us, best other {r['best_other']} "
              f"{r['best_other_us']:.2f} us ({(r['us'] / r['best_other_us'] - 1) * 100:+.1f}%)" for r in rows]
    return lines, rows


def context_summary() -> list[str]:
    """The GEMM shapes whose fastest candidate timed in context (followed by a PDL kernel) is not the one timed
    alone (only when both were timed, TABLETUNE_GEMM_TIMING=both)."""
    both = [key for key in gemm._choice if key in gemm._timings and key in gemm._context_timings]
    lines = []
    for key in sorted(both, key=str):
        alone, ctx = gemm._timings[key], gemm._context_timings[key]
        a, c = min(alone, key=alone.get), min(ctx, key=ctx.get)
        if a != c:
            lines.append(f"  M={key[0]} N={key[1]} K={key[2]}{' gated' if key[3] is True else ''}: alone "
                         f"{_choice_label(a)} {alone[a]:.2f} us; in context {_choice_label(c)} {ctx[c]:.2f} us "
                         f"({ctx.get(a, float('nan')):.2f} us for the other)")
    return [f"GEMM choice timed in context differs from alone at {len(lines)} of {len(both)} shapes"] + lines


def _choice_label(c) -> str:
    """A GEMM choice of ``gemm._choice`` as text."""
    if isinstance(c, cublaslt.Algo):
        return c.label()
    if c is None or isinstance(c, (int, str)):
        return "cublas" if c is None else f"cublas on {c} rows" if isinstance(c, int) else c
    if isinstance(c, gemm_wgmma.WgmmaConfig):
        return "wgmma" + str(tuple(c))
    return ("triton-tma" if c.tma else "triton-stream-k" if c.stream_k else "triton") + str(tuple(c[:6]))


def overlap_compare(engine, points, context_len: int, carveouts=(0,), reps: int = 12) -> tuple[list[str], list[dict]]:
    """The step as captured at start-up vs the two-stream half-batch forward (``EngineConfig.overlap_min_tokens``)
    with each SM carveout for the cuBLAS GEMMs, each captured with its upload, interleaved, timed by wall clock to
    the read-back; plus the share of rows whose first emitted token matches the single-stream step (from the same
    state; bf16: a near-tie may round the other way in a different batch shape)."""
    lines, rows = [], []
    for b, k in points:
        buf = engine.buffers[b]
        engine.set_context(b, context_len)
        host = buf.host.numpy()
        host[0, :b], host[1, :b] = list(range(b)), k
        # each variant's warm-up makes the GEMM choices for the half-batch shapes and the lane-1 tickets
        graphs = {"single": engine.graphs[(b, k)]}
        graphs.update(capture_variants(engine, b, k, {
            f"two-stream carveout {carve}": {"overlap_min_tokens": 1, "overlap_sm_carveout": carve}
            for carve in carveouts}, upload=True))
        times, outs = interleaved_replays(engine, graphs, b, k, context_len, reps, gpu_clock=False)
        single = statistics.median(times["single"])
        row = {"batch_size": b, "k": k, "single_ms": round(single, 4)}
        cells = []
        for name in list(graphs)[1:]:
            ms = statistics.median(times[name])
            same = float((outs["single"][:, 1] == outs[name][:, 1]).float().mean())
            row[name] = {"ms": round(ms, 4), "same_first_token": round(same, 4)}
            cells.append(f"{name} {ms:.2f} ms ({(ms / single - 1) * 100:+.1f}%, same token {same:.0%})")
        lines.append(f"b={b:3d} k={k}: single {single:.2f} ms; " + "; ".join(cells))
        rows.append(row)
        print(lines[-1], flush=True)
        del graphs
    return lines, rows


def _window_text(w) -> str:
    """A GpuWindow as text (nvidia-smi's view of a grid row)."""
    if w is None:
        return "(no nvidia-smi samples)"
    return (f"SM clock {w.sm_clock_mhz_min:.0f}-{w.sm_clock_mhz_median:.0f} MHz (min-median), "
            f"power <= {w.power_w_max:.0f} W, <= {w.temperature_c_max:.0f} C")


def write_results(args, ceil, rows: list[dict], device: str, buckets, overlap_rows: list[dict] = (),
                  readings=(), variant_rows: list[dict] = (), step_choices: list[dict] = (),
                  gemm_lt: list[dict] = (), gemm_steps: list[dict] = ()) -> None:
    worst = {name: (max((r[key] for r in rows if r["batch_size"] <= 32), default=0.0), max(r[key] for r in rows))
             for name, key in (("wall", "ratio"), ("gpu", "gpu_ratio"), ("serial", "serial_ratio"))}
    n32 = sum(r["ratio"] <= 1.3 for r in rows if r["batch_size"] <= 32)
    t32 = sum(r["batch_size"] <= 32 for r in rows)
    n15 = sum(r["ratio"] <= 1.5 for r in rows)
    result = {"device": device, "cells_le_1_3_b_le_32": f"{n32}/{t32}", "cells_le_1_5": f"{n15}/{len(rows)}",
              "model": args.model, "context_len": args.context, "engine_version": ENGINE_VERSION,
              "bandwidth_gb_s": round(ceil.bandwidth_gb_s, 1), "matrix_tflop_s": round(ceil.matrix_tflop_s, 1),
              "worst_ratio_b_le_32": worst["wall"][0], "worst_ratio": worst["wall"][1],
              "worst_gpu_ratio_b_le_32": worst["gpu"][0], "worst_gpu_ratio": worst["gpu"][1],
              "worst_serial_ratio_b_le_32": worst["serial"][0], "worst_serial_ratio": worst["serial"][1],
              "ceiling_readings": [{"bandwidth_gb_s": round(c.bandwidth_gb_s, 1), "matrix_tflop_s": round(c.matrix_tflop_s, 1)}
                                   for c in readings],
              "command": command_line(), "rows": rows, "overlap_rows": list(overlap_rows),
              "variant_rows": list(variant_rows), "attn_step_choices": list(step_choices),
              "gemm_lt_choices": list(gemm_lt), "gemm_step_choices": list(gemm_steps)}
    fileio.write_json(args.out + ".json", result)
    md = [f"# step / roofline floor, {args.model}, context {args.context}, {device}", "",
          f"copy {ceil.bandwidth_gb_s:.0f} GB/s, bf16 matmul {ceil.matrix_tflop_s:.0f} TFLOP/s; "
          f"worst ratio b<=32: {worst['wall'][0]:.2f}x, everywhere: {worst['wall'][1]:.2f}x (wall: upload, replay, "
          f"read-back); GPU time of the replay alone: {worst['gpu'][0]:.2f}x and {worst['gpu'][1]:.2f}x; wall over the "
          f"serial floor (attention and GEMMs not overlapped): {worst['serial'][0]:.2f}x and {worst['serial'][1]:.2f}x; "
          f"cells <= 1.3x at b <= 32: {n32}/{t32}, cells <= 1.5x: {n15}/{len(rows)}",
          "", "Cells: wall ms (wall / floor, GPU replay / floor, wall / serial floor).", "",
          "| b | " + " | ".join(f"k={k}" for k in range(args.k_max + 1)) + " |",
          "|---|" + "---|" * (args.k_max + 1)]
    for b in buckets:
        cells = [f"{r['step_ms']:.2f} ({r['ratio']:.2f}x, {r['gpu_ratio']:.2f}x, {r['serial_ratio']:.2f}x)"
                 for r in rows if r["batch_size"] == b]
        md.append(f"| {b} | " + " | ".join(cells) + " |")
    md += ["", "GPU state per row (nvidia-smi every 0.5 s while the row ran):", ""]
    for b in buckets:
        w = next((r["gpu_window"] for r in rows if r["batch_size"] == b), None)
        md.append(f"* b = {b}: " + _window_text(GpuWindow(**w) if w else None))
    fileio.write_text(args.out + ".md", "\n".join(md) + "\n")
    print("\n".join(md))


# The same-card A/B comparisons, run in this order: (flag, whose value is the b:k cells to time; the tag of its rows
# in the JSON; the flag's help; how it runs on those cells, given the engine, the cells, the context and the args).
COMPARISONS = (
    ("--prefetch-compare", "prefetch", "b:k,... cells to time with each L2 prefetch mode and without",
     lambda engine, pts, ctx, args: prefetch_compare(engine, pts, ctx, args.prefetch_modes.split(","),
                                                     tuple(int(v) for v in args.prefetch_programs.split(",")))),
    ("--fusion-compare", "fusion", "b:k,... cells to time with RoPE fused into attention and without",
     lambda engine, pts, ctx, args: fusion_compare(engine, pts, ctx)),
    ("--attn-compare", "attention", "b:k,... cells to time with the fixed attention config and with the chosen ones",
     lambda engine, pts, ctx, args: attention_compare(engine, pts, ctx)),
    ("--attn-prefetch-compare", "attn-prefetch", "b:k,... cells to time without L2 hints of the KV and with each of "
     "--attn-prefetch-variants",
     lambda engine, pts, ctx, args: attn_prefetch_compare(engine, pts, ctx, args.attn_prefetch_variants.split(","))),
    ("--attn-tile-compare", "attn-tile", "b:k,... cells to time with the start-up attention configs and with every "
     "launch forced to each of --attn-tile-variants",
     lambda engine, pts, ctx, args: attn_tile_compare(engine, pts, ctx, args.attn_tile_variants.split(","))),
    ("--attn-step-compare", "attn-step", "b:k,... cells to time without and with the in-step attention choice",
     lambda engine, pts, ctx, args: attn_step_compare(engine, pts, ctx)),
    ("--attn-rows-compare", "attn-rows", "b:k,... cells to time with attention programs of all G x q rows and of at "
     "most 16 rows", lambda engine, pts, ctx, args: attn_rows_compare(engine, pts, ctx)),
    ("--gemm-atomic-compare", "gemm-atomic", "b:k,... cells to time with the split-K fix-up and with the partials "
     "added atomically (gemm.atomic_split)", lambda engine, pts, ctx, args: gemm_atomic_compare(engine, pts, ctx)),
    ("--gemm-lt-compare", "gemm-lt", "b:k,... cells to time with the GEMM choices made without and with cuBLASLt's "
     "heuristic kernels", lambda engine, pts, ctx, args: gemm_lt_compare(engine, pts, ctx)),
    ("--gemm-context-compare", "gemm-context", "b:k,... cells to time with the GEMM choices made from timings alone "
     "and in context (set TABLETUNE_GEMM_TIMING=both)",
     lambda engine, pts, ctx, args: gemm_context_compare(engine, pts, ctx)),
    ("--gemm-triton-compare", "gemm-triton", "b:k,... cells to time with the GEMM chooser's picks and with the "
     "fastest Triton config for every GEMM (gemm.triton_only)",
     lambda engine, pts, ctx, args: gemm_triton_compare(engine, pts, ctx)),
    ("--gemm-wgmma-compare", "gemm-wgmma", "b:k,... cells to time with the GEMM choices made without and with the "
     "Gluon wgmma kernel, each with its own in-step GEMM choice",
     lambda engine, pts, ctx, args: gemm_wgmma_compare(engine, pts, ctx)),
    ("--gemm-stream-k-compare", "gemm-stream-k", "b:k,... cells to time with the GEMM choices made without and "
     "with the stream-K wgmma configs (set TABLETUNE_GEMM_WGMMA_STREAM_K=1), each with its own in-step GEMM choice",
     lambda engine, pts, ctx, args: gemm_stream_k_compare(engine, pts, ctx)),
    ("--gemm-policy-compare", "gemm-policy", "b:k,... cells to time with the GEMM chooser's picks and with cuBLAS "
     "for every GEMM", lambda engine, pts, ctx, args: gemm_policy_compare(engine, pts, ctx)),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--k-max", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--buckets", default="", help="batch sizes to capture and time (default: 1, 2, 4, ..., max-batch)")
    ap.add_argument("--overlap-compare", default="", help="b:k,... cells to time with the two-stream forward too")
    ap.add_argument("--overlap-carveouts", default="0", help="SM carveouts for cuBLAS in the two-stream variants")
    for flag, _, text, _ in COMPARISONS:
        ap.add_argument(flag, default="", help=text)
    ap.add_argument("--prefetch-modes", default="lines,lines_evict_last,bulk")
    ap.add_argument("--prefetch-programs", default="16", help="program counts of the prefetch kernel to compare")
    ap.add_argument("--attn-prefetch-variants", default="w1,w2,a2,a4,w2a2,w2a4",
                    help="wN: N tiles hinted before the PDL wait; aN: the tile N ahead in the loop")
    ap.add_argument("--attn-tile-variants", default="64/4/3,64/4/4,128/8/3,64/8/3",
                    help="BLOCK_N/WARPS/STAGES[/SPLITS] (no SPLITS: kernels.wave_splits)")
    ap.add_argument("--no-attn-step-choice", action="store_true",
                    help="capture every step with the start-up attention configs (EngineConfig.attn_step_choice off)")
    ap.add_argument("--gemm-step-choice", action="store_true",
                    help="the default since engine 0.7.dev8 (accepted so that the commands of older results run)")
    ap.add_argument("--no-gemm-step-choice", action="store_true",
                    help="capture every step with the GEMM chooser's picks only (EngineConfig.gemm_step_choice off: "
                         "no second capture with gemm.triton_only)")
    ap.add_argument("--attn-prefetch", default="",
                    help="the grid (and every capture) with these KV hints, e.g. w2a4 (default: the engine's)")
    ap.add_argument("--no-grid", action="store_true", help="only the comparisons (capture b, k, time nothing else)")
    ap.add_argument("--fuse-norm-max-rows", type=int, default=0,
                    help="steps of at most this many rows run the fused-norm layers (EngineConfig.fuse_norm_max_rows)")
    ap.add_argument("--out", default="benchmarks/results/engine_roofline_h200")
    args = ap.parse_args(argv)
    if args.gemm_context_compare and gemm.TIMING != "both":
        ap.error(f"--gemm-context-compare needs TABLETUNE_GEMM_TIMING=both (it is {gemm.TIMING!r})")
    if args.attn_prefetch:
        for attr, value in parse_prefetch_variant(args.attn_prefetch).items():
            setattr(kernels, attr.split(".", 1)[1], value)
    ceil = measure_ceilings()
    print(f"ceilings: copy {ceil.bandwidth_gb_s:.0f} GB/s, bf16 matmul {ceil.matrix_tflop_s:.0f} TFLOP/s", flush=True)
    buckets = tuple(int(v) for v in args.buckets.split(",")) if args.buckets else \
        tuple(power_of_two_buckets(args.max_batch))
    args.max_batch = max(buckets)
    t0 = time.perf_counter()
    engine = build_engine(args.model, "replay", args.k_max, args.max_batch, args.context, buckets=buckets,
                          fuse_norm_max_rows=args.fuse_norm_max_rows, attn_step_choice=not args.no_attn_step_choice,
                          gemm_step_choice=not args.no_gemm_step_choice)
    print(f"built + captured {len(engine.graphs)} graphs in {time.perf_counter() - t0:.1f} s", flush=True)
    step_choices = [{"batch_size": b, "k": k, "kept": _tile_text(engine.attn_step_force.get((b, k))),
                     "ms": {_tile_text(c): round(ms, 4) for c, ms in medians.items()}}
                    for (b, k), medians in sorted(engine.attn_step_ms.items())]
    for row in step_choices:
        print(f"in-step attention b={row['batch_size']} k={row['k']}: kept {row['kept']}; "
              + ", ".join(f"{c} {ms:.3f} ms" for c, ms in row["ms"].items()), flush=True)
    gemm_steps = [{"batch_size": b, "k": k, "kept": "triton-only" if engine.gemm_step_triton[(b, k)] else "chooser",
                   "ms": {"chooser": round(m[False], 4), "triton-only": round(m[True], 4)}}
                  for (b, k), m in sorted(engine.gemm_step_ms.items())]
    for row in gemm_steps:
        print(f"in-step GEMMs b={row['batch_size']} k={row['k']}: kept {row['kept']}; "
              + ", ".join(f"{c} {ms:.3f} ms" for c, ms in row["ms"].items()), flush=True)
    cfg = engine.target.cfg
    timed = []
    variant_rows = []  # the same-card A/B comparisons, each row tagged with its comparison
    ctx = args.context
    for flag, tag, _, run in COMPARISONS:
        cells = getattr(args, flag[2:].replace("-", "_"))
        if cells:
            _, compared = run(engine, parse_cells(cells), ctx, args)
            variant_rows += [dict(r, compare=tag) for r in compared]
    lt_lines, lt_rows = lt_summary()
    print("\n".join(lt_lines + context_summary()), flush=True)
    windows = {}  # b -> the GPU's clock / power while its row ran (None without nvidia-smi)
    with GpuMonitor() as monitor:
        for b in () if args.no_grid else buckets:
            t0 = time.time()
            engine.set_context(b, args.context)
            for k in range(args.k_max + 1):
                samples = time_steps(engine, b, k, args.steps, args.context)
                gpu_ms = statistics.median(time_replays_gpu(engine, b, k, args.steps, args.context))
                timed.append((b, k, samples, gpu_ms))
            time.sleep(0.6)  # one more nvidia-smi sample inside the row's window
            windows[b] = monitor.window(t0, time.time())
            print(f"b={b:4d} " + " ".join(
                f"k{k}:{statistics.median(smp):7.2f}ms/"
                f"{statistics.median(smp) / step_floor_ms(cfg, b, k, args.context, ceil):.2f}x"
                for _, k, smp, _ in timed[-args.k_max - 1:]) + f"  {_window_text(windows[b])}", flush=True)
    # The ceilings again after the grid; the floor uses the higher of the two readings (the lower floor).
    after = measure_ceilings()
    print(f"ceilings after the grid: copy {after.bandwidth_gb_s:.0f} GB/s, bf16 matmul {after.matrix_tflop_s:.0f} "
          "TFLOP/s", flush=True)
    readings = [ceil, after]
    ceil = Ceilings(max(c.bandwidth_gb_s for c in readings), max(c.matrix_tflop_s for c in readings))
    rows = []
    for b, k, samples, gpu_ms in timed:
        ms = statistics.median(samples)
        floor = step_floor_ms(cfg, b, k, args.context, ceil)
        serial = serial_floor_ms(cfg, b, k, args.context, ceil)
        rows.append({"batch_size": b, "k": k, "step_ms": round(ms, 4), "gpu_ms": round(gpu_ms, 4),
                     "gpu_window": dataclasses.asdict(windows[b]) if windows.get(b) else None,
                     "floor_ms": round(floor, 4), "ratio": round(ms / floor, 3),
                     "serial_floor_ms": round(serial, 4), "serial_ratio": round(ms / serial, 3),
                     "gpu_ratio": round(gpu_ms / floor, 3), "samples_ms": [round(s, 4) for s in samples]})
    picks = sorted(((m, n, kk, g, _choice_label(c)) for (m, n, kk, g), c in gemm._choice.items()),
                   key=lambda p: (p[0], p[1], p[2], str(p[3])))  # g: gated (bool) or gemm.SILU
    print("gemm choices:", "; ".join(f"M={m} N={n} K={kk}{' ' + g if isinstance(g, str) else ' gated' if g else ''}: {c}"
                                     for m, n, kk, g, c in picks
                                     if m in (1, 8, 16, 64, 192, 224, 256, 384, 768)))

    print("attention choices:", "; ".join(f"{kind} b={b} q={q}: {tuple(c)}" for (kind, b, q, *_), c
                                          in sorted(kernels._attn_choice.items(), key=lambda kv: kv[0][:3])))
    overlap_rows = []
    if args.overlap_compare:
        points = parse_cells(args.overlap_compare)
        carveouts = tuple(int(v) for v in args.overlap_carveouts.split(","))
        _, overlap_rows = overlap_compare(engine, points, args.context, carveouts)
    if args.diagnose:  # after the grid: a CUPTI session leaves ~0.7 us per kernel behind (engine 0.4 notes)
        for line in pdl_compare(engine, [(b, k) for b, k in ((1, 0), (1, 7), (8, 3), (16, 5), (32, 7), (128, 2))
                                         if b <= args.max_batch], args.context):
            print(line, flush=True)
        for b, k in ((1, 0), (8, 3), (32, 7), (128, 2), (256, 0)):
            if b <= args.max_batch:
                for line in kernel_breakdown(engine, b, k, args.context):
                    print(line, flush=True)
        for line in diagnose(args.model):
            print(line, flush=True)
    if rows:
        write_results(args, ceil, rows, device_name(engine), buckets, overlap_rows, readings, variant_rows,
                      step_choices, lt_rows, gemm_steps)
    else:
        fileio.write_json(args.out + ".json", {"device": device_name(engine), "command": command_line(),
                                               "variant_rows": variant_rows, "overlap_rows": overlap_rows,
                                               "gemm_lt_choices": lt_rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
