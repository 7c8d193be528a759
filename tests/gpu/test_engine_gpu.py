"""GPU correctness of the engine: the Triton kernels against the PyTorch ops on the 8B shape, the GEMM chooser,
and greedy outputs with speculation (CUDA graphs) identical to those without. Skipped without CUDA."""

import random

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tabletune.engine import ops as O  # noqa: E402
from tabletune.engine.config import EngineConfig, KernelConfig  # noqa: E402
from tabletune.engine.drafters import make_drafter  # noqa: E402
from tabletune.engine.kernels import gemm as G  # noqa: E402
from tabletune.engine.model import Decoder, moe_mlp, select_ops  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, no_hook  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402

CFG = PRESETS["qwen3-8b"]


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def triton_ops():
    return select_ops(torch.device("cuda"), KernelConfig())


@pytest.mark.parametrize("b,q", [(1, 1), (8, 4), (32, 1), (128, 8)])
def test_attention_kernels_match_torch_on_the_8b_shape(triton_ops, b, q):
    torch.manual_seed(0)
    h, hkv, d = CFG.num_heads, CFG.num_kv_heads, CFG.head_dim
    qkv = torch.randn(b, q, (h + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b + 1, hkv, 1100, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    start = torch.randint(900, 1024, (b,), device="cuda")
    slots = torch.randperm(b, device="cuda")
    norm = torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5
    args = (norm, norm, h, hkv, d, CFG.rope_theta, CFG.rms_norm_eps)
    kc_t, vc_t = kc.clone(), vc.clone()
    ref = O.rope_attention(qkv, start, slots, kc, vc, *args, d ** -0.5)
    assert rel(triton_ops.rope_attention(qkv, start, slots, kc_t, vc_t, *args, d ** -0.5), ref) < 2e-2
    assert rel(kc_t, kc) < 1e-2 and torch.equal(vc_t, vc)
    q_ref = O.qk_rope_cache_write(qkv, start, slots, kc, vc, *args)
    q_t = triton_ops.qk_rope_cache_write(qkv, start, slots, kc_t, vc_t, *args)
    assert rel(q_t, q_ref) < 1e-2
    out = triton_ops.attention(q_ref, kc, vc, start, slots, d ** -0.5)
    assert rel(out, O.attention(q_ref, kc, vc, start, slots, d ** -0.5)) < 2e-2
    assert int(triton_ops.counters.abs().sum()) == 0  # every ticket counter back at zero


@pytest.mark.parametrize("b", [8, 128])
def test_packed_rope_attention_matches_torch_on_the_8b_shape(triton_ops, b):
    """Rows of 1 .. 8 tokens on one packed token axis (q_max 8): outputs, and the cache at each row's own new keys."""
    torch.manual_seed(0)
    h, hkv, d = CFG.num_heads, CFG.num_kv_heads, CFG.head_dim
    qlen = torch.randint(1, 9, (b,), device="cuda")
    qlen[0] = 8
    qoff = torch.cumsum(qlen, 0) - qlen
    flat = torch.cat([i * 8 + torch.arange(int(n), device="cuda") for i, n in enumerate(qlen.tolist())])
    packed = O.Packed(qoff, qlen, flat, 8)
    qkv = torch.randn(int(qlen.sum()), (h + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b + 1, hkv, 1100, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    start = torch.randint(900, 1024, (b,), device="cuda")
    slots = torch.randperm(b, device="cuda")
    norm = torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5
    args = (norm, norm, h, hkv, d, CFG.rope_theta, CFG.rms_norm_eps, d ** -0.5)
    kc_t, vc_t = kc.clone(), vc.clone()
    ref = O.rope_attention(qkv, start, slots, kc, vc, *args, packed=packed)
    assert rel(triton_ops.rope_attention(qkv, start, slots, kc_t, vc_t, *args, packed=packed), ref) < 2e-2
    for i in range(b):
        s0, s1 = int(start[i]), int(start[i] + qlen[i])
        assert rel(kc_t[slots[i], :, s0:s1], kc[slots[i], :, s0:s1]) < 1e-2
        assert torch.equal(vc_t[slots[i], :, s0:s1], vc[slots[i], :, s0:s1])
    assert int(triton_ops.counters.abs().sum()) == 0


@pytest.mark.parametrize("m", [1, 8, 32, 128])
@pytest.mark.parametrize("gated", [False, True])
def test_split_k_gemm_and_the_chooser_match_torch(triton_ops, m, gated):
    torch.manual_seed(0)
    n, k = CFG.hidden_size, CFG.intermediate_size
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
    ref = O.linear(x, w, gated)
    for cfg in G.configs(m, gated)[:4]:
        y = G.split_k_linear(x, w, cfg, triton_ops.counters, triton_ops.pdl, gated)
        assert rel(y, ref) < 2e-2, cfg
        assert torch.equal(y, G.split_k_linear(x, w, cfg, triton_ops.counters, triton_ops.pdl, gated))
    assert rel(triton_ops.linear(x, w, gated), ref) < 2e-2
    assert (m, n, k, gated) in triton_ops.gemm.choices
    assert int(triton_ops.counters.abs().sum()) == 0


def test_moe_grouped_gemm_matches_the_expert_loop():
    torch.manual_seed(0)
    cfg = PRESETS["tiny-moe"]
    layer = Decoder(cfg, torch.float32, "cuda").layers[0]
    x = torch.randn(3, 5, cfg.hidden_size, device="cuda")
    got = moe_mlp(O.TorchOps(), x, layer.router, layer.w_gate_up, layer.w_down, cfg.num_experts_per_tok)
    ref = moe_mlp(O.TorchOps(), x.cpu(), layer.router.cpu(), layer.w_gate_up.cpu(), layer.w_down.cpu(),
                  cfg.num_experts_per_tok)
    assert rel(got.cpu(), ref) < 1e-4


def _serve(target, drafter: str, table: DraftTable, prompts, prefill_graphs: int = 512):
    d = make_drafter(drafter, target, 5, draft_cfg=PRESETS["tiny"])
    e = SpecEngine(target, d, EngineConfig(max_num_seqs=8, max_len=96, k_max=5, prefill_graph_max_len=prefill_graphs))
    reqs = [Request(list(p), 40, i) for i, p in enumerate(prompts)]
    stats = Scheduler(e, table).run(reqs)
    torch.cuda.synchronize()
    return [r.output for r in reqs], stats, len(e.graphs)


@pytest.mark.parametrize("drafter", ["ngram", "eagle", "draft_model", "parallel_block"])
def test_greedy_outputs_with_speculation_and_graphs_equal_those_without(drafter):
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    target = Decoder(cfg, torch.float32, "cuda")
    rng = random.Random(0)
    # three prompt lengths, so that the prefill graphs (captured after a length's second prompt) replay too
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.choice((3, 11, 29)))] for _ in range(12)]
    base, _, _ = _serve(target, "ngram", DraftTable.fixed(0), prompts, prefill_graphs=0)
    out, stats, num_graphs = _serve(target, drafter, DraftTable.from_ranges([[1, 2, 5], [3, 4, 2], [5, 8, 3]]),
                                    prompts)
    assert num_graphs > 0 and sum(stats.counts.drafted) > 0
    assert out == base


@pytest.mark.parametrize("drafter", ["ngram", "eagle"])
def test_ragged_and_split_steps_from_graphs_equal_greedy_without_speculation(drafter):
    """Random per-request k (fused graphs, packed verification), a stop rule and DISCO on the draft-position and
    verify graphs: the outputs of k = 0."""
    import numpy as np

    from tabletune.engine.scheduler import policy_context
    from tabletune.policies import make_policy
    from tabletune.policies.base import Decision

    class RandomKs:
        name, uses_features = "random-ks", False

        def __init__(self):
            self.rng = np.random.default_rng(0)

        def decide(self, state):
            return Decision.per_request(self.rng.integers(0, 6, state.batch_size))

        def observe(self, outcome):
            pass

    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    target = Decoder(cfg, torch.float32, "cuda")
    rng = random.Random(1)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.choice((3, 11)))] for _ in range(10)]
    base, _, _ = _serve(target, "ngram", DraftTable.fixed(0), prompts, prefill_graphs=0)
    e = SpecEngine(target, make_drafter(drafter, target, 5, draft_cfg=cfg),
                   EngineConfig(max_num_seqs=8, max_len=96, k_max=5, split_steps=True))
    from tabletune.engine.runner import token_js

    assert set(e.graphs) == ({(p, b, k, j) for p in ("step", "verify") for b in e.buckets for k in range(6)
                              for j in token_js(b, k)} | {("first", b, k) for b in e.buckets for k in range(1, 6)}
                             | {("next", b, j) for b in e.buckets for j in range(1, 5)})

    class StopAfter(RandomKs):  # k = 5, each row's draft ended after a random position of 1..5 (the draft loop)
        def decide(self, state):
            return Decision.batch(5)

        def keep_drafting(self, state, features, j, active):
            return self.rng.integers(0, 6, state.batch_size) > j

    for policy in (RandomKs(), StopAfter(), make_policy("disco:variant=threshold", policy_context(e))):
        reqs = [Request(list(p), 24, i) for i, p in enumerate(prompts)]
        Scheduler(e, policy).run(reqs)
        torch.cuda.synchronize()
        assert [r.output for r in reqs] == [b[:24] for b in base], policy.name


