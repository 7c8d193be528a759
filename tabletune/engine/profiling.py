"""Build an engine from names and time its steps."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import torch

from tabletune.engine.config import EngineConfig, KernelConfig
from tabletune.engine.drafters import make_drafter
from tabletune.engine.model import Decoder, select_ops
from tabletune.engine.presets import resolve
from tabletune.engine.runner import SpecEngine
from tabletune.engine.trace_replay import TracedReplayDrafter

# packed verification (token buckets), drafting position by position with stops (a formula rule on the device);
# n-gram traces read bridged; nothing read back between drafting and verification without a host stop rule, and a
# step's tokens appended while the next step runs; a plan made on the n-gram lookup without a stop rule runs fused;
# a pair's two replayed chains wrap together; nothing between a step's first launch and its read waits on the
# device, each draft position uploads its own rows, and a split step's n-gram lookup is one graph; a step's line in
# the stats and its outcome made while the next step runs; the next step of a policy that decides ahead (a fixed k,
# a table, the batch controller) launched before a step's read-back where the batch can not change; a step's
# outcome carries its admissions' prefill time (the gate leaves it out of its windows); the gate's batch mode is the
# batch controller on its own estimator (a policy change the cells' version marks) (patch releases: the device
# runs the same steps; only the host's order around them differs)
ENGINE_VERSION = "0.13.5"
RUNNER = "builtin/cudagraph-per-(bucket,k,tokens)"


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
    if drafter == "trace":  # the traced replay at the cost of an EAGLE-style head
        return SpecEngine(target, TracedReplayDrafter(), ecfg)
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
