"""GPU correctness checks of the built-in engine (run on the GPU before timing).

1. Triton kernels vs the PyTorch ops on the 8B shape, bf16, relative error; the split-K, TMA and stream-K GEMMs
   (plain and gated) vs torch, bit-identical on repeat, tickets back at zero (part ``kernels``); the fused-norm
   layers' GEMMs, pointer and wgmma, the same way (part ``fused``).
2. Greedy outputs with speculation (every drafter, a random table, CUDA graphs)
   identical to the non-speculative outputs, on a small random model in float32.
3. MoE grouped-GEMM path vs the per-expert loop.
4. cuBLASLt's heuristic kernels (``cublaslt``) on the 8B layer shapes vs torch, bit-identical on repeat and in a
   CUDA graph replay.
"""

from __future__ import annotations

import random
import time
import traceback

import torch

from tabletune.engine import cublaslt, gemm, gemm_wgmma, kernels, ops
from tabletune.engine.drafters import make_drafter
from tabletune.engine.model import FUSED_NORM_MAX_M, Decoder, moe_mlp
from tabletune.engine.presets import PRESETS
from tabletune.engine.runner import EngineConfig, SpecEngine
from tabletune.engine.scheduler import Request, Scheduler
from tabletune.table import DraftTable


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _check_gemm(kind: str, x, w, cfg, extra: str = "") -> None:
    """One Triton GEMM config against torch, and bit-identical on a repeat."""
    a = gemm.triton_linear(x, w, cfg)
    print(f"gemm {kind}M={x.shape[0]} cfg={cfg}: {rel(a, x @ w.t()):.2e} {extra}"
          f"repeat-identical {bool((gemm.triton_linear(x, w, cfg) == a).all())}")