def test_the_stop_rule_on_the_device_with_events_equals_the_host_rule():
    """``DeviceStop`` on CUDA (pinned flags, event queries that never wait): the host rule's lengths; the loop ends
    no earlier than the longest draft. Then ``controller:per-request`` with its rule on the device, on the graphs of
    the draft loop: the greedy outputs of k = 0."""
    from types import SimpleNamespace

    import numpy as np

    from tabletune.cost import StepCost
    from tabletune.engine.device_stop import DeviceStop
    from tabletune.engine.scheduler import policy_context
    from tabletune.policies import make_policy
    from tabletune.policies.stop_rule import LogitStopRule
    from tabletune.profile import StepPoint, StepProfile

    rng = np.random.default_rng(0)
    k_max, rows = 6, 48
    for trial in range(20):
        sig = torch.rand(rows + 1, k_max, 3, device="cuda")
        top1 = sig[:rows, :, 0].double().cpu().numpy()
        caps = rng.integers(0, k_max + 1, rows)
        rule = LogitStopRule(float(rng.uniform(0, 2)), tuple(rng.normal(0.5, 1.0, k_max)),
                             tuple(np.sort(rng.uniform(-3.0, 0.0, k_max))[::-1]))
        stop = DeviceStop(SimpleNamespace(device=torch.device("cuda"), draft_sig=sig), list(range(rows)), caps, rule)
        j = 0
        while j < caps.max() and not stop.done():
            j += 1
            stop.after_position(j)
        drafted, active, i = np.zeros(rows, np.int64), caps > 0, 0
        while active.any():
            i += 1
            drafted[active] = i
            active &= (drafted < caps) & rule.keep(top1[:, :i], i)
        assert stop.lengths().tolist() == drafted.tolist(), trial
        assert j >= drafted.max(initial=0)

    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    target = Decoder(cfg, torch.float32, "cuda")
    prompts = [[random.Random(i).randrange(cfg.vocab_size) for _ in range(3 + i)] for i in range(8)]
    base, _, _ = _serve(target, "ngram", DraftTable.fixed(0), prompts, prefill_graphs=0)
    e = SpecEngine(target, make_drafter("eagle", target, 5, draft_cfg=cfg),
                   EngineConfig(max_num_seqs=8, max_len=96, k_max=5, split_steps=True))
    cost = StepCost(StepProfile(tuple(StepPoint(b, k, (1.0 + 0.4 * k,)) for b in (1, 8) for k in range(6)),
                                context_len=1))
    policy = make_policy("controller:per-request,stop=1,ngram=0,refit_every=2", policy_context(e, cost))
    reqs = [Request(list(p), 24, i) for i, p in enumerate(prompts)]
    stats = Scheduler(e, policy).run(reqs)
    torch.cuda.synchronize()
    assert [r.output for r in reqs] == [b[:24] for b in base]
    assert sum(stats.step_drafted) > 0


