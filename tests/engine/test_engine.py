"""The reference engine on the CPU: lossless speculation, counters, CUDA graphs off, a real model."""

import dataclasses
import os
import random
import subprocess
import sys
import types
import zlib

import pytest

torch = pytest.importorskip("torch")

from tabletune.engine.drafters import ReplayDrafter, make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS, config_from_hf  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, draw_caps, steady_throughput  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402

DRAFTERS = ("ngram", "eagle", "draft_model", "parallel_block")


def _engine(target, drafter, k_max=4, max_num_seqs=4, max_len=72, temperature=0.0, draft_model=None):
    d = make_drafter(drafter, target, k_max, draft_cfg=PRESETS["tiny"], draft_model=draft_model)
    return SpecEngine(target, d, EngineConfig(max_num_seqs=max_num_seqs, max_len=max_len, k_max=k_max,
                                              temperature=temperature))


def _serve(engine, prompts, table, max_new=24, **kw):
    reqs = [Request(list(p), max_new, i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, table, **kw).run(reqs)
    return [r.output for r in reqs], stats


def _random_table(rng, k_max, max_batch):
    bounds = sorted(rng.sample(range(2, max_batch + 1), 2))
    starts = [1] + bounds
    ends = [s - 1 for s in starts[1:]] + [max_batch]
    return DraftTable.from_ranges([[s, e, rng.randrange(k_max + 1)] for s, e in zip(starts, ends)])


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    rng = random.Random(0)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 20))] for _ in range(6)]
    base, _ = _serve(_engine(target, "ngram"), prompts, DraftTable.fixed(0))
    return target, prompts, base


def test_cpu_engine_captures_no_graph(tiny):
    target, _, _ = tiny
    engine = _engine(target, "eagle")
    assert engine.graphs == {}
    assert engine.cache.scratch_slot == engine.buckets[-1]


def test_cpu_prefills_run_eager_and_capture_no_prefill_graph(tiny):
    """The prefill graphs are CUDA-only: on the CPU prompts of a repeated length stay eager (and lossless)."""
    target, prompts, base = tiny
    engine = _engine(target, "ngram")
    assert engine.prefill_graph_max_len == 0
    out, _ = _serve(engine, prompts + [prompts[0]] * 3, DraftTable.fixed(2))
    assert out[: len(prompts)] == base and out[len(prompts):] == [base[0]] * 3
    assert engine.prefill_graphs == {}
    with pytest.raises(ValueError, match="bad engine config"):
        EngineConfig(prefill_graph_max_len=-1)


class _ReplayedForward:
    """A stand-in for a captured prefill on the CPU: replay() runs the forward again on the static inputs and
    writes the results into the static outputs, as a CUDA graph replay would."""

    def __init__(self, engine, tokens, slot):
        self.engine, self.tokens, self.slot = engine, tokens, slot
        self.hidden, self.logits = engine._prefill_forward(tokens, slot)
        self.replays = 0

    def replay(self):
        hidden, logits = self.engine._prefill_forward(self.tokens, self.slot)
        self.hidden.copy_(hidden)
        self.logits.copy_(logits)
        self.replays += 1


def test_prefill_graph_bookkeeping_with_a_stand_in_graph(tiny, monkeypatch):
    """The prefill graphs' bookkeeping (``SpecEngine._prefill_target``) with the capture replaced by a stand-in:
    a length is captured after its second prompt, later prompts of that length replay with their own tokens and
    slot (lossless), other lengths stay eager, and a capture that fails leaves every prefill eager."""
    from tabletune.engine import runner

    target, prompts, base = tiny
    engine = _engine(target, "eagle")
    engine.prefill_graph_max_len = 64
    graphs = []

    def capture(tokens, slot):
        g = _ReplayedForward(engine, tokens, slot)
        graphs.append(g)
        return runner.PrefillGraph(g, tokens, slot, g.hidden, g.logits)
    monkeypatch.setattr(engine, "_capture_prefill", capture)
    n = len(prompts[0])
    others = [p for p in prompts if len(p) != n]
    same = [list(prompts[0])] * 3 + [[(t + 1) % 97 for t in prompts[0]]]  # a fourth prompt of that length
    out, _ = _serve(engine, same + others, DraftTable.fixed(2))
    eager, _ = _serve(_engine(target, "eagle"), same + others, DraftTable.fixed(2))
    assert out == eager and out[:3] == [base[0]] * 3
    seen, second = {}, []  # prompts are prefilled in request order: a length's graph comes at its second prompt
    for p in same + others:
        seen[len(p)] = seen.get(len(p), 0) + 1
        second += [len(p)] if seen[len(p)] == 2 else []
    assert list(engine.prefill_graphs) == second and second[0] == n
    assert graphs[0].replays == 2  # the third and fourth prompt of length n
    fails = _engine(target, "eagle")
    fails.prefill_graph_max_len = 64

    def broken(tokens, slot):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(fails, "_capture_prefill", broken)
    out2, _ = _serve(fails, same + others, DraftTable.fixed(2))
    assert out2 == eager and fails.prefill_graphs == {} and fails.prefill_graph_max_len == 0


class _ReplayedStep:
    """A stand-in for a captured step on the CPU: replay() uploads the host inputs and runs the step body, as the
    graph's first node and the captured kernels would."""

    def __init__(self, engine, b, k):
        self.engine, self.buf, self.k = engine, engine.buffers[b], k

    def replay(self):
        self.buf.inputs.copy_(self.buf.host)
        self.engine._step_body(self.buf, self.k)


def test_in_step_attention_choice_puts_the_inputs_and_rows_back(tiny, monkeypatch):
    """``SpecEngine._choose_attention_in_step`` (captures, then times each candidate's replay on rows 0 .. b-1),
    with the capture and the timing replaced by stand-ins: after each (bucket, k) the device inputs name the
    scratch slot again and rows 0 .. b-1 hold what they held before. Otherwise the next capture's eager warm-up ran
    on rows 0 .. b-1 and advanced their cached length by up to k + 1 a capture, until the history write of a step
    indexed past max_len (a device-side assert on the H200, at the fourth engine of the lossless check)."""
    from types import SimpleNamespace

    from tabletune.engine import kernels

    target, _, _ = tiny
    engine = _engine(target, "parallel_block")
    b = engine.buckets[-1]
    buf = engine.buffers[b]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(kernels, "step_attn_candidates", lambda batch, kv_heads, sms: [None, (64, 4, 4, 1)])

    def capture_step(b, k, pool=None, upload=True, stream=None):
        engine._step_body(engine.buffers[b], k)  # the warm-up step capture_step runs before capturing
        return _ReplayedStep(engine, b, k)

    def timed_ms(run, num_rows, context_len):
        engine.reset_rows(num_rows, context_len)
        run()
        return 1.0
    monkeypatch.setattr(engine, "capture_step", capture_step)
    monkeypatch.setattr(engine, "timed_ms", timed_ms)
    scratch = torch.full((b,), engine.cache.scratch_slot, dtype=torch.long)
    for _ in range(3):
        for k in engine.ks:
            engine._choose_attention_in_step(b, k, None, None, reps=2)
            assert torch.equal(buf.inputs[0].cpu(), scratch) and torch.equal(buf.host[0], scratch), k
            assert int(engine.cached[:b].abs().sum()) == 0, (k, engine.cached[:b].tolist())
            assert set(engine.attn_step_force[(b, k)] or ()) <= {64, 4, 1}