def check_kernels() -> None:
    cfg = PRESETS["qwen3-8b"]
    h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    b, q, ctx = 5, 4, 300
    dt = torch.bfloat16
    qkv = torch.randn(b, q, (h + 2 * hkv) * d, dtype=dt, device="cuda")
    start = torch.tensor([ctx, 17, 0, 250, 100], device="cuda")
    slots = torch.tensor([3, 0, 5, 1, 2], device="cuda")
    kc = torch.randn(7, hkv, 512, d, dtype=dt, device="cuda")
    vc = torch.randn_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    qn, kn = torch.rand(d, device="cuda", dtype=dt) + 0.5, torch.rand(d, device="cuda", dtype=dt) + 0.5
    qa = ops.qk_rope_cache_write(qkv, start, slots, kc, vc, qn, kn, h, hkv, d, 1e6, 1e-6)
    qb = kernels.qk_rope_cache_write(qkv, start, slots, kc2, vc2, qn, kn, h, hkv, d, 1e6, 1e-6)
    print(f"rope q {rel(qb, qa):.2e} k-cache {rel(kc2, kc):.2e} v-cache {rel(vc2, vc):.2e}")
    for splits in (None, 1, 4, 16):
        oa = ops.attention(qa, kc, vc, start, slots, d ** -0.5)
        ob = kernels.attention(qa, kc, vc, start, slots, d ** -0.5, num_splits=splits)
        print(f"attention splits={splits}: {rel(ob, oa):.2e}")
    for splits in (None, 1, 4, 16):  # RoPE + cache write inside attention, from the same cache as above
        kf, vf, ku, vu = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        start_f = start + q  # new positions after the ones written above
        of = kernels.rope_attention(qkv, start_f, slots, kf, vf, qn, kn, h, hkv, d, 1e6, 1e-6, d ** -0.5,
                                    num_splits=splits)
        ou = ops.rope_attention(qkv, start_f, slots, ku, vu, qn, kn, h, hkv, d, 1e6, 1e-6, d ** -0.5)
        print(f"rope+attention fused splits={splits}: out {rel(of, ou):.2e} k-cache {rel(kf, ku):.2e} "
              f"v-cache {rel(vf, vu):.2e}")
    start_f = start + q
    ku, vu = kc.clone(), vc.clone()  # the reference: PyTorch ops, new positions after the ones written above
    ou = ops.rope_attention(qkv, start_f, slots, ku, vu, qn, kn, h, hkv, d, 1e6, 1e-6, d ** -0.5)
    oa_ref = ops.attention(qa, kc, vc, start, slots, d ** -0.5)

    def config_errors(c: kernels.AttnConfig) -> str:
        """Attention (twice: the same bits?) and RoPE + attention at one launch config, against the reference."""
        kf, vf = kc.clone(), vc.clone()
        of = kernels.rope_attention(qkv, start_f, slots, kf, vf, qn, kn, h, hkv, d, 1e6, 1e-6, d ** -0.5, cfg=c)
        oa = kernels.attention(qa, kc, vc, start, slots, d ** -0.5, cfg=c)
        ob = kernels.attention(qa, kc, vc, start, slots, d ** -0.5, cfg=c)
        return (f"{tuple(c)}: {rel(oa, oa_ref):.2e} repeat-identical {bool((oa == ob).all())}; "
                f"rope+attention out {rel(of, ou):.2e} k-cache {rel(kf, ku):.2e}")
    for c in kernels.attn_candidates(b, hkv, torch.cuda.get_device_properties(0).multi_processor_count) + [
            kernels.AttnConfig(16, 128, 8, 3), kernels.AttnConfig(3, 64, 4, 4)]:  # the chooser's, and odd splits
        print(f"attention {config_errors(c)}")
    for wait, ahead in ((1, 0), (2, 0), (0, 1), (0, 4), (2, 2), (8, 8)):  # L2 hints of the KV: results unchanged
        kernels.attn_prefetch_wait, kernels.attn_prefetch_ahead = wait, ahead
        try:
            for c in (kernels.AttnConfig(1), kernels.AttnConfig(4, 64, 4, 4), kernels.AttnConfig(16, 128, 8, 3)):
                print(f"attention KV hints w{wait}a{ahead} {config_errors(c)}")
        finally:
            kernels.attn_prefetch_wait = kernels.attn_prefetch_ahead = 0
    q6 = 6  # programs of at most 16 query rows (kernels.attn_max_rows): the 24 rows of a KV head in two programs
    qkv6 = torch.randn(b, q6, (h + 2 * hkv) * d, dtype=dt, device="cuda")
    x6 = torch.randn(b, q6, h, d, dtype=dt, device="cuda")
    ref6 = ops.attention(x6, kc, vc, start, slots, d ** -0.5)
    for halve in (False, True):
        kernels.attn_max_rows, kernels.attn_rows_halve_splits = 16, halve
        try:
            for splits in (None, 1, 4):
                kf, vf, ku, vu = kc.clone(), vc.clone(), kc.clone(), vc.clone()
                of = kernels.rope_attention(qkv6, start, slots, kf, vf, qn, kn, h, hkv, d, 1e6, 1e-6, d ** -0.5,
                                            num_splits=splits)
                ou = ops.rope_attention(qkv6, start, slots, ku, vu, qn, kn, h, hkv, d, 1e6, 1e-6, d ** -0.5)
                oa = kernels.attention(x6, kc, vc, start, slots, d ** -0.5, num_splits=splits)
                ob = kernels.attention(x6, kc, vc, start, slots, d ** -0.5, num_splits=splits)
                print(f"attention 16-row programs q={q6} fewer-splits={halve} splits={splits}: {rel(oa, ref6):.2e} "
                      f"repeat-identical {bool((oa == ob).all())}; rope+attention out {rel(of, ou):.2e} "
                      f"k-cache {rel(kf, ku):.2e}")
        finally:
            kernels.attn_max_rows, kernels.attn_rows_halve_splits = 0, False
    x = torch.randn(9, 4096, dtype=dt, device="cuda")
    w = torch.randn(4096, 4096, dtype=dt, device="cuda") * 0.02
    for m in (1, 9, 200):
        xm = torch.randn(m, 4096, dtype=dt, device="cuda")
        gm = torch.randn(m, 2 * 4096, dtype=dt, device="cuda")
        for cfg in ((16, 64, 128, 1, 4, 4), (16, 64, 256, 8, 4, 4), (64, 128, 64, 2, 4, 4), (128, 256, 64, 4, 8, 3)):
            g = gemm.triton_linear(gm, w, cfg, gated=True)
            _check_gemm("", xm, w, cfg, f"gated {rel(g, ops.silu_mul(gm) @ w.t()):.2e} ")
        for cfg in ((64, 128, 64, 1, 4, 6, True), (64, 256, 64, 2, 4, 4, True), (128, 128, 64, 3, 8, 5, True),
                    (128, 256, 64, 2, 8, 4, True)):
            try:
                _check_gemm("TMA ", xm, w, cfg)
            except Exception as exc:
                print(f"gemm TMA M={m} cfg={cfg} FAILED: {type(exc).__name__}: {str(exc)[:300]}")
        bm = max(16, 1 << (m - 1).bit_length())
        for cfg in ((bm, 32, 128, 1, 4, 6, False, 132), (bm, 64, 256, 1, 4, 4, False, 264)) if m <= 64 else ():
            _check_gemm("stream-K ", xm, w, cfg)
        print(f"gemm cuBLASLt M={m}: {rel(gemm._mm_lt(xm, w), xm @ w.t()):.2e}")
    for m in (1, 9, 16):  # split-K partials added atomically into an accumulator: the fix-up's result, to the bit
        xm, gm = torch.randn(m, 4096, dtype=dt, device="cuda"), torch.randn(m, 2 * 4096, dtype=dt, device="cuda")
        r0, wn = torch.randn(m, 4096, dtype=dt, device="cuda"), torch.rand(4096, dtype=dt, device="cuda")
        line = f"gemm atomic split-K M={m}:"
        for cfg in (gemm.Config(16, 64, 256, 2, 4, 4), gemm.Config(16, 32, 128, 2, 4, 6), gemm.Config(16, 64, 128, 1, 4, 6)):
            for gated, inp in ((False, xm), (True, gm)):
                ref = gemm.triton_linear(inp, w, cfg, gated=gated)
                acc = gemm._pointer_gemm(inp, w, cfg, kernels.accumulator(m, 4096, xm.device), gated, atomic=True)
                same = bool((acc.to(dt) == ref).all())
                ya, ra = kernels.add_rms_norm(r0, ref, wn, 1e-6)
                yb, rb = kernels.add_rms_norm(r0, acc, wn, 1e-6)
                line += (f" {tuple(cfg)[:4]}{' gated' if gated else ''} same bits {same}, norm same "
                         f"{bool((ya == yb).all() and (ra == rb).all())}, zeroed {bool((acc == 0).all())};")
        print(line)
    print(f"tickets all zero after the launches: {int(kernels.counters(x.device).abs().sum()) == 0}")
    dl = torch.randn_like(x)
    wn = torch.rand(4096, dtype=dt, device="cuda")
    ya, ra = ops.add_rms_norm(x, dl, wn, 1e-6)
    yb, rb = kernels.add_rms_norm(x, dl, wn, 1e-6)
    print(f"add_rms_norm {rel(yb, ya):.2e} {rel(rb, ra):.2e}")
    gu = torch.randn(9, 2 * 1000, dtype=dt, device="cuda")
    print(f"silu_mul {rel(kernels.silu_mul(gu), ops.silu_mul(gu)):.2e}")


