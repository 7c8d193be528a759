"""Build an engine from names, time its steps, and the roofline floor of a step.

Roofline floor of one verify step of b sequences with q = k+1 tokens each at
context c:

    bytes(b, k)  = weights read once + KV read = W + b * (c + q) * kv_bytes_per_token
    flops(b, k)  = 2 * P_matmul * b * q + 4 * b * q * (c + q) * H * D * layers
    floor(b, k)  = max(bytes / bandwidth, flops / matrix_rate)

``serial_floor_ms`` is the floor when attention (KV-bound) and the GEMMs
(weight- or FLOP-bound) do not overlap: the sum of the two phases' floors.

W counts every weight a step reads: all layers and the LM head, not the
embedding table (a step gathers b*q of its rows). For MoE only the routed
experts count, at most min(E, b*q*top_k) of them per layer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tabletune.engine.config import EngineConfig, KernelConfig
from tabletune.engine.drafters import make_drafter
from tabletune.engine.model import Decoder, select_ops
from tabletune.engine.presets import ModelConfig, resolve
from tabletune.engine.runner import SpecEngine

ENGINE_VERSION = "0.9.0"  # ragged steps (per-request k as per-row caps), split draft / verify phases, draft signals
RUNNER = "builtin/cudagraph-per-(bucket,k)"


@dataclass(frozen=True)
class Ceilings:
    bandwidth_gb_s: float  # device copy, bytes read + written
    matrix_tflop_s: float  # bf16 8192^3 matmul


def measure_ceilings(device: str = "cuda") -> Ceilings:
    """A 4 GiB device copy and a bf16 8192^3 matmul, median of timed repeats."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.float32, device=device).normal_()
    b = torch.empty_like(a)
    copy_ms = _median_ms(lambda: b.copy_(a), 20)
    del a, b
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    mm_ms = _median_ms(lambda: x @ y, 20)
    return Ceilings(2 * 4 * n / copy_ms / 1e6, 2 * 8192 ** 3 / mm_ms / 1e9)


def _median_ms(fn, reps: int, inner: int = 1) -> float:
    """Median over ``reps`` of the mean time of ``inner`` back-to-back calls (queued, so launches overlap)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    return sorted(times)[len(times) // 2]


def weight_bytes(cfg: ModelConfig, tokens: int, dtype_bytes: int = 2) -> int:
    """Weights one step reads for ``tokens`` tokens: layers + LM head (MoE: routed experts only)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * d * h
    if cfg.is_moe:
        experts = min(cfg.num_experts, tokens * cfg.num_experts_per_tok)
        mlp = experts * 3 * h * cfg.moe_intermediate_size + cfg.num_experts * h
    else:
        mlp = 3 * h * cfg.intermediate_size
    return (cfg.num_layers * (attn + mlp) + cfg.vocab_size * h) * dtype_bytes


def _parts(cfg: ModelConfig, batch_size: int, k: int, context_len: int) -> tuple[float, float, float, float]:
    """(weight bytes, GEMM FLOPs, KV bytes, attention FLOPs) of one step."""
    q = k + 1
    tokens = batch_size * q
    kv = batch_size * (context_len + q) * cfg.kv_bytes_per_token()
    active = cfg.num_params(active_only=True) - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_embeddings else 1)
    attn_flops = 4 * tokens * (context_len + q) * cfg.num_heads * cfg.head_dim * cfg.num_layers
    return weight_bytes(cfg, tokens), 2 * active * tokens, kv, attn_flops


def step_floor_ms(cfg: ModelConfig, batch_size: int, k: int, context_len: int, ceil: Ceilings) -> float:
    w, f_gemm, kv, f_attn = _parts(cfg, batch_size, k, context_len)
    return max((w + kv) / ceil.bandwidth_gb_s / 1e6, (f_gemm + f_attn) / ceil.matrix_tflop_s / 1e9)


def serial_floor_ms(cfg: ModelConfig, batch_size: int, k: int, context_len: int, ceil: Ceilings) -> float:
    """Floor of an engine that runs attention and the GEMMs one after the other (not overlapped):

        serial = max(W / bandwidth, F_gemm / rate) + max(KV / bandwidth, F_attn / rate)  >=  floor
    """
    w, f_gemm, kv, f_attn = _parts(cfg, batch_size, k, context_len)
    return (max(w / ceil.bandwidth_gb_s / 1e6, f_gemm / ceil.matrix_tflop_s / 1e9)
            + max(kv / ceil.bandwidth_gb_s / 1e6, f_attn / ceil.matrix_tflop_s / 1e9))


def build_engine(model: str, drafter: str, k_max: int, max_batch: int, context_len: int, device: str = "cuda",
                 draft_model: str = "qwen3-0.6b", dtype=torch.bfloat16, weights: str | None = None,
                 buckets: tuple[int, ...] = (), temperature: float = 0.0, max_len: int | None = None,
                 ks: tuple[int, ...] = (), kernels: KernelConfig | None = None) -> SpecEngine:
    """Target (random weights unless ``weights`` names a safetensors folder) + drafter + engine, all on one set of
    ops made from ``kernels``."""
    cfg = resolve(model)
    ecfg = EngineConfig(max_num_seqs=max_batch, max_len=max_len or context_len + k_max + 16, k_max=k_max,
                        temperature=temperature, buckets=buckets, ks=ks, kernels=kernels or KernelConfig())
    torch.manual_seed(0)
    target = Decoder(cfg, dtype, device, ops=select_ops(torch.device(device), ecfg.kernels))
    if weights:
        target.load_safetensors(weights)
    draft_cfg = resolve(draft_model) if drafter == "draft_model" else None
    return SpecEngine(target, make_drafter(drafter, target, k_max, draft_cfg=draft_cfg), ecfg)


def time_steps(engine: SpecEngine, batch_size: int, k: int | Sequence[int], num_steps: int, context_len: int,
               warmup: int = 2) -> list[float]:
    """Wall time (ms) of ``engine.step`` for rows 0..b-1 at context_len, each from a reset state; ``k`` is one
    draft length or one per row (a ragged step)."""
    slots = list(range(batch_size))
    cuda = engine.device.type == "cuda"
    out = []
    for i in range(warmup + num_steps):
        engine.reset_rows(batch_size, context_len)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step(slots, k)
        dt = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            out.append(dt)
    return out


def command_line(out_dir: str | None = None) -> str:
    """This run's command as a benchmark records it, its output folder (the device's $OUT) written as $OUT."""
    cmd = " ".join(["python"] + sys.argv)
    return cmd.replace(out_dir, "$OUT") if out_dir else cmd


def device_name(engine: SpecEngine) -> str:
    if engine.device.type == "cuda":
        return torch.cuda.get_device_name(engine.device)
    return "cpu"


def time_replays_gpu(engine: SpecEngine, batch_size: int, k: int, num_steps: int, context_len: int) -> list[float]:
    """GPU time (ms, CUDA events) of the step's launch alone: the graph replay without the read-back."""
    slots = list(range(batch_size))
    return [engine.timed_ms(lambda: engine.launch(slots, k), batch_size, context_len) for _ in range(num_steps)]
