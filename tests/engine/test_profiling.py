"""Roofline floors of a step (hand-worked cases) and the attention split rule."""

import types

import pytest

pytest.importorskip("torch")

from tabletune.engine.presets import resolve  # noqa: E402
from tabletune.engine.profiling import (Ceilings, best_kernel_serial_ms, done_line, gemm_floor_us,  # noqa: E402
                                        serial_floor_ms, serial_headroom, step_floor_ms)

CEIL = Ceilings(bandwidth_gb_s=4000.0, matrix_tflop_s=800.0)


def test_serial_floor_equals_floor_when_both_phases_are_memory_bound():
    """b=1, k=0: the GEMMs stream W and attention streams KV, both far under the FLOP rate, so
    serial = W/BW + KV/BW = (W + KV)/BW = floor."""
    cfg = resolve("qwen3-8b")
    assert serial_floor_ms(cfg, 1, 0, 1024, CEIL) == pytest.approx(step_floor_ms(cfg, 1, 0, 1024, CEIL), rel=1e-12)


@pytest.mark.parametrize("b,k", [(1, 7), (32, 6), (128, 2), (256, 7)])
def test_serial_floor_between_floor_and_twice_floor(b, k):
    """max(a, b) + max(c, d) lies in [max(a + c, b + d), 2 max(a + c, b + d)]."""
    cfg = resolve("qwen3-8b")
    floor, serial = step_floor_ms(cfg, b, k, 1024, CEIL), serial_floor_ms(cfg, b, k, 1024, CEIL)
    assert floor * (1 - 1e-12) <= serial <= 2 * floor


def test_serial_floor_exceeds_floor_where_gemms_are_flop_bound():
    """b=128, k=2 (384 tokens): GEMMs FLOP-bound, attention KV-bound, so the two phases cannot share a ceiling."""
    cfg = resolve("qwen3-8b")
    assert serial_floor_ms(cfg, 128, 2, 1024, CEIL) > 1.3 * step_floor_ms(cfg, 128, 2, 1024, CEIL)


@pytest.mark.parametrize("b,splits", [(1, 8), (2, 8), (8, 3), (16, 2), (32, 1), (256, 1)])
def test_attention_splits_cover_the_sms_once(b, splits):
    pytest.importorskip("triton")
    from tabletune.engine.kernels import num_splits_for

    assert num_splits_for(b, 8, num_sms=132) == splits  # ceil(132 / (8 b)), 1 .. 8


@pytest.mark.parametrize("b,splits", [(1, 8), (2, 8), (4, 4), (8, 2), (16, 1), (32, 1), (256, 1)])
def test_wave_splits_fill_at_most_one_wave(b, splits):
    pytest.importorskip("triton")
    from tabletune.engine.kernels import wave_splits

    assert wave_splits(b, 8, num_sms=132) == splits  # floor(132 / (8 b)), 1 .. 8
    assert b * 8 * splits <= 132 or splits == 1


def test_attention_candidates_and_the_cpu_config():
    """The chooser times the wave-split config with each tile, then the old default; off CUDA (the interpreter)
    a launch runs the old default, a given ``cfg`` or ``num_splits`` overrides it."""
    pytest.importorskip("triton")
    import torch

    from tabletune.engine import kernels

    cands = kernels.attn_candidates(4, 8, 132)
    assert cands[0] == kernels.AttnConfig(4, 64, 4, 3)
    assert [c[1:] for c in cands[:len(kernels.ATTN_TILES)]] == list(kernels.ATTN_TILES)
    assert cands[-1] == kernels.default_attn_config(4, 8) == kernels.AttnConfig(5, 64, 4, 3)
    assert len(set(cands)) == len(cands)
    assert len(kernels.attn_candidates(32, 8, 132)) == len(kernels.ATTN_TILES)  # the default is one of them
    q, cache = torch.zeros(1), torch.zeros(4, 8, 16, 4)
    assert kernels._attn_config("attn", q, 4, 1, 32, 8, 128, cache, None, None) == kernels.default_attn_config(4, 8)
    assert kernels._attn_config("attn", q, 4, 1, 32, 8, 128, cache, 2, None).splits == 2
    assert kernels._attn_config("rope", q, 4, 1, 32, 8, 128, cache, 2, (1, 32, 8, 2)) == kernels.AttnConfig(1, 32, 8, 2)


def test_kv_hints_are_cuda_only_and_checked(monkeypatch):
    """The attention launches pass the KV L2 hints (``attn_prefetch_wait`` / ``_ahead``) only on CUDA (Triton's
    interpreter runs no inline PTX), and a tile count the kernels cannot take is an error that names it, on any
    device."""
    pytest.importorskip("triton")
    import torch

    from tabletune.engine import kernels

    q, cache = torch.zeros(1), torch.zeros(4, 8, 16, 128, dtype=torch.bfloat16)
    assert kernels._prefetch_args(q, cache) == {}
    monkeypatch.setattr(kernels, "attn_prefetch_wait", 2)
    assert kernels._prefetch_args(q, cache) == {}  # CPU: off
    on_cuda = types.SimpleNamespace(is_cuda=True)
    assert kernels._prefetch_args(on_cuda, cache) == {"PF_WAIT": 2, "PF_AHEAD": 0, "LINE": 64}  # bf16: 64 a line
    assert kernels._prefetch_args(on_cuda, cache.float())["LINE"] == 32
    monkeypatch.setattr(kernels, "attn_prefetch_ahead", 3)
    with pytest.raises(ValueError, match="attn_prefetch_ahead = 3"):
        kernels._prefetch_args(q, cache)