def test_in_step_gemm_choice_keeps_the_faster_capture_and_records_it(tiny, monkeypatch):
    """``SpecEngine._choose_gemms_in_step`` with stand-in captures and timings: a step whose GEMM picks the switch
    would change is captured again under ``gemm.triton_only`` (applied by ``step_choices``, as ``capture_step``
    does), the faster replay is kept and recorded, and the inputs, rows and the switch are as they were after;
    steps the switch does not change, or of more than MAX_TRITON_M or ``gemm_step_max_rows`` rows, are not captured
    again."""
    from tabletune.engine import gemm

    target, _, _ = tiny
    engine = _engine(target, "ngram")
    b = engine.buckets[-1]
    buf = engine.buffers[b]
    monkeypatch.setattr(gemm, "MAX_TRITON_M", 3 * b)
    changed = []
    monkeypatch.setattr(gemm, "pdl_breaks", lambda rows: sorted(rows) if changed else [])
    captured = []

    def capture_step(b, k, pool=None, upload=True, stream=None):
        with engine.step_choices(b, k):
            engine._step_body(engine.buffers[b], k)  # the warm-up step capture_step runs before capturing
            step = _ReplayedStep(engine, b, k)
            step.triton_only = gemm.triton_only
        captured.append((b, k, step.triton_only))
        return step
    faster = [True]

    def timed_ms(run, num_rows, context_len):
        engine.reset_rows(num_rows, context_len)
        run()
        return 1.0 if run.__self__.triton_only == faster[0] else 2.0
    monkeypatch.setattr(engine, "capture_step", capture_step)
    monkeypatch.setattr(engine, "timed_ms", timed_ms)
    scratch = torch.full((b,), engine.cache.scratch_slot, dtype=torch.long)
    first = capture_step(b, 1)
    assert engine._choose_gemms_in_step(b, 1, first, None, None, reps=2) is first  # nothing to change
    changed.append(True)
    assert engine._choose_gemms_in_step(b, 3, first, None, None, reps=2) is first  # 4 b rows > MAX_TRITON_M
    assert captured == [(b, 1, False)] and engine.gemm_step_triton == {(b, 1): False, (b, 3): False}
    for k, fast in ((1, True), (2, False)):
        faster[0] = fast
        kept = engine._choose_gemms_in_step(b, k, first, None, None, reps=3)
        assert captured[-1] == (b, k, True) and kept.triton_only is fast
        assert engine.gemm_step_triton[(b, k)] is fast and set(engine.gemm_step_ms[(b, k)]) == {False, True}
        assert torch.equal(buf.inputs[0].cpu(), scratch) and torch.equal(buf.host[0], scratch), k
        assert int(engine.cached[:b].abs().sum()) == 0, (k, engine.cached[:b].tolist())
        assert gemm.triton_only is False
    with engine.step_choices(b, 1):
        assert gemm.triton_only is True
        with engine.step_choices(b, 2):  # set from outside: kept
            assert gemm.triton_only is True
    assert gemm.triton_only is False
    engine.cfg = dataclasses.replace(engine.cfg, gemm_step_max_rows=2 * b)  # k = 1: 2 b rows, at the cap; k = 2: over
    num_captured = len(captured)
    assert engine._choose_gemms_in_step(b, 2, first, None, None, reps=2) is first
    assert len(captured) == num_captured and engine.gemm_step_triton[(b, 2)] is False
    engine._choose_gemms_in_step(b, 1, first, None, None, reps=2)
    assert len(captured) == num_captured + 1


def test_prefill_attention_takes_a_slot_tensor_and_sdpa_causal_from_position_0():
    """ops.prefill_attention: the slot as an int and as a device tensor (a captured prefill's), from position 0
    (SDPA's causal mask) and from position 2 (an explicit mask), against attention written out by hand."""
    from tabletune.engine import ops

    torch.manual_seed(0)
    h, hkv, d, length = 4, 2, 16, 12
    kc, vc = torch.randn(3, hkv, length, d), torch.randn(3, hkv, length, d)
    for start, plen in ((0, 7), (2, 5)):
        q = torch.randn(1, plen, h, d)
        end = start + plen
        k = kc[1, :, :end].repeat_interleave(h // hkv, 0)  # [H, end, D]
        v = vc[1, :, :end].repeat_interleave(h // hkv, 0)
        scores = torch.einsum("phd,hnd->hpn", q[0], k) * d ** -0.5
        visible = torch.arange(end)[None, :] <= start + torch.arange(plen)[:, None]
        ref = torch.einsum("hpn,hnd->phd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)[None]
        for slot in (1, torch.tensor([1])):
            got = ops.prefill_attention(q, kc, vc, start, slot, d ** -0.5)
            assert torch.allclose(got, ref, atol=1e-5), (start, slot)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphs_captured_per_bucket_and_k():
    target = Decoder(PRESETS["tiny"], torch.float32, "cuda")
    engine = _engine(target, "eagle", k_max=2, max_num_seqs=4)
    assert set(engine.graphs) == {(b, k) for b in (1, 2, 4) for k in (0, 1, 2)}


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_outputs_identical_with_speculation(tiny, drafter):
    target, prompts, base = tiny
    rng = random.Random(zlib.crc32(drafter.encode()))  # hash() of a str changes between processes
    for _ in range(2):
        table = _random_table(rng, 4, 4)
        out, stats = _serve(_engine(target, drafter), prompts, table)
        assert out == base, f"{drafter} with table {table}"
        # one draft per row of every step that ran with k > 0 (the table's k at that step's batch size)
        assert stats.step_ks == [table.k_for(b) for b in stats.step_batch_sizes]
        assert stats.counts.num_drafts == sum(b for b, k in zip(stats.step_batch_sizes, stats.step_ks) if k > 0)


@pytest.mark.slow
def test_self_drafting_accepts_everything(tiny):
    """The target as its own draft model: every draft matches (checks the catch-up bookkeeping)."""
    target, prompts, base = tiny
    out, stats = _serve(_engine(target, "draft_model", draft_model=target), prompts, DraftTable.fixed(3))
    assert out == base
    assert stats.counts.rates() == [1.0, 1.0, 1.0, None]


def test_counters_match_hand_worked_steps(tiny):
    """Replay of the exact greedy continuation, capped at position 1 every step (rates 1, 0).

    One request, 9 new tokens, k = 3: the prefill emits 1 token, each step accepts 1 draft and
    emits 2 tokens, so 4 steps. Per position: drafted [4, 4, 4] (every draft has length 3),
    reached [4, 4, 0] (position 2 is tested after position 1 passed), accepted [4, 0, 0].
    """
    target, prompts, base = tiny
    engine = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=1, max_len=72, k_max=3))
    req = Request(list(prompts[0]), 9, 0, oracle=base[0] + [0] * 8)
    stats = Scheduler(engine, DraftTable.fixed(3), cap_rates=[1.0, 0.0, 0.0]).run([req])
    assert req.output == base[0][:9]
    assert stats.num_steps == 4
    c = stats.counts
    assert (c.num_drafts, c.drafted, c.reached, c.accepted) == (4, [4, 4, 4], [4, 4, 0], [4, 0, 0])


def test_replay_without_cap_accepts_all_and_is_lossless(tiny):
    target, prompts, base = tiny
    engine = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=4, max_len=72, k_max=4))
    reqs = [Request(list(p), 13, i, oracle=base[i] + [0] * 8) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, DraftTable.fixed(4)).run(reqs)
    assert [r.output for r in reqs] == [b[:13] for b in base]
    assert stats.counts.rates()[0] == 1.0