def check_fused() -> None:
    """The fused-norm layers' GEMMs against torch: the residual epilogue, then the norm and norm + silu epilogues on
    the sums of squares it left, for the pointer kernel's configs (M <= 16) and the wgmma kernel's (Hopper, bf16:
    ``gemm_wgmma.fused_configs`` with one split and with three), each repeated bit for bit, tickets back at zero."""
    dt = torch.bfloat16
    w = torch.randn(4096, 4096, dtype=dt, device="cuda") * 0.02
    wn = torch.rand(4096, dtype=dt, device="cuda")
    wgu = torch.randn(2 * 2048, 4096, dtype=dt, device="cuda") * 0.02
    for m in (1, 9, 16, 40, 64):
        xm, r0 = torch.randn(m, 4096, dtype=dt, device="cuda"), torch.randn(m, 4096, dtype=dt, device="cuda")
        gm = torch.randn(m, 2 * 4096, dtype=dt, device="cuda")
        # candidates that fit the SILU variant (two W tiles a slot), with one split and with three
        wgmma_cfgs = tuple(c for c in gemm_wgmma.fused_configs(m, silu=True) if c.split in (1, 3)) \
            if gemm.wgmma_runs(w) else ()
        pointer = (gemm.Config(16, 64, 256, 2, 4, 4), gemm.Config(16, 32, 128, 1, 4, 6),
                   gemm.Config(16, 64, 128, 8, 4, 6)) if m <= gemm.FUSED_ROWS else ()
        for cfg in pointer + wgmma_cfgs:
            wg = isinstance(cfg, gemm_wgmma.WgmmaConfig)  # the wgmma kernel's epilogues (no gated variant)
            line = f"fused-norm M={m} {'wgmma' if wg else 'pointer'} cfg={tuple(cfg)[:6]}:"
            for gated, inp, prod in ((False, xm, xm @ w.t()),) + (() if wg else ((True, gm, ops.silu_mul(gm) @ w.t()),)):
                hn, r_ref = ops.add_rms_norm(r0, prod, wn, 1e-6)
                r = r0.clone()
                norm = gemm.RowNorm(gemm.residual_linear(inp, w, cfg, r, gated=gated), 1e-6)
                y = gemm.norm_linear(r, gemm.fold_norm(w, wn), cfg, norm)
                y2 = gemm.norm_linear(r, gemm.fold_norm(w, wn), cfg, norm)
                a = gemm.norm_linear(r, gemm.fold_norm(wgu, wn), cfg, norm, silu=True)
                line += (f" residual{' gated' if gated else ''} {rel(r, r_ref):.2e}, norm {rel(y, hn @ w.t()):.2e} "
                         f"norm+silu {rel(a, ops.silu_mul(hn @ wgu.t())):.2e} "
                         f"repeat-identical {bool((y == y2).all())};")
            print(line)
    print(f"tickets all zero after the fused-norm launches: {int(kernels.counters(w.device).abs().sum()) == 0}")