def test_online_updates_in_the_background_while_prefills_are_captured(tmp_path):
    """The online head's worker thread runs backward passes on its side stream while the serving loop captures
    prefill graphs (a prompt length's second prompt): no capture fails, no update fails, outputs stay greedy."""
    from tabletune.drafter.online import OnlineAdapter, OnlineConfig
    from tabletune.engine.presets import replace
    from tabletune.integrations.hf.eagle_head import save_random_head

    cfg = replace(PRESETS["tiny"], name="tiny-llama", qk_norm=False)
    torch.manual_seed(0)
    target = Decoder(cfg, torch.float32, "cuda")
    save_random_head(cfg, tmp_path)
    rng = random.Random(0)
    # many lengths, each seen twice, spread over the stream, and long updates: captures keep coming while the worker
    # is busy
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(n)] for n in list(range(4, 20)) * 2]
    rng.shuffle(prompts)

    def serve(k, online):
        e = SpecEngine(target, make_drafter("eagle", target, max(k, 1), head=str(tmp_path)),
                       EngineConfig(max_num_seqs=4, max_len=96, k_max=max(k, 1)))
        adapter = OnlineAdapter(e, str(tmp_path), OnlineConfig(lr=3e-3, steps=16, background=True)) if online else None
        reqs = [Request(list(p), 24, i) for i, p in enumerate(prompts)]
        Scheduler(e, DraftTable.fixed(k), after_step=adapter.after_step if adapter else no_hook).run(reqs)
        if adapter:
            adapter.close()
        torch.cuda.synchronize()
        return [r.output for r in reqs], e, adapter

    base, _, _ = serve(0, False)
    out, engine, adapter = serve(3, True)
    assert adapter.stats.error is None and adapter.stats.updates > 0
    assert adapter.stats.update_host_s > 0 and adapter.stats.update_gpu_ms > 0  # host and device time apart
    assert len(engine.prefills.graphs) == 16 and engine.prefills.max_len > 0  # every length's capture succeeded
    assert out == base