def test_scheduler_replaces_finished_requests_in_the_same_step(tiny):
    """k = 0 (one token per step), max_num_seqs 2, outputs of 3, 5 and 4 tokens (the prefill gives the first).

    step 0: r0, r1 admitted (2 tokens each after it); step 1: r0 reaches 3 -> replaced before step 2, where
    r2 is admitted; r1 reaches 5 after step 3 -> gone from step 4; r2 reaches 4 after step 4 -> gone at 5.
    """
    target, prompts, _ = tiny
    engine = _engine(target, "ngram", max_num_seqs=2)
    reqs = [Request(list(prompts[i]), n, i) for i, n in enumerate((3, 5, 4))]
    stats = Scheduler(engine, DraftTable.fixed(0)).run(reqs)
    assert [len(r.output) for r in reqs] == [3, 5, 4]
    assert stats.step_batch_sizes == [2, 2, 2, 2, 1]
    assert stats.step_admitted == [2, 0, 1, 0, 0]
    assert stats.replaced_at_step == {0: 2, 1: 4, 2: 5}
    assert stats.step_tokens == [2 + 2, 2, 1 + 2, 2, 1]  # first tokens of the admitted + one per running row
    assert len(stats.step_prefill_s) == 5 and stats.step_prefill_s[1] == 0.0 < stats.step_prefill_s[0]


def test_steady_throughput_window_hand_worked():
    # steps: batch [2, 2, 2, 1], tokens [4, 2, 3, 1], wall [1, 1, 2, 1] s; load 2 -> last full step is 2
    args = ([2, 2, 2, 1], [1.0, 1.0, 2.0, 1.0], [4, 2, 3, 1], 2)
    assert steady_throughput(*args) == pytest.approx((2 + 3) / (1 + 2))  # default: from step 1
    assert steady_throughput(*args, start=2) == pytest.approx(3 / 2)
    assert steady_throughput(*args, start=9) == pytest.approx(3 / 2)  # never past the last full step
    assert steady_throughput([1, 1], [1.0, 1.0], [1, 1], 2) == 0.0  # the load never ran


def test_draw_caps_replays_conditional_rates():
    rng = random.Random(0)
    caps = draw_caps([0.8, 0.5], 2, 20000, rng)
    reached_2 = sum(c >= 1 for c in caps)
    assert abs(reached_2 / len(caps) - 0.8) < 0.02
    assert abs(sum(c == 2 for c in caps) / reached_2 - 0.5) < 0.02


@pytest.mark.slow
def test_sampling_engine_runs_every_drafter(tiny):
    target, prompts, _ = tiny
    for drafter in DRAFTERS:
        torch.manual_seed(0)
        out, stats = _serve(_engine(target, drafter, temperature=0.8), prompts[:2], DraftTable.fixed(2), max_new=10)
        assert all(len(o) == 10 and all(0 <= t < 97 for t in o) for o in out)