def check_moe() -> None:
    torch.manual_seed(0)
    cfg = PRESETS["tiny-moe"]
    m = Decoder(cfg, torch.float32, "cuda")
    layer = m.layers[0]
    x = torch.randn(3, 5, cfg.hidden_size, device="cuda")
    try:
        got = moe_mlp(kernels, x, layer.router, layer.w_gate_up, layer.w_down, cfg.num_experts_per_tok)
        ref = moe_mlp(ops, x.cpu(), layer.router.cpu(), layer.w_gate_up.cpu(), layer.w_down.cpu(),
                      cfg.num_experts_per_tok)
        print(f"moe grouped_mm fp32 vs loop: {rel(got.cpu(), ref):.2e}")
        m16 = Decoder(PRESETS["tiny-moe"], torch.bfloat16, "cuda")
        l16 = m16.layers[0]
        moe_mlp(kernels, x.bfloat16(), l16.router, l16.w_gate_up, l16.w_down, 2)
        print("moe grouped_mm bf16 ok")
    except Exception as exc:  # report and go on: the dense checks still matter
        print(f"moe grouped_mm FAILED: {type(exc).__name__}: {exc}")


DRAFTERS = ("ngram", "eagle", "draft_model", "parallel_block")  # the lossless part's drafters (``--drafters``)
FREE_ENGINES = False  # ``--free-engines``: collect each engine of the lossless part (and sync) before the next is made


