"""What every Triton kernel of the engine shares: row padding, ticket counters, PDL and GPU timing.

Programmatic dependent launch (PDL, Hopper and later): each kernel is launched so that it may start while its
predecessor drains; its first statement waits for the predecessor's results (``gdc_wait``) and then lets its own
successor launch. Inside a step's CUDA graph that hides the launch gap and tail of some 300 small kernels.

"Last program merges": split-K GEMMs and split-KV attention store their partials, then take a ticket from a
counter (atomic, acquire-release); the program that draws the last ticket adds the partials in split order
(deterministic) and resets the counter to zero, so counters are zero between launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TICKETS = 1 << 16
ROW_PAD = 128  # row capacity of GEMM inputs made by the kernels: M rounded up to this (see ``empty_rows``)


def round_up(m: int, multiple: int) -> int:
    return -(-m // multiple) * multiple


def empty_rows(m: int, n: int, dtype, device) -> torch.Tensor:
    """An uninitialised [m, n] tensor whose storage holds m rounded up to ROW_PAD rows, so that the GEMM can run
    cuBLAS on a padded row count without a copy (``gemm.padded_rows``); the first m output rows are unaffected."""
    return torch.empty(round_up(m, ROW_PAD), n, dtype=dtype, device=device)[:m]


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _probe_kernel(x_ptr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


def pdl_works(device: torch.device) -> bool:
    """Whether PDL launches run here: CUDA, compute capability >= 9 and a probe launch that works."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        x = torch.zeros(1, device=device)
        _probe_kernel[(1,)](x, USE_PDL=True, launch_pdl=True)
        torch.cuda.synchronize(device)
        return float(x) == 1.0
    except Exception as exc:  # this Triton cannot launch with PDL: run without it
        print(f"tabletune: PDL off ({type(exc).__name__}: {exc})")
        return False


def launch_kwargs(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


def time_us(fn, inner: int = 10, reps: int = 5) -> float:
    """GPU time of one call of ``fn``: ``inner`` calls captured in a CUDA graph (no launch gaps), best of ``reps``;
    inf when it does not run here (shared memory, shape)."""
    try:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
    except Exception:
        torch.cuda.synchronize()
        return float("inf")
    best = float("inf")
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / inner)
    return best
