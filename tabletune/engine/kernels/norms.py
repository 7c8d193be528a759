"""The element-wise kernels of a layer: residual add + RMSNorm, and silu(gate) * up."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tabletune.engine.kernels.common import empty_rows, launch_kwargs, pdl_wait


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(x_ptr + row * 2 * N + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * N + N + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, pdl: bool, out_dtype=None) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] on the last dim (fp32 math, one rounding)."""
    n = gate_up.shape[-1] // 2
    # [rows, 2n]
    x = gate_up.reshape(-1, 2 * n)
    y = empty_rows(x.shape[0], n, out_dtype or x.dtype, x.device)
    _silu_mul_kernel[(x.shape[0], triton.cdiv(n, 1024))](x, y, n, BLOCK=1024, USE_PDL=pdl, **launch_kwargs(pdl))
    return y.view(*gate_up.shape[:-1], n)


@triton.jit
def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, y_ptr, r_ptr, N, eps, BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr,
                         USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    r = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        r += tl.load(d_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    r_lo = r.to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + row * N + cols, r_lo, mask=ok)
    r = r_lo.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, 0) / N + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (r * inv * w).to(y_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, pdl: bool):
    """residual = x + delta (delta None: x); returns (rms_norm(residual), residual)."""
    n = x.shape[-1]
    rows = x.numel() // n
    r = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    y = empty_rows(rows, n, weight.dtype, x.device).view(x.shape)
    _add_rms_norm_kernel[(rows,)](x, x if delta is None else delta, weight, y, r, n, eps,
                                  BLOCK=triton.next_power_of_2(n), HAS_DELTA=delta is not None, USE_PDL=pdl,
                                  num_warps=8, **launch_kwargs(pdl))
    return y, r
