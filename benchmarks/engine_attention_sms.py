"""How much KV bandwidth decode attention draws from S SMs (GPU diagnostic, about a minute).

At the large-batch, mid-k cells the GEMMs are compute-bound and attention is KV-bound; a split of the SMs
(attention on S of them, GEMMs on the rest) can only pay if S SMs pull most of the copy rate
(docs/engine_notes.md, v0.6: at (256, 2), S = 32 needs >= 3 TB/s). This times a persistent version of the
engine's attention (``kernels._attn_tiles`` / ``_attn_store``, one split): exactly S programs, each looping
over (sequence, KV head) items, for S = 16 .. 264 and a few tile / pipeline depths, 8B shape, context 1024,
b = 256, q = 1 and 3; GB/s of KV read. It checks each against ``ops.attention`` first.

    python benchmarks/engine_attention_sms.py --out $OUT/attention_sms
    python benchmarks/engine_attention_sms.py --pointer-tiles 128/8/4 --tma-tiles 64/4/4,128/8/4,128/8/6 \
        --programs 16,32,66,132 --out $OUT/attention_sms_tma

``--tma-tiles``: the same loop with K and V fetched by Hopper's tensor-memory accelerator instead of per-thread
loads, to see whether bulk copies let a few SMs pull more of the bandwidth (the SM-partition route closed for the
pointer kernel at ~39 GB/s a program, docs/engine_notes.md, 0.7.dev1).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from tabletune.engine import gemm, kernels, ops
from tabletune.engine.presets import resolve
from tabletune.engine.profiling import write_diagnostic


@triton.jit
def _attn_persistent_kernel(q_ptr, k_cache_ptr, v_cache_ptr, start_ptr, slots_ptr, out_ptr, QLEN, ITEMS, scale,
                            stride_slot, stride_head, H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The engine's split-KV attention with one split, run by a fixed number of programs over all
    (sequence, KV head) items: program p takes items p, p + P, p + 2P, ..."""
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G * QLEN
    tok = rows // G
    d = tl.arange(0, D)
    for item in range(tl.program_id(0), ITEMS, tl.num_programs(0)):
        b = item // HKV
        kvh = item % HKV
        start = tl.load(start_ptr + b)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        q_off = ((b * QLEN + tok).to(tl.int64) * H + kvh * G + rows % G) * D
        q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        kbase = k_cache_ptr + slot * stride_slot + kvh * stride_head
        vbase = v_cache_ptr + slot * stride_slot + kvh * stride_head
        m_i, l_i, acc = kernels._attn_tiles(q, kbase, vbase, 0, start + QLEN, start + tok, scale, D, BLOCK_M,
                                            BLOCK_N)
        kernels._attn_store(out_ptr, out_ptr, out_ptr, out_ptr, out_ptr, m_i, l_i, acc, b, 0, tok,
                            kvh * G + rows % G, row_ok, QLEN, H, D, 1, BLOCK_M)