def check_lossless() -> None:
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    target = Decoder(cfg, torch.float32, "cuda")
    rng = random.Random(0)
    # three prompt lengths, so that the prefill graphs (captured after a length's second prompt) replay too
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.choice((3, 11, 29)))] for _ in range(12)]

    def run(drafter, table, overlap=0, fuse_norm=0, prefill_graphs=512, gemm_step_choice=True):
        d = make_drafter(drafter, target, 5, draft_cfg=PRESETS["tiny"])
        e = SpecEngine(target, d, EngineConfig(max_num_seqs=8, max_len=96, k_max=5, overlap_min_tokens=overlap,
                                               fuse_norm_max_rows=fuse_norm, prefill_graph_max_len=prefill_graphs,
                                               gemm_step_choice=gemm_step_choice))
        reqs = [Request(list(p), 40, i) for i, p in enumerate(prompts)]
        st = Scheduler(e, table).run(reqs)
        torch.cuda.synchronize()  # an error of this run's kernels shows here, not in the next engine's capture
        outputs, num_graphs = [r.output for r in reqs], len(e.graphs)
        if FREE_ENGINES:
            import gc

            del e, d
            gc.collect()
            torch.cuda.synchronize()
        return outputs, st, num_graphs

    base, _, _ = run("ngram", DraftTable.fixed(0), prefill_graphs=0)  # no speculation, every prefill eager
    out, _, _ = run("ngram", DraftTable.fixed(0))
    print(f"lossless no speculation, graphed prefills: identical to eager prefills {out == base}")
    table = DraftTable.from_ranges([[1, 2, 5], [3, 4, 2], [5, 8, 3]])
    for dr in DRAFTERS:
        out, st, ng = run(dr, table)
        print(f"lossless {dr:15s} identical={out == base} graphs={ng} steps={st.num_steps} "
              f"accepted={st.counts.accepted}")
    out, st, ng = run("eagle", table, overlap=1)  # every step of >= 2 rows as two half-batches on two streams
    print(f"lossless eagle two-stream identical={out == base} graphs={ng} steps={st.num_steps}")
    for dr in ("ngram", "eagle"):  # the fused-norm layers on every step of <= 16 rows
        out, st, ng = run(dr, table, fuse_norm=16)
        print(f"lossless {dr} fused-norm identical={out == base} graphs={ng} steps={st.num_steps}")
    from tabletune.engine import gemm

    triton_only = gemm.triton_only
    try:
        gemm.triton_only = True  # every GEMM of every capture on its fastest Triton config
        out, st, ng = run("eagle", table)
        print(f"lossless eagle triton-only GEMMs identical={out == base} graphs={ng} steps={st.num_steps}")
    finally:
        gemm.triton_only = triton_only
    out, st, ng = run("eagle", table, gemm_step_choice=False)
    print(f"lossless eagle no in-step GEMM choice identical={out == base} graphs={ng} steps={st.num_steps}")


def _replay_outputs(engines, b: int, k: int) -> list[torch.Tensor]:
    """The emitted tokens of one graph-replayed step of each engine, every one from the same context."""
    outs = []
    for eng in engines:
        eng.set_context(b, 500, seed=b)
        buf = eng.launch(list(range(b)), k)
        torch.cuda.synchronize()
        outs.append(buf.out[:b, : k + 2].clone())
    return outs