def test_forced_attention_tile_overrides_the_default_but_not_a_given_config(monkeypatch):
    pytest.importorskip("triton")
    import torch

    from tabletune.engine import kernels

    q, cache = torch.zeros(1), torch.zeros(4, 8, 16, 4)
    monkeypatch.setattr(kernels, "attn_force", (128, 8, 3, None))
    assert kernels._attn_config("attn", q, 4, 1, 32, 8, 128, cache, None, None) == kernels.AttnConfig(4, 128, 8, 3)
    monkeypatch.setattr(kernels, "attn_force", (64, 4, 4, 2))
    assert kernels._attn_config("rope", q, 16, 1, 32, 8, 128, cache, None, None) == kernels.AttnConfig(2, 64, 4, 4)
    assert kernels._attn_config("rope", q, 16, 1, 32, 8, 128, cache, 3, None) == kernels.AttnConfig(3)
    assert kernels._attn_config("rope", q, 16, 1, 32, 8, 128, cache, None, (1, 32, 8, 2)) == (1, 32, 8, 2)


def test_in_step_attention_candidates_on_the_h200_shape():
    """8 KV heads on 132 SMs: b <= 64 gets the start-up config (None) and the two step tiles at wave_splits;
    from b = 128 on (within 1% whatever the config) nothing is timed in the step."""
    pytest.importorskip("triton")
    from tabletune.engine import kernels

    assert kernels.step_attn_candidates(1, 8, 132) == [None, (128, 8, 3, 8), (64, 4, 4, 8)]
    assert kernels.step_attn_candidates(16, 8, 132) == [None, (128, 8, 3, 1), (64, 4, 4, 1)]
    assert kernels.step_attn_candidates(64, 8, 132) == [None, (128, 8, 3, 1), (64, 4, 4, 1)]
    assert kernels.step_attn_candidates(128, 8, 132) == []


def test_serial_headroom():
    """b=1, k=0: serial == floor, so the headroom is the line itself (1.3). b=256, k=2 (768 tokens): the serial
    floor alone is over 1.5x the floor, so no engine that serialises attention and GEMMs meets the line there."""
    cfg = resolve("qwen3-8b")
    assert done_line(32) == 1.3 and done_line(33) == 1.5
    assert serial_headroom(cfg, 1, 0, 1024, CEIL) == pytest.approx(1.3, rel=1e-12)
    h = serial_headroom(cfg, 256, 2, 1024, CEIL)
    assert h == pytest.approx(1.5 * step_floor_ms(cfg, 256, 2, 1024, CEIL) / serial_floor_ms(cfg, 256, 2, 1024, CEIL))
    assert h < 1.0
    assert serial_headroom(cfg, 256, 2, 1024, CEIL, line=2.0) > 1.0


def test_best_kernel_serial_bound_hand_worked():
    """qwen3-8b, b=2, k=1 (M = 4 rows), every layer GEMM 10 us and the LM head 100 us: 36 x 4 x 10 + 100 = 1540 us
    of GEMMs. Attention at its floor: KV = 2 x (1024 + 2) tokens x 147456 bytes (36 layers x K and V x 8 heads x
    128 x 2 bytes) = 302,579,712 bytes at 4000 GB/s = 0.075644928 ms, over its FLOPs
    4 x 4 x 1026 x 32 x 128 x 36 = 2.42e9 at 800 TFLOP/s = 0.003 ms. Bound = 1.54 + 0.075644928 ms."""
    cfg = resolve("qwen3-8b")
    asked = []

    def gemm_us(name: str, m: int) -> float:
        asked.append((name, m))
        return 100.0 if name == "lm_head" else 10.0
    bound = best_kernel_serial_ms(cfg, 2, 1, 1024, CEIL, gemm_us)
    assert bound == pytest.approx(1.54 + 302_579_712 / 4000 / 1e6, rel=1e-12)
    assert sorted(asked) == sorted([("qkv", 4), ("o", 4), ("gate_up", 4), ("down", 4), ("lm_head", 4)])
    # never under the serial floor when each GEMM is at its own floor (W bytes or FLOPs, whichever is slower)
    shapes = cfg.step_gemm_shapes()
    assert shapes["lm_head"] == (151936, 4096) and shapes["gate_up"] == (2 * 12288, 4096)
    at_floor = lambda name, m: gemm_floor_us(*shapes[name], m, CEIL)  # noqa: E731
    assert gemm_floor_us(4096, 4096, 1, CEIL) == pytest.approx(2 * 4096 * 4096 / 4000 / 1e3)  # W bytes at 4 TB/s
    assert gemm_floor_us(4096, 4096, 8192, CEIL) == pytest.approx(2 * 8192 * 4096 * 4096 / 800 / 1e6)  # FLOPs
    for b, k in [(1, 0), (32, 6), (256, 2)]:
        assert best_kernel_serial_ms(cfg, b, k, 1024, CEIL, at_floor) >= serial_floor_ms(cfg, b, k, 1024, CEIL) * (
            1 - 1e-9)
    with pytest.raises(ValueError, match="dense"):
        best_kernel_serial_ms(resolve("qwen3-30b-a3b"), 1, 0, 1024, CEIL, gemm_us)
