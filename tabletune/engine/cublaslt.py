"""cuBLASLt's own kernel list for y = x W^T, as GEMM chooser candidates (ctypes; CUDA only).

torch runs the first kernel of cuBLAS's heuristic list for every shape. At the mid-M decode shapes that kernel
is often far from both ceilings (H200, 8B shape, M = 128-256: the o projection at 1.7-2.5 TB/s and 320-480
TFLOP/s, below the weight-streaming and the matmul rate alike; ``benchmarks/results/engine_gemm_sweep_h200.md``).
``cublasLtMatmulAlgoGetHeuristic`` returns up to ``count`` kernels (tiles, split-K, stages) that cuBLASLt itself
considers; ``gemm.choose`` can time each of them like its other candidates and keep the fastest.

Off by default (``gemm.LT_ALGOS = 0``): on the H200 the list won 80 of 220 decode shapes timed alone (by 0-16%),
but the steps captured with those choices were -0.1% to +5.1% slower than without them (docs/engine_notes.md,
0.7.dev5). Kept as a measured option and a diagnostic (``benchmarks/engine_gemm_sweep.py``).

Row-major y [M, N] = x [M, K] W^T with W [N, K] is, column-major, y^T [N, M] = op(W) x^T: A = W (K x N, ld K,
transposed), B = x (K x M, ld K), D = y (N x M, ld N) (``layouts``).

Every call checks cuBLASLt's status and raises on failure; the chooser drops a candidate that raises or that
disagrees with torch, so a wrong binding can cost start-up time, never a wrong token. Inputs must be contiguous
and 16-byte aligned (the alignment the heuristic was asked for); ``matmul`` refuses anything else.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import NamedTuple

import torch

WORKSPACE_BYTES = 32 << 20  # the most workspace a kernel may use (split-K partials); one buffer per stream lane
ALIGN_BYTES = 16

_COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
_R_32F, _R_16F, _R_16BF = 0, 2, 14  # cudaDataType
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_OP_N, _OP_T = 0, 1
_PREF_MAX_WORKSPACE = 1  # cublasLtMatmulPreferenceAttributes_t
_PREF_MIN_ALIGN = (5, 6, 7, 8)  # ... MIN_ALIGNMENT_A/B/C/D_BYTES
_CONFIG_ID, _CONFIG_TILE, _CONFIG_SPLIT_K, _CONFIG_STAGES = 0, 1, 2, 6  # cublasLtMatmulAlgoConfigAttributes_t


class AlgoStruct(ctypes.Structure):
    """cublasLtMatmulAlgo_t: 64 opaque bytes."""
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (96 bytes)."""
    _fields_ = [("algo", AlgoStruct), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class Algo(NamedTuple):
    """One kernel of cuBLASLt's heuristic list for a shape: ``rank`` 0 is what cuBLASLt would run itself;
    ``data`` is the opaque cublasLtMatmulAlgo_t, the rest is read from it for the logs."""
    rank: int
    algo_id: int
    tile_id: int
    split_k: int
    stages_id: int
    workspace_bytes: int
    data: tuple[int, ...]

    def label(self) -> str:
        return (f"cublaslt#{self.rank}(id {self.algo_id}, tile {self.tile_id}, split-k {self.split_k}, "
                f"stages {self.stages_id})")


def layouts(m: int, n: int, k: int) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
    """(rows, cols, ld) of the column-major A = W, B = x and D = y of y = x W^T (A transposed, B not)."""
    return (k, n, k), (k, m, k), (n, m, n)


_lib_handle: list = []  # [] not tried yet; [None] no cuBLASLt here; [CDLL]


def _find_lib() -> ctypes.CDLL | None:
    """The cuBLASLt that torch loaded (by soname), else one from the nvidia wheels on sys.path, else None."""
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    for root in sys.path:
        for path in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcublasLt.so*")), reverse=True):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_SIGNATURES = {  # argument types (every status is an int): pointers are passed as addresses
    "cublasLtCreate": [_P],
    "cublasLtMatmulDescCreate": [_P, _I, _I],
    "cublasLtMatmulDescSetAttribute": [_P, _I, _P, _S],
    "cublasLtMatrixLayoutCreate": [_P, _I, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
    "cublasLtMatmulPreferenceCreate": [_P],
    "cublasLtMatmulPreferenceSetAttribute": [_P, _I, _P, _S],
    "cublasLtMatmulPreferenceDestroy": [_P],
    "cublasLtMatmulAlgoGetHeuristic": [_P] * 7 + [_I, _P, _P],
    "cublasLtMatmulAlgoConfigGetAttribute": [_P, _I, _P, _S, _P],
    "cublasLtMatmul": [_P] * 12 + [_P, _P, _S, _P],
}


def _lib():
    """The cuBLASLt library with its signatures declared, or None (no CUDA, or not found)."""
    if not _lib_handle:
        lib = _find_lib() if torch.cuda.is_available() else None
        if lib is not None:
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
        _lib_handle.append(lib)
    return _lib_handle[0]


def available() -> bool:
    """Whether cuBLASLt can be called here (CUDA and the library found)."""
    return _lib() is not None


def _addr(obj) -> int:
    """The address of a ctypes object (kept alive by the caller for the call)."""
    return ctypes.addressof(obj)


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {call}: status {status}")


_handle: list[ctypes.c_void_p] = []


def _lt_handle() -> ctypes.c_void_p:
    if not _handle:
        h = ctypes.c_void_p()
        _check(_lib().cublasLtCreate(_addr(h)), "cublasLtCreate")
        _handle.append(h)
    return _handle[0]


class _Problem(NamedTuple):
    desc: ctypes.c_void_p
    a: ctypes.c_void_p
    b: ctypes.c_void_p
    d: ctypes.c_void_p


_problems: dict[tuple[int, int, int, torch.dtype], _Problem] = {}


def _data_type(dtype: torch.dtype) -> int:
    types = {torch.bfloat16: _R_16BF, torch.float16: _R_16F, torch.float32: _R_32F}
    if dtype not in types:
        raise ValueError(f"cuBLASLt GEMM: dtype {dtype} is not one of {sorted(map(str, types))}")
    return types[dtype]


def _problem(m: int, n: int, k: int, dtype: torch.dtype) -> _Problem:
    """The operation and matrix layouts of y = x W^T at this shape (made once, kept for the process)."""
    key = (m, n, k, dtype)
    if key not in _problems:
        lib, dt = _lib(), _data_type(dtype)
        desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(_addr(desc), _COMPUTE_32F, _R_32F), "cublasLtMatmulDescCreate")
        for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            value = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, _addr(value), ctypes.sizeof(value)),
                   "cublasLtMatmulDescSetAttribute")
        mats = []
        for rows, cols, ld in layouts(m, n, k):
            lay = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(_addr(lay), dt, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                                  ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
            mats.append(lay)
        _problems[key] = _Problem(desc, *mats)
    return _problems[key]


def _config_value(lib, algo: AlgoStruct, attr: int) -> int:
    value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
    status = lib.cublasLtMatmulAlgoConfigGetAttribute(_addr(algo), attr, _addr(value),
                                                      ctypes.sizeof(value), _addr(written))
    return int(value.value) if status == 0 else -1


def heuristics(m: int, n: int, k: int, dtype: torch.dtype, count: int) -> list[Algo]:
    """Up to ``count`` kernels cuBLASLt proposes for y [M, N] = x [M, K] W^T (its order: rank 0 first), for
    16-byte aligned operands and at most WORKSPACE_BYTES of workspace; [] without cuBLASLt or for count 0."""
    if count <= 0 or not available():
        return []
    lib, p = _lib(), _problem(m, n, k, dtype)
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(_addr(pref)), "cublasLtMatmulPreferenceCreate")
    try:
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, _addr(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute")
        align = ctypes.c_uint32(ALIGN_BYTES)
        for attr in _PREF_MIN_ALIGN:
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, _addr(align), 4),
                   "cublasLtMatmulPreferenceSetAttribute")
        results = (HeuristicResult * count)()
        returned = ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(_lt_handle(), p.desc, p.a, p.b, p.d, p.d, pref, count, _addr(results),
                                                  _addr(returned)), "cublasLtMatmulAlgoGetHeuristic")
    finally:
        lib.cublasLtMatmulPreferenceDestroy(pref)
    algos = []
    for rank, r in enumerate(results[: returned.value]):
        if r.state == 0 and r.workspace_size <= WORKSPACE_BYTES:
            algos.append(Algo(rank, _config_value(lib, r.algo, _CONFIG_ID), _config_value(lib, r.algo, _CONFIG_TILE),
                              _config_value(lib, r.algo, _CONFIG_SPLIT_K), _config_value(lib, r.algo, _CONFIG_STAGES),
                              int(r.workspace_size), tuple(r.algo.data)))
    return algos