def check_graph_replay() -> None:
    """8B-shape layers in bf16: graph replays (PDL on) give bit-identical tokens and hidden-state digests to
    each other and to an eager run of the same step (a race between PDL-launched kernels would show here)."""
    from tabletune.engine.drafters import ReplayDrafter

    torch.manual_seed(0)
    target = Decoder(PRESETS["qwen3-8b"], torch.bfloat16, "cuda", num_layers=4)

    def engine(**kw):
        """An engine of the graphs' buckets; the variants below run without the in-step GEMM choice, which each
        engine makes from its own timings (a bf16 near-tie rounds otherwise where two engines chose otherwise),
        against ``e`` of the same GEMM picks."""
        return SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=64, max_len=600, k_max=7,
                                                                buckets=(1, 8, 64), ks=(0, 3, 7), **kw))

    chosen = engine()  # the default engine: the in-step GEMM choice on
    e = engine(gemm_step_choice=False)
    print("graph in-step GEMM choice: kept triton-only at "
          f"{sorted(c for c, t in chosen.gemm_step_triton.items() if t)}")
    e2 = engine(gemm_step_choice=False, overlap_min_tokens=1, overlap_sm_carveout=24)
    for b, k in ((8, 3), (64, 7)):  # two-stream halves: replay == replay, and the same tokens as one stream
        outs = _replay_outputs((e2, e2, e), b, k)
        print(f"graph two-stream b={b} k={k}: replay==replay {bool((outs[0] == outs[1]).all())} "
              f"same tokens as one stream in {float((outs[0][:, 1] == outs[2][:, 1]).float().mean()):.0%} of rows")
    print(f"SM carveout restored after capture: {torch._C._get_sm_carveout_experimental() is None}")
    del e2
    e3 = engine(gemm_step_choice=False, prefetch_max_batch=8)
    for b, k in ((1, 0), (1, 7), (8, 3)):  # the L2 prefetch is a hint: the same tokens as without it
        outs = _replay_outputs((e3, e3, e), b, k)
        print(f"graph L2 prefetch ({e3.prefetch_mode}) b={b} k={k}: replay==replay {bool((outs[0] == outs[1]).all())} "
              f"same tokens as without {bool((outs[0] == outs[2]).all())}")
    del e3
    e5 = engine(gemm_step_choice=False, fuse_norm_max_rows=FUSED_NORM_MAX_M)
    # the fused-norm layers (bf16: a near-tie may round otherwise); 32 and 64 rows: the wgmma kernel's epilogues only
    for b, k in ((1, 0), (1, 7), (8, 0), (8, 3), (16, 3)):
        outs = _replay_outputs((e5, e5, e), b, k)
        print(f"graph fused-norm b={b} k={k}: replay==replay {bool((outs[0] == outs[1]).all())} "
              f"same tokens as the standard layers in {float((outs[0][:, 1] == outs[2][:, 1]).float().mean()):.0%} "
              "of rows")
    del e5
    e4 = engine(gemm_step_choice=False, fuse_rope=False)  # RoPE as its own launch
    for b, k in ((1, 0), (8, 3), (64, 7)):
        outs = _replay_outputs((e4, e), b, k)
        print(f"graph RoPE unfused b={b} k={k}: same tokens as fused {bool((outs[0] == outs[1]).all())}")
    del e4
    atomic = gemm.atomic_split  # the engine's split-K tail at M <= ATOMIC_MAX_ROWS; e6 runs the other one
    gemm.atomic_split = not atomic
    try:
        e6 = engine(gemm_step_choice=False)
        for b, k in ((1, 0), (1, 7), (8, 3), (64, 7)):
            outs = _replay_outputs((e6, e6, e), b, k)
            print(f"graph atomic split-K {'off' if atomic else 'on'} b={b} k={k}: replay==replay "
                  f"{bool((outs[0] == outs[1]).all())} same tokens as {'on' if atomic else 'off'} "
                  f"{bool((outs[0] == outs[2]).all())}")
        del e6
    finally:
        gemm.atomic_split = atomic
    for eng, name in ((e, "without the in-step GEMM choice"), (chosen, "default")):
        for b, k in ((1, 0), (1, 7), (8, 3), (64, 7)):
            eng.set_context(b, 500, seed=b)
            outs = []
            for mode in ("graph", "graph", "eager"):
                eng.reset_rows(b, 500)
                eng.last_token[:b] = eng.history[:b, 500]  # a step overwrote it (history from 501 on)
                buf = eng.launch(list(range(b)), k) if mode == "graph" else None
                if mode == "eager":
                    buf = eng.buffers[b]
                    with eng.step_choices(b, k):  # the GEMM picks and attention tiles the graph was captured with
                        eng._step_body(buf, k)
                torch.cuda.synchronize()
                outs.append(buf.out[:b, : k + 2].clone())
            print(f"graph {name} b={b} k={k}: replay==replay {bool((outs[0] == outs[1]).all())} "
                  f"replay==eager {bool((outs[0] == outs[2]).all())}")


