"""Attention launch configs against the engine's default, per (b, q) (GPU diagnostic, about two minutes).

In the decode steps of engine 0.7.dev2 attention reads the KV at 2.7-3.1 TB/s for b = 8-32 (H200, 8B shape,
context 1024: 12.6 us a layer at b = 8, 22 us at b = 16, 42 us at b = 32 with k = 6) against a 4.26 TB/s
copy, while at b = 128-256 it reaches 4.2-4.4 TB/s. The split count alone was measured before (engine 0.3:
``engine_roofline.py --diagnose``) and does not close that gap. This times every ``kernels.AttnConfig`` of a
small grid (splits x keys a tile x warps x stages) for the launch a step makes at each (b, q): ``attention`` for
q = 1 (k = 0: RoPE and the cache write run before it), ``rope_attention`` for q >= 2. The KV caches of a layer
are rotated through copies of at least 192 MB (the step reads a layer's KV from HBM, not from L2), each config is
timed as 10 launches in a CUDA graph (``gemm._time_us``), and each output is checked against the PyTorch ops
first (a config off by more than 2e-2 is reported, not timed).

    python benchmarks/engine_attention_configs.py --out $OUT/attention_configs
    TRITON_INTERPRET=1 python benchmarks/engine_attention_configs.py --device cpu --batches 2 --qs 1,3 \\
        --context 64 --out attn_dry   # dry run (the interpreter: correctness only, times meaningless)
"""

from __future__ import annotations

import argparse
import time

import torch

from tabletune.engine import gemm, kernels
from tabletune.engine import ops as torch_ops
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import write_diagnostic

TILES = ((32, 4, 3), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3))  # (keys, warps, stages)
SPLITS = (1, 2, 4, 8, 16)
ROTATE_BYTES = 192 << 20


def split_candidates(b: int, hkv: int, num_sms: int = 132) -> list[int]:
    """1, the default, and the SPLITS whose program count b * hkv * splits lies in [SMs / 2, 8 SMs]."""
    default = kernels.num_splits_for(b, hkv, num_sms)
    return sorted({1, default} | {s for s in SPLITS if num_sms // 2 <= b * hkv * s <= 8 * num_sms})


def _time(fn, device: str) -> float:
    if device == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return gemm._time_us(fn)


def sweep_cell(cfg, b: int, q: int, context: int, device: str, tiles=TILES) -> dict:
    """Every config's time (us) and relative error at (b, q), the default's first."""
    h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    length = context + q + 16
    kv_bytes = 2 * (b + 1) * hkv * length * d * 2
    copies = max(1, min(8, -(-ROTATE_BYTES // kv_bytes))) if device == "cuda" else 1
    g = torch.Generator(device="cpu").manual_seed(b * 131 + q)
    caches = [(torch.randn(b + 1, hkv, length, d, generator=g).to(device, dtype),
               torch.randn(b + 1, hkv, length, d, generator=g).to(device, dtype)) for _ in range(copies)]
    start = torch.full((b,), context, dtype=torch.long, device=device)
    slots = torch.arange(1, b + 1, device=device)  # slot 0 unused: a program must not assume slot == row
    scale = d ** -0.5
    eps, theta = cfg.rms_norm_eps, cfg.rope_theta
    qn = torch.rand(d, generator=g).add_(0.5).to(device, dtype)
    kn = torch.rand(d, generator=g).add_(0.5).to(device, dtype)
    if q == 1:
        x = torch.randn(b, 1, h, d, generator=g).to(device, dtype)

        def run(c, kc, vc):
            return kernels.attention(x, kc, vc, start, slots, scale, cfg=c)

        def ref(kc, vc):
            return torch_ops.attention(x, kc, vc, start, slots, scale)
    else:
        x = torch.randn(b, q, (h + 2 * hkv) * d, generator=g).to(device, dtype)
        rope = (qn, kn, h, hkv, d, theta, eps, scale)

        def run(c, kc, vc):
            return kernels.rope_attention(x, start, slots, kc, vc, *rope[:2], *rope[2:], cfg=c)

        def ref(kc, vc):
            return torch_ops.rope_attention(x, start, slots, kc, vc, *rope)
    expected = ref(*caches[0]).float()
    default = kernels.default_attn_config(b, hkv)
    configs = [default] + [kernels.AttnConfig(s, bn, w, st) for s in split_candidates(b, hkv)
                           for bn, w, st in tiles if kernels.AttnConfig(s, bn, w, st) != default]
    i = [0]

    def rotate():
        i[0] = (i[0] + 1) % copies
        return caches[i[0]]
    rows = []
    for c in configs:
        try:
            err = float((run(c, *caches[0]).float() - expected).norm() / expected.norm())
        except Exception as exc:  # does not compile or launch here (shared memory)
            rows.append({"config": list(c), "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
            continue
        us = _time(lambda: run(c, *rotate()), device) if err < 2e-2 else float("nan")
        rows.append({"config": list(c), "us": round(us, 2), "rel_err": float(f"{err:.2e}")})
    kv_read = b * (context + q) * hkv * d * 2 * (2 if device == "cuda" else 4)
    timed = [r for r in rows if r.get("us") == r.get("us") and "us" in r]
    best = min(timed, key=lambda r: r["us"])
    return {"batch_size": b, "q": q, "kv_mb": round(kv_read / 1e6, 1), "default": rows[0], "best": best,
            "default_gb_s": round(kv_read / rows[0]["us"] / 1e3, 0) if "us" in rows[0] else None,
            "best_gb_s": round(kv_read / best["us"] / 1e3, 0), "configs": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--qs", default="1,4,8", help="query tokens a sequence (k + 1)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="attention_configs")
    args = ap.parse_args(argv)
    cfg = resolve(args.model)
    cells, lines = [], []
    for b in (int(v) for v in args.batches.split(",")):
        for q in (int(v) for v in args.qs.split(",")):
            cell = sweep_cell(cfg, b, q, args.context, args.device)
            cells.append(cell)
            dflt, best = cell["default"], cell["best"]
            line = (f"b={b:3d} q={q}: KV {cell['kv_mb']:7.1f} MB  default {dflt['config']} {dflt.get('us')} us "
                    f"({cell['default_gb_s']} GB/s)  best {best['config']} {best['us']} us ({cell['best_gb_s']} GB/s)"
                    f"  {100 * (best['us'] / dflt['us'] - 1):+.1f}%")
            bad = [r for r in cell["configs"] if "error" in r or not r.get("rel_err", 0) < 2e-2]
            if bad:
                line += f"  ({len(bad)} configs failed or wrong: {bad[0]})"
            print(line, flush=True)
            lines.append(line)
    write_diagnostic(args.out, lines, model=args.model, context_len=args.context, cells=cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
