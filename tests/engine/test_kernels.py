"""The kernels' host-side rules: the attention config, the split-K configs, the GEMM chooser's candidates and
padded rows, and the config objects' checks."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tabletune.engine.config import EngineConfig  # noqa: E402
from tabletune.engine.kernels import gemm as G  # noqa: E402
from tabletune.engine.kernels.attention import AttnConfig, attn_config  # noqa: E402
from tabletune.engine.kernels.common import empty_rows  # noqa: E402


@pytest.mark.parametrize("b,splits", [(1, 8), (2, 8), (4, 4), (8, 2), (16, 1)])
def test_small_batches_split_the_keys_to_fill_at_most_one_wave(b, splits):
    """8 KV heads on 132 SMs: 132 // (8 b) splits, at most 8, 128-key tiles of 8 warps."""
    assert attn_config(b, 8, 132) == AttnConfig(splits, 128, 8, 3)
    assert b * 8 * splits <= 132


def test_large_batches_take_one_split_and_64_key_tiles():
    assert attn_config(17, 8, 132) == AttnConfig(1, 64, 4, 4)
    assert attn_config(128, 8, 132) == AttnConfig(1, 64, 4, 3)  # from four waves of pairs on: 3 stages


@pytest.mark.parametrize("m,bm", [(1, 16), (16, 16), (17, 32), (64, 64), (128, 64)])
def test_split_k_configs_take_one_row_block_of_next_pow2_rows(m, bm):
    plain, gated = G.configs(m, False), G.configs(m, True)
    assert {c.block_m for c in plain + gated} == {bm}
    assert {c.split for c in plain} == {1, 2, 4, 8} and len(gated) == 4
    assert all(c.stages * (c.block_m + c.block_n) * c.block_k * 2 <= G.SMEM_BYTES for c in plain + gated)


def test_chooser_candidates():
    """Plain: cuBLAS at M, on M rounded up to 64 and 128 rows, cuBLASLt, then split-K up to 128 rows; gated: the
    unfused path and the gated split-K configs; split-K off: cuBLAS only."""
    chooser = G.GemmChooser(torch.zeros(4, dtype=torch.int32), pdl=False)
    assert chooser.candidates(200, False) == [G.CUBLAS, 256, G.CUBLASLT]
    assert chooser.candidates(64, False)[:3] == [G.CUBLAS, 128, G.CUBLASLT]
    assert chooser.candidates(64, False)[3:] == G.configs(64, False)
    assert chooser.candidates(8, True) == [G.UNFUSED, *G.configs(8, True)]
    assert G.GemmChooser(torch.zeros(4), pdl=False, split_k=False).candidates(8, False) == [G.CUBLAS, 64, 128,
                                                                                            G.CUBLASLT]


def test_padded_rows_see_the_storage_of_an_empty_rows_tensor():
    x = empty_rows(5, 8, torch.float32, "cpu")
    assert G.padded_rows(x, 64).shape == (64, 8) and G.padded_rows(x, 64).data_ptr() == x.data_ptr()
    assert G.padded_rows(torch.empty(5, 8), 64) is None  # no storage past row 5
    w = torch.randn(3, 8)
    assert torch.equal(G.cublas_linear(x.normal_(), w, 128), x @ w.t())


@pytest.mark.parametrize("changes", [{"max_num_seqs": 0}, {"k_max": -1}, {"max_len": 8, "k_max": 7},
                                     {"ks": (0, 8), "k_max": 7}, {"temperature": -0.5}])
def test_engine_config_rejects_bad_values(changes):
    with pytest.raises(ValueError):
        EngineConfig(**changes)


