"""Roofline floors of a step in benchmarks/engine_roofline.py (hand-worked cases)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from engine_roofline import Ceilings, serial_floor_ms, step_floor_ms  # noqa: E402

from tabletune.engine.presets import resolve  # noqa: E402

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


def test_floor_hand_worked_at_b1_k0():
    """b=1, k=0, context 1024: memory-bound, floor = (W + KV) / bandwidth, W = layers + LM head in bf16."""
    cfg = resolve("qwen3-8b")
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    w = (cfg.num_layers * (h * d * (32 + 16) + 32 * d * h + 3 * h * i) + cfg.vocab_size * h) * 2
    kv = 1 * (1024 + 1) * cfg.num_layers * 2 * 8 * d * 2
    assert step_floor_ms(cfg, 1, 0, 1024, CEIL) == pytest.approx((w + kv) / 4000e6, rel=1e-12)