@pytest.mark.slow
def test_triton_kernels_match_torch_ops_in_interpreter():
    """The Triton kernels (RoPE/cache write, split-KV attention, the two fused, norms, split-K, gated and stream-K
    GEMM, the fused-norm GEMMs: norm and norm + silu epilogues, residual epilogue) under TRITON_INTERPRET=1."""
    pytest.importorskip("triton")
    code = """
import torch
from tabletune.engine import kernels as K, ops as O, gemm as G
torch.manual_seed(0)
B, q, H, Hkv, D, S, L = 3, 3, 4, 2, 16, 5, 40
qkv = torch.randn(B, q, (H + 2 * Hkv) * D)
start = torch.tensor([5, 0, 17]); slots = torch.tensor([2, 0, 4])
kc1, vc1 = torch.randn(S, Hkv, L, D), torch.randn(S, Hkv, L, D)
kc2, vc2 = kc1.clone(), vc1.clone()
qn, kn = torch.rand(D) + 0.5, torch.rand(D) + 0.5
qa = O.qk_rope_cache_write(qkv, start, slots, kc1, vc1, qn, kn, H, Hkv, D, 1e4, 1e-6)
qb = K.qk_rope_cache_write(qkv, start, slots, kc2, vc2, qn, kn, H, Hkv, D, 1e4, 1e-6)
err = [(qa - qb).abs().max(), (kc1 - kc2).abs().max(), (vc1 - vc2).abs().max()]
for splits in (1, 3, 16):  # 16 splits: some splits see no keys at all
    err.append((O.attention(qa, kc1, vc1, start, slots, D ** -0.5)
                - K.attention(qa, kc1, vc1, start, slots, D ** -0.5, num_splits=splits)).abs().max())
# RoPE + cache write inside attention: sequence 2's new keys 126..128 straddle the 2-split boundary at 128
start2 = torch.tensor([5, 0, 126]); L2 = 140
kc0, vc0 = torch.randn(S, Hkv, L2, D), torch.randn(S, Hkv, L2, D)
for norm in ((qn, kn), (None, None)):
    for splits in (1, 2, 3, 16):
        kca, vca, kcb, vcb = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
        oa = O.rope_attention(qkv, start2, slots, kca, vca, *norm, H, Hkv, D, 1e4, 1e-6, D ** -0.5)
        ob = K.rope_attention(qkv, start2, slots, kcb, vcb, *norm, H, Hkv, D, 1e4, 1e-6, D ** -0.5, num_splits=splits)
        err += [(oa - ob).abs().max(), (kca - kcb).abs().max(), (vca - vcb).abs().max()]
for c in (K.AttnConfig(3, 32, 4, 4), K.AttnConfig(2, 128, 8, 3)):  # the chooser's configs: other tile widths
    kca, vca, kcb, vcb = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    oa = O.rope_attention(qkv, start2, slots, kca, vca, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5)
    ob = K.rope_attention(qkv, start2, slots, kcb, vcb, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5, cfg=c)
    err += [(oa - ob).abs().max(), (kca - kcb).abs().max()]
    err.append((O.attention(qa, kc1, vc1, start, slots, D ** -0.5)
                - K.attention(qa, kc1, vc1, start, slots, D ** -0.5, cfg=c)).abs().max())
x, d, w = torch.randn(5, 48), torch.randn(5, 48), torch.rand(48)
err += [(a - b).abs().max() for a, b in zip(O.add_rms_norm(x, d, w, 1e-6), K.add_rms_norm(x, d, w, 1e-6))]
err += [(a - b).abs().max() for a, b in zip(O.add_rms_norm(x, None, w, 1e-6), K.add_rms_norm(x, None, w, 1e-6))]
gu = torch.randn(7, 96)
err.append((O.silu_mul(gu) - K.silu_mul(gu)).abs().max())
x, w, gu = torch.randn(20, 300), torch.randn(70, 300), torch.randn(20, 600)
for cfg in ((64, 64, 64, 1, 4, 4), (16, 32, 64, 3, 4, 4), (16, 32, 32, 8, 4, 4)):  # split-K 1, 3 and 8
    err.append((G.triton_linear(x, w, cfg) - x @ w.T).abs().max())
    err.append((G.triton_linear(gu, w, cfg, gated=True) - O.silu_mul(gu) @ w.T).abs().max())
x, w = torch.randn(130, 256), torch.randn(200, 256)  # the TMA kernel: rows past M and columns past N zero-filled
for cfg in ((64, 128, 64, 1, 4, 6, True), (128, 128, 64, 3, 8, 5, True),  # split-K 1 and 3 (of 4 K tiles)
            (64, 128, 64, 1, 4, 6, True, 0, True), (128, 64, 64, 3, 8, 5, True, 0, True)):  # the same, W x^T
    err.append((G.triton_linear(x, w, cfg) - x @ w.T).abs().max())
# stream-K, 5 k-blocks per tile: 5 tiles of 16 columns over 3 or 7 programs (tiles split, programs spanning
# tiles), over 64 programs (more than the 25 iterations: empty ranges); 2 row blocks x 3 column blocks over 4
x, w = torch.randn(5, 300), torch.randn(70, 300)
for programs in (3, 7, 64):
    err.append((G.triton_linear(x, w, (16, 16, 64, 1, 4, 4, False, programs)) - x @ w.T).abs().max())
x = torch.randn(20, 300)
err.append((G.triton_linear(x, w, (16, 32, 64, 1, 4, 4, False, 4)) - x @ w.T).abs().max())
# the fused-norm GEMMs, K = 300 (the last K tile masked), N = 70 over tiles of 32 (the last masked), split 1 and 3,
# 1 / 5 / 16 rows: the norm from 3 column-tile partials of the sums of squares (its weight folded into W), with and
# without silu * mul over a [gate | up] W, the residual add and its squares
nw, nw70 = torch.rand(300) + 0.5, torch.rand(70) + 0.5
wgu = torch.randn(140, 300)
for rows in (1, 5, 16):
    xr = torch.randn(rows, 300)
    ss = torch.zeros(3 * 16)
    for t, cols in enumerate((slice(0, 100), slice(100, 250), slice(250, 300))):
        ss[t * 16: t * 16 + rows] = (xr[:, cols] ** 2).sum(1)
    hn = O.add_rms_norm(xr, None, nw, 1e-6)[0]
    x, gu, r0 = torch.randn(rows, 300), torch.randn(rows, 600), torch.randn(rows, 70)
    norm = G.RowNorm(G.RowSquares(ss, 3), 1e-6)
    for cfg in (G.Config(16, 32, 64, 1, 4, 4), G.Config(16, 32, 64, 3, 4, 4)):
        for wt, silu, ref in ((w, False, hn @ w.T), (wgu, True, O.silu_mul(hn @ wgu.T))):
            y = G.norm_linear(xr, G.fold_norm(wt, nw), cfg, norm, silu=silu)
            assert y.shape == ref.shape, (y.shape, ref.shape)
            err.append((y - ref).abs().max() / ref.abs().max())
        for gated, inp, prod in ((False, x, x @ w.T), (True, gu, O.silu_mul(gu) @ w.T)):
            r = r0.clone()
            sq = G.residual_linear(inp, w, cfg, r, gated=gated)
            r_ref = O.add_rms_norm(r0, prod, nw70, 1e-6)[1]
            err.append((r - r_ref).abs().max() / r_ref.abs().max())
            got_ss = sq.ss.view(sq.tiles, 16)[:, :rows].sum(0)
            err.append(((got_ss - (r_ref ** 2).sum(1)) / (r_ref ** 2).sum(1)).abs().max())
assert max(float(e) for e in err) < 1e-3, err
assert int(K.counters(x.device).abs().sum()) == 0  # the last program of each tile reset its ticket
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_atomic_split_k_gemm_and_its_consumer_match_the_fix_up_bit_for_bit_in_interpreter():
    """``gemm.atomic_split``: one or two K splits added atomically into an fp32 ``kernels.accumulator`` give the
    fix-up's sum to the bit (plain and gated); ``add_rms_norm`` of that accumulator gives the same residual and
    norm as of the GEMM's own output and leaves the accumulator at zeros; three splits and other kinds of choice
    are refused."""
    pytest.importorskip("triton")
    code = """
