"""Can decode attention run *beside* a compute-bound GEMM on the same SMs? (GPU diagnostic, about a minute.)

At the large-batch, mid-k cells the step is ~1.5x the floor because attention (KV-bound) and the GEMMs
(matmul-bound) run one after the other. An SM partition cannot fix that: one attention program per SM draws at
most ~39 GB/s (``engine_attention_sms.py``), so 32 SMs read ~1.25 TB/s, not the ~3 TB/s the partition needs. The
other way is co-residency: each SM hosting a GEMM program and an attention program at once, the GEMM keeping the
tensor cores busy while the attention program keeps loads in flight. This times, in one CUDA graph each:
the GEMM alone (``--gemm-reps`` back to back on one stream), the attention alone, and both forked onto two streams,
for cuBLAS and Triton GEMM tiles of different shared-memory / register footprints and for the engine's attention
and a persistent one (132 programs). Overlap = (gemm + attention - both) / min(gemm, attention): 0 when the two
only alternate, 1 when the shorter one hides entirely. 8B shape, b = 256, q = 3 (k = 2), context 1024; the GEMM is
the MLP's gate_up at M = 768.

    python benchmarks/engine_corun.py --out $OUT/corun
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_attention_sms import attention_persistent  # noqa: E402

from tabletune.engine import gemm, kernels  # noqa: E402
from tabletune.engine.presets import resolve  # noqa: E402
from tabletune.engine.profiling import write_diagnostic  # noqa: E402

GEMMS = {"cublas": None, "triton 128x128x64 w8 s3": (128, 128, 64, 1, 8, 3),
         "triton 128x128x64 w4 s3": (128, 128, 64, 1, 4, 3), "triton 128x256x64 w8 s3": (128, 256, 64, 1, 8, 3),
         "triton 64x128x64 w4 s4": (64, 128, 64, 1, 4, 4), "triton-tma 128x256x64 w8 s4": (128, 256, 64, 1, 8, 4, True)}


def graph_ms(lanes: list[list], reps: int = 10) -> float:
    """GPU ms of one replay of a graph whose lane i (a list of callables) runs on its own stream, forked from and
    joined to the capture stream; median of ``reps``."""
    streams = [torch.cuda.Stream() for _ in lanes]
    for lane in lanes:  # compile and warm outside the capture
        for fn in lane:
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    main = torch.cuda.Stream()
    with torch.cuda.graph(g, stream=main):
        for s, lane in zip(streams, lanes):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                for fn in lane:
                    fn()
        for s in streams:
            main.wait_stream(s)
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--q", type=int, default=3)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--gemm-reps", type=int, default=8)
    ap.add_argument("--out", default="corun")
    args = ap.parse_args(argv)
    cfg = resolve(args.model)
    h, hkv, d, b, ctx, qlen = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, args.batch, args.context, args.q
    dt = torch.bfloat16
    m = b * qlen
    x = torch.randn(m, cfg.hidden_size, dtype=dt, device="cuda")
    w = torch.randn(2 * cfg.intermediate_size, cfg.hidden_size, dtype=dt, device="cuda") * 0.02
    ref = (x @ w.t()).float()
    kc = torch.randn(b + 1, hkv, ctx + 8, d, dtype=dt, device="cuda")
    vc = torch.randn_like(kc)
    slots = torch.arange(b, device="cuda")
    start = torch.full((b,), ctx - qlen, device="cuda")
    q = torch.randn(b, qlen, h, d, dtype=dt, device="cuda")
    attns = {"engine attention": lambda: kernels.attention(q, kc, vc, start, slots, d ** -0.5),
             "persistent 132 programs": lambda: attention_persistent(q, kc, vc, start, slots, d ** -0.5, 132, 128, 8, 4)}
    rows, lines = [], []
    alone_attn = {}
    for aname, afn in attns.items():
        alone_attn[aname] = graph_ms([[afn] * args.gemm_reps])
    for gname, gcfg in GEMMS.items():
        gfn = (lambda: torch.mm(x, w.t())) if gcfg is None else (lambda c=gcfg: gemm.triton_linear(x, w, c))
        try:
            err = float((gfn().float() - ref).norm() / ref.norm())
            g_ms = graph_ms([[gfn] * args.gemm_reps])
        except Exception as exc:  # a tile that does not fit: report and go on
            lines.append(f"{gname}: {type(exc).__name__}: {str(exc)[:200]}")
            print(lines[-1], flush=True)
            continue
        tflops = 2 * m * w.shape[0] * w.shape[1] * args.gemm_reps / g_ms / 1e9
        for aname, afn in attns.items():
            a_ms = alone_attn[aname]
            both = graph_ms([[gfn] * args.gemm_reps, [afn] * args.gemm_reps])
            overlap = (g_ms + a_ms - both) / min(g_ms, a_ms)
            row = {"gemm": gname, "attention": aname, "gemm_ms": round(g_ms, 4), "attention_ms": round(a_ms, 4),
                   "both_ms": round(both, 4), "overlap": round(overlap, 3), "gemm_tflop_s": round(tflops, 1),
                   "gemm_rel_err": err}
            rows.append(row)
            lines.append(f"{gname:30s} ({tflops:5.0f} TF/s) + {aname:24s}: gemm {g_ms:6.3f} ms, attention {a_ms:6.3f} "
                         f"ms, both {both:6.3f} ms (serial {g_ms + a_ms:6.3f}); overlap {overlap:+.2f}")
            print(lines[-1], flush=True)
    write_diagnostic(args.out, lines, batch=b, q=qlen, context=ctx, m=m, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