def check_prefill() -> None:
    """8B-shape layers in bf16: a prompt prefilled eager, then (third time, its length's graph captured after the
    second) from the prefill graph, into other slots: the same first token, hidden states and KV cache rows, bit
    for bit; and a prompt of another length after it still matches its own eager prefill."""
    from tabletune.engine.drafters import ReplayDrafter

    torch.manual_seed(0)
    target = Decoder(PRESETS["qwen3-8b"], torch.bfloat16, "cuda", num_layers=4)
    e = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=8, max_len=600, k_max=3, buckets=(1, 8),
                                                          ks=(0, 3), prefill_graph_max_len=512))
    vocab = target.cfg.vocab_size
    for n in (32, 7):
        prompt = torch.randint(0, vocab, (n,)).tolist()
        firsts, hiddens = [], []
        for slot in range(3):
            p = torch.tensor(prompt, device="cuda")
            hidden, logits = e._prefill_target(p, torch.tensor([slot], device="cuda"))
            hiddens.append(hidden.clone())
            firsts.append(int(logits.argmax(-1)))
        rows = [torch.stack([c[s, :, :n] for c in (*e.cache.k, *e.cache.v)]) for s in range(3)]
        print(f"prefill n={n}: graph captured {n in e.prefill_graphs}; replay vs eager: first token "
              f"{firsts[2] == firsts[0]}, hidden identical {bool((hiddens[2] == hiddens[0]).all())}, KV rows identical "
              f"{bool((rows[2] == rows[0]).all())}; eager vs eager {bool((hiddens[1] == hiddens[0]).all())}")
        if not (n in e.prefill_graphs and firsts[2] == firsts[0] and (hiddens[2] == hiddens[0]).all()
                and (rows[2] == rows[0]).all()):
            raise RuntimeError(f"prefill graph of {n} tokens differs from the eager prefill")
    t0 = time.perf_counter()
    for slot in range(8):
        e.prefill(slot, prompt)
    torch.cuda.synchronize()
    graphed = (time.perf_counter() - t0) / 8
    e.prefill_graph_max_len, e.prefill_graphs = 0, {}
    t0 = time.perf_counter()
    for slot in range(8):
        e.prefill(slot, prompt)
    torch.cuda.synchronize()
    print(f"prefill of {len(prompt)} tokens, 4 layers: graph {graphed * 1e3:.2f} ms, eager "
          f"{(time.perf_counter() - t0) / 8 * 1e3:.2f} ms")


def check_cublaslt() -> None:
    """Every heuristic kernel cuBLASLt offers at a few decode shapes: error against torch, the same bits on a
    repeat and from a CUDA graph replay (the form the engine runs it in)."""
    if not cublaslt.available():
        raise RuntimeError("cuBLASLt not found (the engine then runs without its heuristic kernels)")
    shapes = PRESETS["qwen3-8b"].layer_gemm_shapes()
    for name, m in (("o", 224), ("qkv", 128), ("down", 192), ("gate_up", 1), ("o", 16)):
        n, k = shapes[name]
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
        ref = x @ w.t()
        algos = cublaslt.heuristics(m, n, k, torch.bfloat16, 16)  # whatever gemm.LT_ALGOS the engine runs with
        worst, same = 0.0, True
        for algo in algos:
            a = cublaslt.matmul(x, w, algo)
            worst = max(worst, rel(a, ref))
            same &= bool((cublaslt.matmul(x, w, algo) == a).all())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = cublaslt.matmul(x, w, algo)
            g.replay()
            torch.cuda.synchronize()
            same &= bool((out == a).all())
        print(f"cublaslt {name} M={m}: {len(algos)} kernels, worst relative error {worst:.2e}, "
              f"repeat- and graph-identical {same}; split-K of the kernels: {[a.split_k for a in algos]}")
        if not algos or worst > 2e-2 or not same:
            raise RuntimeError(f"cublaslt {name} M={m}: {len(algos)} kernels, error {worst:.2e}, identical {same}")


CHECKS = {"kernels": check_kernels, "fused": check_fused, "cublaslt": check_cublaslt, "graphs": check_graph_replay,
          "lossless": check_lossless, "prefill": check_prefill, "moe": check_moe}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--drafters", default=",".join(DRAFTERS),
                    help="the lossless part's drafters, in this order (a device-side assert ends the process, so "
                         "one drafter at a time tells which engine raises it)")
    ap.add_argument("--free-engines", action="store_true",
                    help="lossless part: free each engine (gc.collect, sync) before the next one is made")
    args = ap.parse_args()
    parts, DRAFTERS, FREE_ENGINES = args.parts.split(","), tuple(args.drafters.split(",")), args.free_engines
    unknown = [p for p in parts if p not in CHECKS]
    if unknown:
        raise SystemExit(f"engine_gpu_check.py: --parts {','.join(unknown)} not in {','.join(CHECKS)}")
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    failed = []
    for part in parts:  # a failing part is reported and the others still run (one device call, all the answers)
        t0 = time.perf_counter()
        try:
            CHECKS[part]()
        except Exception:
            failed.append(part)
            traceback.print_exc()
        print(f"part {part}: {time.perf_counter() - t0:.0f} s{' FAILED' if part in failed else ''}", flush=True)
    raise SystemExit(f"engine_gpu_check.py: parts failed: {','.join(failed)}" if failed else 0)