import torch
from tabletune.engine import cublaslt, gemm as G, kernels as K
torch.manual_seed(0)
dev = torch.device("cpu")
x, gu, w = torch.randn(5, 300), torch.randn(5, 600), torch.randn(70, 300)
r0, nw = torch.randn(5, 70), torch.rand(70) + 0.5
for cfg in (G.Config(16, 32, 64, 1, 4, 4), G.Config(16, 32, 64, 2, 4, 4), G.Config(16, 32, 128, 2, 4, 4)):
    for gated, inp in ((False, x), (True, gu)):
        ref = G.triton_linear(inp, w, cfg, gated=gated)
        acc = K.accumulator(5, 70, dev)
        assert K.is_accumulator(acc) and not K.is_accumulator(ref) and bool((acc == 0).all())
        got = G._pointer_gemm(inp, w, cfg, acc, gated, atomic=True)
        assert got.data_ptr() == acc.data_ptr() and torch.equal(got, ref), (cfg, gated)
        ya, ra = K.add_rms_norm(r0, ref, nw, 1e-6)
        yb, rb = K.add_rms_norm(r0, acc, nw, 1e-6)
        assert torch.equal(ya, yb) and torch.equal(ra, rb) and bool((acc == 0).all())
try:
    G._pointer_gemm(x, w, G.Config(16, 32, 64, 3, 4, 4), K.accumulator(5, 70, dev), atomic=True)
    raise SystemExit("three splits were not refused")
except ValueError:
    pass
assert G._atomic_ok(G.Config(16, 32, 64, 2, 4, 4), w) and not G._atomic_ok(G.Config(16, 32, 64, 3, 4, 4), w)
assert G._atomic_ok(G.Config(16, 32, 64, 8, 4, 4), torch.randn(70, 128))  # 8 asked, 2 effective: 128 / 64
assert not any(G._atomic_ok(c, w) for c in (None, 64, G.CUBLASLT, G.Config(64, 128, 64, 2, 4, 4, True),
                                             G.Config(16, 32, 64, 1, 4, 4, False, 132)))
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_attention_head_groups_match_torch_ops_in_interpreter():
    """``kernels.attn_max_rows``: at q = 5 and 8 tokens with G = 4 heads a KV head the group's heads are dealt to
    programs of at most 8 / 16 rows (2 or 4 head groups), with and without key splits and with halved splits; both
    attention kernels match the PyTorch ops and leave every ticket at zero."""
    pytest.importorskip("triton")
    code = """
import torch
from tabletune.engine import kernels as K, ops as O
assert [K.heads_per_program(4, q, 16) for q in (1, 4, 5, 8, 9, 17)] == [4, 4, 2, 2, 1, 1]
assert K.heads_per_program(4, 8, 0) == 4 and K.heads_per_program(6, 3, 16) == 3
torch.manual_seed(0)
B, H, Hkv, D, S, L = 2, 8, 2, 16, 4, 140
slots, start = torch.tensor([3, 1]), torch.tensor([9, 126])
kc0, vc0 = torch.randn(S, Hkv, L, D), torch.randn(S, Hkv, L, D)
qn, kn = torch.rand(D) + 0.5, torch.rand(D) + 0.5
err = []
for q in (5, 8):
    qkv = torch.randn(B, q, (H + 2 * Hkv) * D)
    x = torch.randn(B, q, H, D)
    for max_rows, halve in ((16, False), (8, False), (16, True)):
        K.attn_max_rows, K.attn_rows_halve_splits = max_rows, halve
        for splits in (None, 1, 3):
            cfg = None if splits is None else K.AttnConfig(splits, 32, 4, 3)
            err.append((O.attention(x, kc0, vc0, start, slots, D ** -0.5)
                        - K.attention(x, kc0, vc0, start, slots, D ** -0.5, cfg=cfg)).abs().max())
            kca, vca, kcb, vcb = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
            oa = O.rope_attention(qkv, start, slots, kca, vca, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5)
            ob = K.rope_attention(qkv, start, slots, kcb, vcb, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5, cfg=cfg)
            err += [(oa - ob).abs().max(), (kca - kcb).abs().max(), (vca - vcb).abs().max()]
assert max(float(e) for e in err) < 1e-4, err
assert int(K.counters(x.device).abs().sum()) == 0
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_attention_chooser_in_interpreter():
    """``kernels.choose_attention`` on the CPU (the interpreter runs the kernels; the GPU queries and the timer are
    stand-ins): it keeps the fastest candidate whose output matches, never one that is wrong however fast, times a
    shape once, and below one (sequence, KV head) pair an SM returns the default without timing anything."""
    pytest.importorskip("triton")
    code = """
import types
import torch
from tabletune.engine import gemm as G, kernels as K
torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(multi_processor_count=4)
torch.cuda.is_current_stream_capturing = lambda: False
torch.cuda.synchronize = lambda *a: None
seen, timed = [], []
real = {"attn": K.attention, "rope": K.rope_attention}
WRONG = {K.AttnConfig(1, 64, 4, 3), K.AttnConfig(1, 64, 8, 3)}  # outputs corrupted below (the first candidate too)
FAST = K.AttnConfig(1, 128, 8, 3)
def spy(kind):
    def f(*a, cfg=None, **kw):
        seen.append(cfg)
        out = real[kind](*a, cfg=cfg, **kw)
        return out + 1.0 if cfg in WRONG else out
    return f
K.attention, K.rope_attention = spy("attn"), spy("rope")
def fake_time_us(fn):
    fn()
    c = seen[-1]
    timed.append(c)
    return 0.5 if c in WRONG else 1.0 if c == FAST else 5.0 + c.stages
G._time_us = fake_time_us
# b = 2, Hkv = 2: 4 pairs >= 4 SMs, one split a sequence (wave_splits), every tile a candidate
for kind in ("attn", "rope"):
    timed.clear()
    c = K.choose_attention(kind, 2, 3, 4, 2, 16, 40, torch.float32, torch.device("cpu"))
    assert c == FAST, (kind, c)
    assert K.attn_candidates(2, 2, 4)[0] in WRONG
    assert not WRONG & set(timed) and FAST in timed and len(timed) == len(K.attn_candidates(2, 2, 4)) - 2, timed
    timed.clear()
    assert K.choose_attention(kind, 2, 3, 4, 2, 16, 40, torch.float32, torch.device("cpu")) == FAST
    assert timed == []  # chosen once per shape
# b = 1: 2 pairs < 4 SMs: the default, nothing timed
assert K.choose_attention("attn", 1, 1, 4, 2, 16, 40, torch.float32, torch.device("cpu")) == K.default_attn_config(1, 2)
assert timed == []
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