@triton.jit
def _attn_tma_persistent_kernel(q_ptr, k_desc, v_desc, start_ptr, slots_ptr, out_ptr, QLEN, ITEMS, scale, LEN,
                                H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``_attn_persistent_kernel`` with the K and V tiles fetched by the tensor-memory accelerator (host descriptors
    over the caches viewed as [slots x Hkv x LEN, D] rows): bulk copies, no per-thread loads, so that the bytes a
    program keeps in flight are set by the pipeline depth alone. Keys past the sequence are fetched (whole tiles)
    and masked out of the scores; the caches here hold finite values everywhere."""
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G * QLEN
    tok = rows // G
    d = tl.arange(0, D)
    qk_scale = scale * 1.4426950408889634
    for item in range(tl.program_id(0), ITEMS, tl.num_programs(0)):
        b = item // HKV
        kvh = item % HKV
        start = tl.load(start_ptr + b).to(tl.int32)  # descriptor coordinates are 32-bit
        slot = tl.load(slots_ptr + b).to(tl.int32)
        q_off = ((b * QLEN + tok).to(tl.int64) * H + kvh * G + rows % G) * D
        q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        base = (slot * HKV + kvh) * LEN
        kv_len = start + QLEN
        limit = start + tok
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n0 in range(0, kv_len, BLOCK_N):
            k = k_desc.load([base + n0, 0])
            v = v_desc.load([base + n0, 0])
            cols = n0 + tl.arange(0, BLOCK_N)
            m_i, l_i, acc = kernels._online_softmax_step(
                q, k, v, (cols[None, :] <= limit[:, None]) & (cols[None, :] < kv_len), qk_scale, m_i, l_i, acc)
        kernels._attn_store(out_ptr, out_ptr, out_ptr, out_ptr, out_ptr, m_i, l_i, acc, b, 0, tok,
                            kvh * G + rows % G, row_ok, QLEN, H, D, 1, BLOCK_M)


def attention_tma_persistent(q, k_cache, v_cache, start_pos, slots, scale, programs: int, block_n: int = 64,
                             warps: int = 4, stages: int = 3) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, qlen, h, d = q.shape
    hkv, length = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    out = torch.empty_like(q)
    k_desc = TensorDescriptor.from_tensor(k_cache.view(-1, d), [block_n, d])
    v_desc = TensorDescriptor.from_tensor(v_cache.view(-1, d), [block_n, d])
    _attn_tma_persistent_kernel[(programs,)](q, k_desc, v_desc, start_pos, slots, out, qlen, b * hkv, scale, length,
                                             H=h, HKV=hkv, G=g, D=d,
                                             BLOCK_M=max(16, triton.next_power_of_2(g * qlen)), BLOCK_N=block_n,
                                             num_warps=warps, num_stages=stages)
    return out


def attention_persistent(q, k_cache, v_cache, start_pos, slots, scale, programs: int, block_n: int = 64,
                         warps: int = 4, stages: int = 3) -> torch.Tensor:
    b, qlen, h, d = q.shape
    hkv = k_cache.shape[1]
    g = h // hkv
    out = torch.empty_like(q)
    _attn_persistent_kernel[(programs,)](q, k_cache, v_cache, start_pos, slots, out, qlen, b * hkv, scale,
                                         k_cache.stride(0), k_cache.stride(1), H=h, HKV=hkv, G=g, D=d,
                                         BLOCK_M=max(16, triton.next_power_of_2(g * qlen)), BLOCK_N=block_n,
                                         num_warps=warps, num_stages=stages)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--programs", default="16,32,48,66,132,264", help="S values, comma-separated")
    ap.add_argument("--pointer-tiles", default="64/4/3,64/4/5,128/8/4,64/8/6",
                    help="BLOCK_N/WARPS/STAGES of the pointer-load kernel (empty: none)")
    ap.add_argument("--tma-tiles", default="", help="the same for the TMA kernel (Hopper; empty: none)")
    ap.add_argument("--out", default="attention_sms")
    args = ap.parse_args(argv)
    args.programs = [int(p) for p in args.programs.split(",")]
    args.pointer_tiles, args.tma_tiles = (
        [tuple(int(v) for v in t.split("/")) for t in text.split(",") if t] for text in (args.pointer_tiles,
                                                                                        args.tma_tiles))
    cfg = resolve(args.model)
    h, hkv, d, b, ctx = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, args.batch, args.context
    dt = torch.bfloat16
    kc = torch.randn(b + 1, hkv, ctx + 8, d, dtype=dt, device="cuda")
    vc = torch.randn_like(kc)
    slots = torch.arange(b, device="cuda")
    rows, lines = [], []
    for qlen in (1, 3):
        start = torch.full((b,), ctx - qlen, device="cuda")
        q = torch.randn(b, qlen, h, d, dtype=dt, device="cuda")
        kv_bytes = 2 * b * hkv * ctx * d * 2
        ref = ops.attention(q, kc, vc, start, slots, d ** -0.5)
        engine_us = gemm._time_us(lambda: kernels.attention(q, kc, vc, start, slots, d ** -0.5))
        lines.append(f"b={b} q={qlen}: engine attention {engine_us:.1f} us ({kv_bytes / engine_us / 1e3:.0f} GB/s)")
        print(lines[-1], flush=True)
        variants = [("pointer", attention_persistent, t) for t in args.pointer_tiles] + \
            [("tma", attention_tma_persistent, t) for t in args.tma_tiles]
        for loads, run, (block_n, warps, stages) in variants:
            for programs in args.programs:
                try:
                    got = run(q, kc, vc, start, slots, d ** -0.5, programs, block_n, warps, stages)
                    err = float((got.float() - ref.float()).norm() / ref.float().norm())
                    us = gemm._time_us(lambda: run(q, kc, vc, start, slots, d ** -0.5, programs, block_n, warps,
                                                   stages))
                except Exception as exc:  # a tile that does not fit: report and go on
                    print(f"q={qlen} {loads} block_n={block_n} warps={warps} stages={stages} S={programs}: "
                          f"{type(exc).__name__}: {str(exc)[:200]}")
                    continue
                row = {"q": qlen, "loads": loads, "programs": programs, "block_n": block_n, "warps": warps,
                       "stages": stages, "us": round(us, 2), "gb_s": round(kv_bytes / us / 1e3, 1), "rel_err": err}
                rows.append(row)
                lines.append(f"b={b} q={qlen} {loads:7s} S={programs:3d} block_n={block_n} warps={warps} "
                             f"stages={stages}: {us:8.1f} us {row['gb_s']:6.0f} GB/s ({row['gb_s'] / programs:5.1f} "
                             f"GB/s an SM-program) rel err {err:.1e}")
                print(lines[-1], flush=True)
    write_diagnostic(args.out, lines, batch=b, context=ctx, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