_workspaces: dict[tuple, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    """WORKSPACE_BYTES of scratch for this device and stream lane (``kernels.lane``: GEMMs that may run at the
    same time on two streams must not share one)."""
    from tabletune.engine import kernels

    key = (device, kernels.lane)
    if key not in _workspaces:
        _workspaces[key] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[key]


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``matmul`` takes these operands: CUDA, one dtype, contiguous rows, 16-byte aligned."""
    return (x.is_cuda and x.dtype == w.dtype and x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1]
            and x.is_contiguous() and w.is_contiguous()
            and x.data_ptr() % ALIGN_BYTES == 0 and w.data_ptr() % ALIGN_BYTES == 0
            and (x.shape[1] * x.element_size()) % ALIGN_BYTES == 0 and (w.shape[0] * w.element_size()) % ALIGN_BYTES == 0)


def matmul(x: torch.Tensor, w: torch.Tensor, algo: Algo) -> torch.Tensor:
    """x [M, K] W^T -> [M, N] in x's dtype with this cuBLASLt kernel, on the current stream (graph-capturable)."""
    if not usable(x, w):
        raise ValueError(f"cuBLASLt GEMM: operands x {tuple(x.shape)} / W {tuple(w.shape)} ({x.dtype}, {w.dtype}) "
                         f"are not contiguous, aligned CUDA matrices of one dtype")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    p = _problem(m, n, k, x.dtype)
    ws = _workspace(x.device)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    raw = AlgoStruct((ctypes.c_uint64 * 8)(*algo.data))
    stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
    _check(_lib().cublasLtMatmul(_lt_handle(), p.desc, _addr(alpha), ctypes.c_void_p(w.data_ptr()), p.a,
                                 ctypes.c_void_p(x.data_ptr()), p.b, _addr(beta), ctypes.c_void_p(y.data_ptr()),
                                 p.d, ctypes.c_void_p(y.data_ptr()), p.d, _addr(raw),
                                 ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel()), stream),
           "cublasLtMatmul")
    return y