@pytest.mark.slow
def test_fused_norm_forward_matches_the_standard_forward_in_interpreter():
    """The fused-norm layers (residual add + sums of squares in the o / down GEMM epilogues, the norm's row scale in
    the qkv and gate_up epilogues with its weight folded into W, silu * mul in gate_up's) against the standard
    forward, fp32, both on the Triton kernels under TRITON_INTERPRET=1 (tile choices set by hand: the chooser times
    on a GPU)."""
    pytest.importorskip("triton")
    code = """
import torch
from tabletune.engine import gemm as G, kernels as K
from tabletune.engine.model import Decoder
from tabletune.engine.presets import PRESETS
torch.manual_seed(0)
cfg = PRESETS["tiny"]
model = Decoder(cfg, torch.float32, "cpu", use_triton=True)
B, q = 2, 3
m = B * q
for layer in model.layers:  # split-K 1 and 3, 2-16 column tiles
    layer.in_norm.data.uniform_(0.5, 1.5)
    layer.post_norm.data.uniform_(0.5, 1.5)
    G._choice[(m, layer.wqkv.shape[0], layer.wqkv.shape[1], "norm")] = G.Config(16, 32, 32, 3, 4, 2)
    G._choice[(m, layer.w_gate_up.shape[0], layer.w_gate_up.shape[1], "norm-silu")] = G.Config(16, 16, 32, 3, 4, 2)
    G._choice[(m, layer.wo.shape[0], layer.wo.shape[1], "resid")] = G.Config(16, 32, 32, 3, 4, 2)
    G._choice[(m, layer.w_down.shape[0], layer.w_down.shape[1], "resid")] = G.Config(16, 16, 32, 1, 4, 2)
c1 = model.new_cache(3, 40)
c1.k.normal_()
c1.v.normal_()
c2 = model.new_cache(3, 40)
c2.k.copy_(c1.k)
c2.v.copy_(c1.v)
tokens = torch.randint(0, cfg.vocab_size, (B, q))
start, slots = torch.tensor([5, 17]), torch.tensor([0, 2])
ref = model(tokens, start, slots, c1)
got = model._forward_fused_norm(model.embed[tokens], start, slots, c2, None)
err = float((got - ref).abs().max() / ref.abs().max())
assert err < 1e-5 and torch.allclose(c1.k, c2.k, atol=1e-5) and torch.allclose(c1.v, c2.v, atol=1e-5), err
assert int(K.counters(got.device).abs().sum()) == 0
assert "wqkv" not in model.layers[0]._folded and all("wqkv" in l._folded for l in model.layers[1:])
print("ok")
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


@pytest.mark.slow
def test_smollm2_real_weights_match_transformers_and_stay_lossless():
    transformers = pytest.importorskip("transformers")
    from tabletune.integrations.hf import smollm2 as assets

    try:
        folder = assets.smollm2_model_dir()
    except Exception as exc:  # the package that carries the weights is missing
        pytest.skip(f"SmolLM2 weights unavailable: {exc}")
    cfg = config_from_hf(folder)
    model = Decoder(cfg, torch.float32, "cpu")
    model.load_safetensors(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok("def fibonacci(n):\n    if n < 2:\n        return n\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = hf(ids).logits[0]
    engine = SpecEngine(model, make_drafter("ngram", model, 4), EngineConfig(max_num_seqs=2, max_len=96, k_max=4))
    with torch.inference_mode():
        hidden = model(ids, torch.zeros(1, dtype=torch.long), torch.tensor([0]), engine.cache, prefill_at=(0, 0))
        ours = model.logits(hidden)[0]
    assert (ours - ref).abs().max().item() < 1e-3 * ref.abs().max().item()
    prompts = [ids[0].tolist()]
    base, _ = _serve(engine, prompts, DraftTable.fixed(0), max_new=32)
    spec, stats = _serve(engine, prompts, DraftTable.fixed(4), max_new=32)
    assert spec == base
    assert base[0][0] == int(ref[-1].argmax())
    assert stats.counts.accepted[0] > 0  # code repeats itself: prompt lookup finds matches


def test_padded_cublas_rows_return_the_first_m_rows_and_ignore_the_padding():
    """gemm's padded choice runs the product on the storage's extra rows; their contents must not leak."""
    pytest.importorskip("triton")
    from tabletune.engine import gemm as G, kernels as K

    x = K.empty_rows(5, 32, torch.float32, "cpu")
    full = x.as_strided((K.ROW_PAD, 32), (32, 1))
    full.fill_(float("nan"))  # garbage in the padding rows
    x.copy_(torch.randn(5, 32))
    w = torch.randn(24, 32)
    for rows in (64, K.ROW_PAD):
        assert G.padded_rows(x, rows).shape == (rows, 32)
        y = G._mm(x, w, rows)
        assert y.shape == (5, 24) and torch.allclose(y, x @ w.T, atol=1e-5)
    assert G.padded_rows(x, K.ROW_PAD + 1) is None  # the storage is shorter: no view
    plain = torch.randn(5, 32)
    assert G.padded_rows(plain, 64) is None
    assert torch.allclose(G._mm(plain, w, 64), plain @ w.T)  # falls back to M rows


def test_replay_stops_counting_a_request_once_its_oracle_leaves_the_target_path(tiny):
    """A capped step that accepts less than its cap means the oracle is stale: that request's drafts stop counting."""
    target, prompts, base = tiny
    engine = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=4, max_len=72, k_max=2))
    good = Request(list(prompts[0]), 24, 0, oracle=base[0] + [0] * 4)
    wrong = list(base[1])
    wrong[7] = (wrong[7] + 1) % 97  # the oracle goes wrong at output token 7 (a draft of the third step)
    bad = Request(list(prompts[1]), 24, 1, oracle=wrong + [0] * 4)
    stats = Scheduler(engine, DraftTable.fixed(2), cap_rates=[1.0, 1.0]).run([good, bad])
    assert [good.output, bad.output] == base[:2]  # lossless whatever the oracle
    assert (good.oracle_stale, bad.oracle_stale) == (False, True)
    # every counted draft was accepted in full: the stale request's rejection and later steps are left out
    assert stats.counts.rates() == [1.0, 1.0]
    assert 0 < stats.counts.num_drafts < sum(k > 0 for k in stats.step_ks) * 2


def test_two_stream_half_batch_forward_is_lossless(tiny):
    """overlap_min_tokens: the verify forward as two half-batches (one after the other on the CPU) emits the same tokens."""
    target, prompts, base = tiny
    d = make_drafter("eagle", target, 3, draft_cfg=PRESETS["tiny"])
    engine = SpecEngine(target, d, EngineConfig(max_num_seqs=4, max_len=72, k_max=3, overlap_min_tokens=1))
    assert engine.overlaps(4, 1) and not engine.overlaps(1, 3)
    out, stats = _serve(engine, prompts, DraftTable.from_ranges([[1, 1, 3], [2, 4, 2]]))
    assert out == base
    assert any(b >= 2 for b in stats.step_batch_sizes)  # the split path ran


