"""The GEMM chooser's bookkeeping on the CPU: the cuBLASLt binding (struct layout, the operand mapping, the heuristic
call against a fake library), which timings calls follow (alone / in context, with or without cuBLASLt's kernels).
The real library and timings run on the GPU: benchmarks/engine_gpu_check.py, engine_roofline.py."""

import ctypes
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.engine import cublaslt as L, gemm as G  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch):
    """``gemm.current`` remembers its answers; every test here swaps the timings under it."""
    monkeypatch.setattr(G, "_current", {})


def test_structs_match_the_c_layout():
    assert ctypes.sizeof(L.AlgoStruct) == 64
    assert ctypes.sizeof(L.HeuristicResult) == 96  # algo 64, workspace 8, state 4, waves 4, reserved 16


def _column_major(buf: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols column-major matrix with leading dimension ld that cuBLAS reads from buf."""
    return np.array([[buf[r + c * ld] for c in range(cols)] for r in range(rows)])


@pytest.mark.parametrize("m,n,k", [(1, 3, 2), (3, 5, 4), (6, 2, 7)])
def test_layouts_compute_x_times_w_transposed(m, n, k):
    """D = op(A) op(B) with A = W transposed and B = x as cuBLAS reads them, written back column-major, is the
    row-major x W^T."""
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    x, w = rng.normal(size=(m, k)), rng.normal(size=(n, k))
    (ar, ac, ald), (br, bc, bld), (dr, dc, dld) = L.layouts(m, n, k)
    a = _column_major(w.reshape(-1), ar, ac, ald)
    b = _column_major(x.reshape(-1), br, bc, bld)
    d = a.T @ b
    assert (dr, dc) == d.shape
    y = np.empty(dr * dc)
    for r in range(dr):
        for c in range(dc):
            y[r + c * dld] = d[r, c]
    np.testing.assert_allclose(y.reshape(m, n), x @ w.T)


class FakeLib:
    """Stands in for libcublasLt: records calls, writes what the real one would at the addresses it gets."""

    def __init__(self, states=(0, 0, 7), fail=None):
        self.calls, self.states, self.fail = [], states, fail
        self.prefs = {}

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            if name == self.fail:
                return 13
            if name in ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate",
                        "cublasLtMatmulPreferenceCreate"):
                ctypes.c_void_p.from_address(args[0]).value = 0x1000 + len(self.calls)
            elif name == "cublasLtMatmulPreferenceSetAttribute":
                size = args[3]
                self.prefs[args[1]] = (ctypes.c_uint64 if size == 8 else ctypes.c_uint32).from_address(args[2]).value
            elif name == "cublasLtMatmulAlgoGetHeuristic":
                count, results = args[7], (L.HeuristicResult * args[7]).from_address(args[8])
                for i, state in enumerate(self.states[:count]):
                    results[i].state, results[i].workspace_size = state, 1024 * i
                    results[i].algo.data[0] = 40 + i
                ctypes.c_int.from_address(args[9]).value = min(count, len(self.states))
            elif name == "cublasLtMatmulAlgoConfigGetAttribute":
                algo = L.AlgoStruct.from_address(args[0])
                ctypes.c_uint32.from_address(args[2]).value = algo.data[0] * 10 + args[1]
            return 0
        return call


@pytest.fixture
def fake_lib(monkeypatch):
    def install(lib):
        monkeypatch.setattr(L, "_lib_handle", [lib])
        monkeypatch.setattr(L, "_handle", [])
        monkeypatch.setattr(L, "_problems", {})
        return lib
    return install


def test_heuristics_keep_the_valid_kernels_in_cublaslt_order(fake_lib):
    lib = fake_lib(FakeLib(states=(0, 0, 7)))
    algos = L.heuristics(8, 4096, 4096, torch.bfloat16, 3)
    assert [a.rank for a in algos] == [0, 1]  # the third one's state is not success
    assert algos[1].data[0] == 41 and algos[1].workspace_bytes == 1024
    assert (algos[1].algo_id, algos[1].tile_id, algos[1].split_k, algos[1].stages_id) == (410, 411, 412, 416)
    assert lib.prefs == {1: L.WORKSPACE_BYTES, 5: 16, 6: 16, 7: 16, 8: 16}
    assert "cublasLtMatmulPreferenceDestroy" in lib.calls
    assert algos[0].label().startswith("cublaslt#0(")


def test_heuristics_report_the_failing_call_and_free_the_preference(fake_lib):
    lib = fake_lib(FakeLib(fail="cublasLtMatmulAlgoGetHeuristic"))
    with pytest.raises(RuntimeError, match="cublasLtMatmulAlgoGetHeuristic: status 13"):
        L.heuristics(8, 64, 64, torch.bfloat16, 4)
    assert lib.calls[-1] == "cublasLtMatmulPreferenceDestroy"


def test_heuristics_are_empty_without_the_library(fake_lib):
    fake_lib(None)
    assert not L.available()
    assert L.heuristics(8, 64, 64, torch.bfloat16, 4) == []
    assert L.heuristics(8, 64, 64, torch.bfloat16, 0) == []


def test_unsupported_dtype_names_itself(fake_lib):
    fake_lib(FakeLib())
    with pytest.raises(ValueError, match="torch.int8"):
        L.heuristics(8, 64, 64, torch.int8, 4)


def test_matmul_refuses_operands_it_cannot_take():
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    algo = L.Algo(0, 1, 2, 1, 3, 0, (0,) * 8)
    assert not L.usable(x, w)  # CPU tensors
    with pytest.raises(ValueError, match="not contiguous, aligned CUDA matrices"):
        L.matmul(x, w, algo)
    # the GEMM path falls back to torch for operands cuBLASLt cannot take
    torch.testing.assert_close(G._run(x, w, algo), x @ w.t())


def test_use_lt_off_takes_the_fastest_other_candidate(monkeypatch):
    algo = L.Algo(2, 1, 2, 4, 3, 0, (7,) * 8)
    key = (224, 4096, 4096, False)
    cfg = G.Config(64, 128, 64, 2, 4, 6, True)
    monkeypatch.setattr(G, "_choice", {key: algo, (1, 8, 8, False): None})
    monkeypatch.setattr(G, "_timings", {key: {algo: 14.0, None: 22.0, cfg: 18.0, G.CUBLASLT: 19.0}})
    assert G.current(key) == algo
    monkeypatch.setattr(G, "use_lt", False)
    assert G.current(key) == cfg
    assert G.current((1, 8, 8, False)) is None
    assert G.current((2, 8, 8, False)) is None  # never chosen


def test_triton_only_takes_the_fastest_triton_config_where_one_was_timed(monkeypatch):
    """``gemm.triton_only``: each shape's fastest Triton config instead of a faster cuBLAS / cuBLASLt pick; a gated
    shape may keep the unfused path (silu_mul, then the plain shape's pick); a shape with no Triton timing keeps
    its pick. ``pdl_breaks`` names exactly the shapes of the given row counts that the switch changes."""
    algo = L.Algo(2, 1, 2, 4, 3, 0, (7,) * 8)
    fast, slow = G.Config(64, 128, 64, 2, 4, 6, True), G.Config(64, 64, 128, 1, 4, 6)
    k80, k80g, k80lt, k96, k8 = ((80, 4096, 4096, False), (80, 4096, 12288, True), (80, 6144, 4096, False),
                                 (96, 4096, 4096, False), (8, 4096, 4096, False))
    monkeypatch.setattr(G, "_choice", {k80: None, k80g: None, k80lt: algo, k96: 128, k8: fast})
    monkeypatch.setattr(G, "_context_timings", {
        k80: {None: 20.0, 128: 21.0, slow: 26.0, fast: 23.0},
        k80g: {None: 50.0, G.Config(64, 64, 128, 2, 4, 4): 80.0},
        k80lt: {algo: 14.0, G.CUBLASLT: 15.0, slow: 17.0},
        k96: {128: 30.0, G.CUBLASLT: 31.0}})
    monkeypatch.setattr(G, "_timings", {k8: {fast: 9.0, None: 8.0}})
    assert [G.current(k) for k in (k80, k80g, k80lt, k96)] == [None, None, algo, 128]
    assert G.current(k8) is None  # timed alone below CONTEXT_MIN_ROWS: cuBLAS was faster
    assert G.pdl_breaks({80}) == [k80, k80lt]
    assert G.pdl_breaks({8, 96}) == [k8]  # 96 rows: no Triton config timed
    monkeypatch.setattr(G, "triton_only", True)
    assert [G.current(k) for k in (k80, k80g, k80lt, k96, k8)] == [fast, None, slow, 128, fast]
    assert G.pdl_breaks({8, 80, 96}) == []


def test_candidates_offer_cublaslt_kernels_for_cuda_weights_only(monkeypatch):
    algo = L.Algo(0, 1, 2, 1, 3, 0, (0,) * 8)
    monkeypatch.setattr(G, "_lt_heuristics", lambda m, w: [algo])
    assert algo not in G.candidates(32, False, torch.randn(64, 64))  # a CPU weight: no cuBLASLt
    assert algo not in G.candidates(32, False)
    cuda_w = types.SimpleNamespace(is_cuda=True, shape=(64, 64), dtype=torch.bfloat16)
    assert algo in G.candidates(32, False, cuda_w)
    assert algo not in G.candidates(32, True, cuda_w)  # gated shapes: silu_mul, then the plain shape's choice


def test_lt_heuristics_survive_a_broken_library(monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("cuBLASLt cublasLtCreate: status 1")
    monkeypatch.setattr(L, "heuristics", broken)
    assert G._lt_heuristics(16, torch.randn(64, 32)) == []
    assert "no cuBLASLt heuristic kernels for M=16 N=64 K=32" in capsys.readouterr().out


def _timed(monkeypatch, key, choice, alone: dict, in_context: dict) -> None:
    """The chooser's state after timing ``key`` both ways and recording ``choice``, with in-context timing on."""
    monkeypatch.setattr(G, "_choice", {key: choice})
    monkeypatch.setattr(G, "_timings", {key: alone})
    monkeypatch.setattr(G, "_context_timings", {key: in_context})
    monkeypatch.setattr(G, "use_context", True)


def test_use_context_picks_from_the_timings_it_names(monkeypatch):
    """The chooser's in-context timings (each call followed by a PDL kernel) and its timings alone can disagree;
    the switch decides which ones calls follow, and a kind that was not measured falls back to the other."""
    key = (80, 4096, 12288, False)
    cfg = G.Config(32, 64, 256, 2, 4, 4)
    _timed(monkeypatch, key, cfg, alone={None: 20.0, cfg: 21.0}, in_context={None: 22.5, cfg: 21.6})
    assert G.current(key) == cfg
    monkeypatch.setattr(G, "use_context", False)
    assert G.current(key) is None
    monkeypatch.setattr(G, "_timings", {})
    G._current.clear()  # what _fastest does when it stores timings
    assert G.current(key) == cfg  # only in-context timings: those


def test_small_m_keeps_the_timings_alone(monkeypatch):
    """Below CONTEXT_MIN_ROWS calls follow the timings alone (there the in-context choice lost in the step); the
    default timing mode times each M only the way its calls will use."""
    key = (12, 4096, 4096, False)
    cfg = G.Config(16, 64, 256, 2, 4, 4)
    _timed(monkeypatch, key, cfg, alone={None: 12.0, cfg: 11.5}, in_context={None: 12.4, cfg: 12.6})
    assert G.CONTEXT_MIN_ROWS > 12 and G.current(key) == cfg
    monkeypatch.setattr(G, "CONTEXT_MIN_ROWS", 1)
    assert G.current(key) is None
    monkeypatch.setattr(G, "TIMING", "auto")
    monkeypatch.setattr(G, "CONTEXT_MIN_ROWS", 17)
    assert G._timing_kinds(16) == (True, False) and G._timing_kinds(17) == (False, True)
    monkeypatch.setattr(G, "TIMING", "both")
    assert G._timing_kinds(16) == (True, True)