INTERPRETED = """
import torch
from tabletune.engine import ops as O
from tabletune.engine.config import KernelConfig
from tabletune.engine.kernels import gemm as G
from tabletune.engine.kernels.attention import AttnConfig
from tabletune.engine.kernels.triton_ops import TritonOps
from tabletune.engine.model import Decoder
from tabletune.engine.presets import PRESETS
torch.manual_seed(0)
T = TritonOps(torch.device("cpu"), KernelConfig(use_triton=True))
B, q, H, Hkv, D, S, L = 3, 3, 4, 2, 16, 5, 140
qkv = torch.randn(B, q, (H + 2 * Hkv) * D)
start = torch.tensor([5, 0, 126]); slots = torch.tensor([2, 0, 4])  # keys 126..128 straddle a 2-split boundary
kc0, vc0 = torch.randn(S, Hkv, L, D), torch.randn(S, Hkv, L, D)
qn, kn = torch.rand(D) + 0.5, torch.rand(D) + 0.5
err = []
for norm in ((qn, kn), (None, None)):
    kca, vca, kcb, vcb = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    qa = O.qk_rope_cache_write(qkv, start, slots, kca, vca, *norm, H, Hkv, D, 1e4, 1e-6)
    qb = T.qk_rope_cache_write(qkv, start, slots, kcb, vcb, *norm, H, Hkv, D, 1e4, 1e-6)
    err += [(qa - qb).abs().max(), (kca - kcb).abs().max(), (vca - vcb).abs().max()]
    for cfg in (AttnConfig(1, 64, 4, 1), AttnConfig(2, 64, 4, 1), AttnConfig(3, 32, 4, 1), AttnConfig(16, 16, 4, 1)):
        err.append((O.attention(qa, kca, vca, start, slots, D ** -0.5)
                    - T.attention(qa, kca, vca, start, slots, D ** -0.5, cfg=cfg)).abs().max())  # 16: empty splits
        kca, vca, kcb, vcb = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
        oa = O.rope_attention(qkv, start, slots, kca, vca, *norm, H, Hkv, D, 1e4, 1e-6, D ** -0.5)
        ob = T.rope_attention(qkv, start, slots, kcb, vcb, *norm, H, Hkv, D, 1e4, 1e-6, D ** -0.5, cfg=cfg)
        err += [(oa - ob).abs().max(), (kca - kcb).abs().max(), (vca - vcb).abs().max()]
# packed: rows of 1, 3 and 2 tokens (q_max 3) on one token axis of 6; Triton writes only each row's own new keys
ql = torch.tensor([1, 3, 2]); qo = torch.cumsum(ql, 0) - ql
flat = torch.cat([b * 3 + torch.arange(int(n)) for b, n in enumerate(ql)])
pk = O.Packed(qo, ql, flat, 3)
qkv_p = torch.randn(6, (H + 2 * Hkv) * D)
for cfg in (AttnConfig(1, 64, 4, 1), AttnConfig(2, 64, 4, 1)):
    kca, vca, kcb, vcb = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    oa = O.rope_attention(qkv_p, start, slots, kca, vca, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5, packed=pk)
    ob = T.rope_attention(qkv_p, start, slots, kcb, vcb, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5, cfg=cfg, packed=pk)
    assert oa.shape == ob.shape == (6, H, D)
    err.append((oa - ob).abs().max())
    for b in range(3):
        s0, s1 = int(start[b]), int(start[b] + ql[b])
        err += [(kca[slots[b], :, :s1] - kcb[slots[b], :, :s1]).abs().max(),
                (vca[slots[b], :, :s1] - vcb[slots[b], :, :s1]).abs().max()]
        assert torch.equal(kcb[slots[b], :, s1:], kc0[slots[b], :, s1:])
    # row 1's tokens equal a dense step of that row alone
    kd, vd = kc0.clone(), vc0.clone()
    od = O.rope_attention(qkv_p[1:4][None], start[1:2], slots[1:2], kd, vd, qn, kn, H, Hkv, D, 1e4, 1e-6, D ** -0.5)
    err.append((od[0] - ob[1:4]).abs().max())
x, d, w = torch.randn(5, 48), torch.randn(5, 48), torch.rand(48)
err += [(a - b).abs().max() for a, b in zip(O.add_rms_norm(x, d, w, 1e-6), T.add_rms_norm(x, d, w, 1e-6))]
gu = torch.randn(7, 96)
err.append((O.silu_mul(gu) - T.silu_mul(gu)).abs().max())
x, w, gu = torch.randn(20, 300), torch.randn(70, 300), torch.randn(20, 600)
for cfg in (G.SplitK(32, 64, 64, 1, 4, 1), G.SplitK(16, 32, 64, 3, 4, 1), G.SplitK(16, 32, 32, 8, 4, 1)):
    err.append((G.split_k_linear(x, w, cfg, T.counters, False) - x @ w.T).abs().max())
    err.append((G.split_k_linear(gu, w, cfg, T.counters, False, gated=True) - O.silu_mul(gu) @ w.T).abs().max())
assert max(float(e) for e in err) < 1e-3, err
assert int(T.counters.abs().sum()) == 0  # the last program of each tile reset its ticket
m = Decoder(PRESETS["tiny"], torch.float32, "cpu", ops=O.TorchOps())
cache_a, cache_b = m.new_cache(2, 32), m.new_cache(2, 32)
tokens, pos, sl = torch.randint(0, 97, (2, 4)), torch.tensor([3, 9]), torch.tensor([1, 0])
ha = m(tokens, pos, sl, cache_a)
m.ops = T
hb = m(tokens, pos, sl, cache_b)
assert (ha - hb).abs().max() < 1e-4 and (cache_a.k - cache_b.k).abs().max() < 1e-4
# a ragged step is padded to the longest row: row 0 with k_0 = 1 (tokens 0..1 real), row 1 with k_1 = 2; other
# padding tokens change nothing at the real positions (causal attention, new keys written before they are read)
t2 = tokens.clone()
t2[0, 2:], t2[1, 3:] = (t2[0, 2:] + 5) % 97, (t2[1, 3:] + 7) % 97
hc = m(t2, pos, sl, m.new_cache(2, 32))
assert (hc[0, :2] - hb[0, :2]).abs().max() < 1e-4 and (hc[1, :3] - hb[1, :3]).abs().max() < 1e-4
assert (hc[0, 2:] - hb[0, 2:]).abs().max() > 1e-3
print("ok")
"""


def test_triton_kernels_match_torch_ops_in_interpreter():
    """RoPE + cache write, split-KV attention (1, 2, 3 and 16 splits, new keys across a split boundary), the two
    fused (also on a packed token axis of rows of 1, 2, 3 tokens), the norms, the split-K GEMM (1, 3, 8 splits,
    plain and gated) and a whole forward, under TRITON_INTERPRET=1, against the PyTorch ops; every ticket counter
    back at zero."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_only_cublas_choices_are_charged_for_breaking_the_pdl_chain():
    """A gated shape's unfused path breaks the chain when its plain shape runs cuBLAS, not when it runs split-K."""
    chooser = G.GemmChooser(torch.zeros(4, dtype=torch.int32), pdl=True)
    split_k = G.configs(8, False)[0]
    assert chooser._breaks_pdl((8, 64, 32, False), G.CUBLAS) and chooser._breaks_pdl((8, 64, 32, False), 64)
    assert not chooser._breaks_pdl((8, 64, 32, False), split_k)
    chooser.choices[(8, 64, 32, False)] = split_k
    assert not chooser._breaks_pdl((8, 64, 32, True), G.UNFUSED)
    chooser.choices[(8, 64, 32, False)] = G.CUBLASLT
    assert chooser._breaks_pdl((8, 64, 32, True), G.UNFUSED)