def test_fixed_shape_keeps_one_bucket_while_the_batch_drains(tiny):
    target, prompts, base = tiny
    engine = _engine(target, "eagle", k_max=2, max_num_seqs=8)
    rows = []
    launch = engine.launch

    def spy(slots, k, caps=None, min_rows=0):
        buf = launch(slots, k, caps, min_rows)
        rows.append(buf.slots.shape[0])  # the bucket the step ran
        return buf
    engine.launch = spy
    reqs = [Request(list(p), 6 + 3 * i, i) for i, p in enumerate(prompts)]  # staggered lengths: the batch drains
    Scheduler(engine, DraftTable.fixed(2), fixed_shape=True).run(reqs)
    assert set(rows) == {8}  # 6 requests -> the 8-row bucket, also once only one is left
    assert [r.output for r in reqs] == [b[: 6 + 3 * i] for i, b in enumerate(base)]
    rows.clear()
    Scheduler(engine, DraftTable.fixed(2)).run([Request(list(p), 6 + 3 * i, i) for i, p in enumerate(prompts)])
    assert len(set(rows)) > 1  # without it the bucket follows the batch


def test_gemm_candidates_include_row_blocks_smaller_than_m():
    """For 16 < M <= 128 the chooser also times skinny configs that cover M with several row blocks."""
    pytest.importorskip("triton")
    from tabletune.engine import gemm as G

    def row_blocks(m, gated=False):
        return sorted({c[0] for c in G._configs(m, gated, tma=False)})
    assert row_blocks(1) == row_blocks(16) == [16]
    assert row_blocks(20) == [16, 32] and row_blocks(48, gated=True) == [16, 32, 64]
    assert row_blocks(100) == [16, 32, 64, 128]  # skinny row blocks and the mid-M tiles
    assert row_blocks(256) == [64, 128]
    assert all(c[5] * (c[0] + c[1]) * c[2] * 2 <= G.SMEM_BYTES for m in (20, 100) for c in G._configs(m, False))


def test_tma_gemm_configs_cover_mid_m_plain_shapes_only():
    pytest.importorskip("triton")
    from tabletune.engine import gemm as G

    def tma(m, gated=False):
        return [c for c in G._configs(m, gated) if c.tma]
    assert tma(16) == [] and tma(100, gated=True) == [] and tma(600) == []
    assert {c.block_m for c in tma(40)} == {64} and {c.block_m for c in tma(200)} == {64, 128}
    assert all(c.stages * (c.block_m + c.block_n) * c.block_k * 2 <= G.SMEM_BYTES for c in tma(512))


def test_l2_prefetch_plan_covers_the_tensor_and_config_is_checked(tiny):
    pytest.importorskip("triton")
    from tabletune.engine import kernels as K

    for nbytes, mode in ((32 << 20, "lines"), (48 << 20, "bulk"), (1000, "lines_evict_last")):
        chunk_elems, num_chunks, per_prog = K.prefetch_plan(nbytes, mode, programs=16, block=256)
        chunk = 2 * chunk_elems
        assert chunk == (K.PREFETCH_BULK_BYTES if mode == "bulk" else K.PREFETCH_LINE_BYTES)
        assert num_chunks * chunk <= max(nbytes, chunk) and (num_chunks + 1) * chunk > nbytes  # never past the end
        assert per_prog % 256 == 0 and -(-num_chunks // per_prog) * per_prog >= num_chunks  # every chunk hinted
    with pytest.raises(ValueError):
        K.prefetch_plan(1 << 20, "everything")
    with pytest.raises(ValueError):
        EngineConfig(prefetch_mode="everything")
    with pytest.raises(ValueError):
        EngineConfig(prefetch_max_batch=-1)
    with pytest.raises(ValueError):
        EngineConfig(prefetch_programs=0)
    with pytest.raises(ValueError):
        EngineConfig(fuse_norm_max_rows=-1)
    target, _, _ = tiny
    engine = SpecEngine(target, make_drafter("ngram", target, 2), EngineConfig(max_num_seqs=4, max_len=40, k_max=2,
                                                                             prefetch_max_batch=4))
    assert not engine.prefetches(1)  # a hint for the GPU's L2: never on the CPU
    x = torch.zeros(1, 2, target.cfg.hidden_size)
    assert not target.fuses_norm(x, None, 16)  # the fused-norm layers are Triton GEMMs: CUDA only


def test_stream_k_gemm_configs_cover_small_m_plain_shapes_only():
    pytest.importorskip("triton")
    from tabletune.engine import gemm as G

    def stream_k(m, gated=False):
        return [c for c in G._configs(m, gated, tma=False) if c.stream_k]
    assert stream_k(65) == [] and stream_k(8, gated=True) == []
    for m in (1, 16, 20, 40, 64):
        cfgs = stream_k(m)
        assert 0 < len(cfgs) <= 16 and {c.block_m for c in cfgs} == {max(16, 1 << (m - 1).bit_length())}
        assert {c.stream_k for c in cfgs} == set(G.STREAM_K_PROGRAMS) and not any(c.tma for c in cfgs)
        assert all(c.stages * (c.block_m + c.block_n) * c.block_k * 2 <= G.SMEM_BYTES for c in cfgs)
    assert G.Config(16, 64, 128, 1, 4, 6) == G.Config(16, 64, 128, 1, 4, 6, False, 0)  # old tuples still work


def test_fused_norm_gemms_reject_what_they_cannot_run():
    """One 16-row block of the pointer kernel, x as wide as W (twice when gated), a contiguous residual of [M, N]:
    anything else is a ValueError before any launch."""
    pytest.importorskip("triton")
    from tabletune.engine import gemm as G

    w, cfg = torch.randn(32, 64), G.Config(16, 32, 64, 1, 4, 4)
    norm = G.RowNorm(G.RowSquares(torch.ones(16), 1), 1e-6)
    for bad in (G.Config(32, 32, 64, 1, 4, 4), G.Config(16, 32, 64, 1, 4, 4, True),
                G.Config(16, 32, 64, 1, 4, 4, False, 132)):
        with pytest.raises(ValueError, match="pointer config of 16 rows"):
            G.norm_linear(torch.randn(4, 64), w, bad, norm)
    with pytest.raises(ValueError, match="at most 16 rows"):
        G.norm_linear(torch.randn(17, 64), w, cfg, norm)
    with pytest.raises(ValueError, match="even row count"):
        G.norm_linear(torch.randn(4, 64), torch.randn(33, 64), cfg, norm, silu=True)
    with pytest.raises(ValueError, match="kind"):
        G.choose_fused(4, w, "gated")
    with pytest.raises(ValueError, match="gated=True"):
        G.residual_linear(torch.randn(4, 64), w, cfg, torch.zeros(4, 32), gated=True)
    with pytest.raises(ValueError, match="residual"):
        G.residual_linear(torch.randn(4, 64), w, cfg, torch.zeros(4, 64).t())
    # the wgmma kernel's fused epilogues: split-K configs only, no gated variant, one 16-token tile
    from tabletune.engine.gemm_wgmma import WgmmaConfig

    with pytest.raises(ValueError, match="split-K wgmma config"):
        G.norm_linear(torch.randn(4, 64), w, WgmmaConfig(64, 64, 1, 8, 4, 132), norm)
    with pytest.raises(ValueError, match="split-K wgmma config"):
        G.norm_linear(torch.randn(65, 64), w, WgmmaConfig(64, 64, 1, 8, 4), norm)
    with pytest.raises(ValueError, match="split-K wgmma config"):
        G.residual_linear(torch.randn(4, 128), w, WgmmaConfig(64, 64, 1, 8, 4), torch.zeros(4, 32), gated=True)
    assert G._fused_config(WgmmaConfig(64, 64, 2, 8, 4)) == WgmmaConfig(64, 64, 2, 8, 4)  # not read as a Config
    assert isinstance(G._fused_config((16, 32, 64, 1, 4, 4)), G.Config)


def test_fused_configs_take_the_fastest_plain_pointer_configs_of_16_rows():
    """choose_fused's candidates: the 4 fastest 16-row pointer configs of the plain timing (not cuBLAS, padded,
    cuBLASLt, TMA, stream-K or other row blocks), fastest first; norm-silu adds each at half width and drops what
    two weight tiles a stage push past shared memory."""
    pytest.importorskip("triton")
    from tabletune.engine import gemm as G

    c = G.Config
    timed = {None: 1.0, 64: 1.0, G.CUBLASLT: 1.0, c(64, 128, 64, 1, 4, 6, True): 1.0,
             c(16, 64, 256, 1, 4, 4, False, 132): 1.0, c(32, 64, 256, 2, 4, 4): 1.0,
             c(16, 64, 256, 2, 4, 4): 9.0, c(16, 32, 128, 1, 4, 6): 5.0, c(16, 64, 128, 3, 4, 6): 7.0,
             c(16, 32, 256, 4, 4, 4): 6.0, c(16, 64, 256, 8, 4, 4): 8.0}
    fastest = [c(16, 32, 128, 1, 4, 6), c(16, 32, 256, 4, 4, 4), c(16, 64, 128, 3, 4, 6), c(16, 64, 256, 8, 4, 4)]
    assert G.fused_configs(timed, "norm") == fastest
    assert G.fused_configs(timed, "resid") == fastest
    # two weight tiles a stage: (16, 64, 128, 3, 4, 6) needs 6 * (16 + 128) * 128 * 2 = 216 KB and (16, 64, 256, 8,
    # 4, 4) 288 KB, over the 200 KB budget; each at half width fits
    assert G.fused_configs(timed, "norm-silu") == fastest[:2] + [
        c(16, 16, 128, 1, 4, 6), c(16, 16, 256, 4, 4, 4), c(16, 32, 128, 3, 4, 6), c(16, 32, 256, 8, 4, 4)]


def test_layer_gemm_shapes_are_the_decoder_layers_weights():
    """ModelConfig.layer_gemm_shapes (what the GEMM benchmarks time) against the weights a DecoderLayer holds: the
    tiny preset, and the 8B preset's head layout (grouped KV heads) at a small width."""
    from tabletune.engine.model import DecoderLayer
    from tabletune.engine.presets import PRESETS, replace

    small_8b = replace(PRESETS["qwen3-8b"], hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2,
                       head_dim=16)
    for cfg in (PRESETS["tiny"], small_8b):
        layer = DecoderLayer(cfg, torch.float32, "cpu")
        assert cfg.layer_gemm_shapes() == {"qkv": tuple(layer.wqkv.shape), "o": tuple(layer.wo.shape),
                                           "gate_up": tuple(layer.w_gate_up.shape), "down": tuple(layer.w_down.shape)}


def test_in_step_attention_choice_keeps_the_fastest_graph_and_restores_the_inputs(tiny, monkeypatch):
    """``SpecEngine._choose_attention_in_step`` on the CPU, with stand-ins for the GPU: capture_step returns a graph
    whose replay costs what its forced tile costs, CUDA events read that clock. The fastest candidate's graph is
    kept and its tile recorded (so later captures of the step use it); every candidate is timed from the same rows
    at the longest context; the step's host inputs are back as they were. Fails if the slowest is kept or if the
    choice is not recorded."""
    from tabletune.engine import kernels

    target, _, _ = tiny
    engine = _engine(target, "ngram")
    hkv = target.cfg.num_kv_heads
    sms = hkv + 1  # b = 4 has fewer (sequence, KV head) pairs than STEP_CHOICE_WAVES x SMs: there are candidates
    cands = kernels.step_attn_candidates(4, hkv, sms)
    assert cands[0] is None and len(cands) >= 2
    assert kernels.step_attn_candidates(kernels.STEP_CHOICE_WAVES * sms // hkv + 1, hkv, sms) == []
    cost = {c: 3.0 + i for i, c in enumerate(cands)}
    cost[cands[-1]] = 1.0  # the last candidate is the fastest
    clock, seen = [0.0], []

    class Graph:
        def __init__(self, force):
            self.force = force

        def replay(self):
            seen.append((self.force, int(engine.cached[0]), engine.buffers[4].host[0].tolist()))
            clock[0] += cost[self.force]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(multi_processor_count=sms))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    def capture_step(b, k, pool=None, upload=True, stream=None):
        engine._step_body(engine.buffers[b], k)  # the real warm-up step, from the state the choice left
        return Graph(engine.attn_step_force[(b, k)])

    monkeypatch.setattr(engine, "capture_step", capture_step)
    host, cached = engine.buffers[4].host.clone(), engine.cached.clone()
    g = engine._choose_attention_in_step(4, 2, None, None, reps=3)
    assert torch.equal(engine.cached, cached)
    engine._choose_attention_in_step(4, engine.k_max, None, None, reps=1)  # its warm-ups start from a sane state
    assert g.force == cands[-1] and engine.attn_step_force[(4, 2)] == cands[-1]
    assert engine.attn_step_ms[(4, 2)] == {c: cost[c] for c in cands}
    assert len(seen) == 4 * len(cands)
    context = engine.cfg.max_len - engine.k_max - 3
    assert {s[1] for s in seen} == {context} and all(s[2][:4] == [0, 1, 2, 3] for s in seen)
    assert torch.equal(engine.buffers[4].host, host)
