"""The Gluon wgmma GEMM's host side, and its sm_90 code compiled on the CPU (no GPU needed to compile)."""

import re

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch")
gemm_wgmma = pytest.importorskip("tabletune.engine.gemm_wgmma")


@given(m=st.integers(1, 256))
def test_every_candidate_fits_and_covers_m(m):
    cfgs = gemm_wgmma.configs(m)
    assert cfgs, f"no candidate at M={m}"
    bt = gemm_wgmma.block_t(m)
    assert bt >= m and bt & (bt - 1) == 0 and bt >= 16
    for cfg in cfgs:
        assert gemm_wgmma.fits(cfg, m)
        assert cfg.stages * (cfg.block_w + bt) * cfg.block_k * 2 <= gemm_wgmma.SMEM_BYTES


@given(k=st.integers(1, 64).map(lambda v: v * 256), split=st.sampled_from([1, 2, 3, 4, 6, 8]),
       block_k=st.sampled_from([64, 128]))
def test_splits_cover_k_and_none_is_empty(k, split, block_k):
    per, n = gemm_wgmma.k_iters_per_split(k, gemm_wgmma.WgmmaConfig(64, block_k, split, 4, 4))
    iters = -(-k // block_k)
    assert n <= split and per * n >= iters and per * (n - 1) < iters  # the last split has at least one iteration


def test_one_warp_group_never_holds_a_64_x_256_tile():
    # ptxas spilled that tile's split-K epilogue on sm_90a
    assert not gemm_wgmma.fits(gemm_wgmma.WgmmaConfig(64, 64, 2, 4, 4), 256)
    assert gemm_wgmma.fits(gemm_wgmma.WgmmaConfig(128, 64, 2, 4, 8), 256)


def _ptx(m: int, cfg, use_pdl: bool) -> str:
    """The kernel compiled for sm_90 by the installed Triton, with the launch's argument types."""
    return _compiled(m, cfg, use_pdl).asm["ptx"]


def _compiled(m: int, cfg, use_pdl: bool, norm: bool = False, silu: bool = False, resid: bool = False):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    gl = gemm_wgmma.gl
    bt = gemm_wgmma.block_t(m)

    def desc(rows, block):
        t = torch.empty(rows, 4096, dtype=torch.bfloat16)
        layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
        return mangle_type(gemm_wgmma.TensorDescriptor(t, [rows, 4096], [4096, 1], block, layout))

    fn = gemm_wgmma._wgmma_stream_k_kernel if cfg.programs else gemm_wgmma._wgmma_kernel
    names = fn.arg_names
    const = dict(STAGES=cfg.stages, USE_PDL=use_pdl, num_warps=cfg.warps)
    if not cfg.programs:
        const.update(HAS_SPLIT=cfg.split > 1, NORM=norm, SILU=silu, RESID=resid, NT_P=64 if norm else 1)
    types = {"w_desc": desc(4096, [cfg.block_w, cfg.block_k]), "x_desc": desc(m, [bt, cfg.block_k]),
             "y_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "ITERS": "i32",
             "ITERS_PER_SPLIT": "i32", "SPLIT": "i32", "KB": "i32", "PROGRAMS": "i32", "ss_in_ptr": "*fp32",
             "ss_out_ptr": "*fp32", "NT_IN": "i32", "K": "i32", "eps": "fp32"}
    src = GluonASTSource(fn, {n: "constexpr" if n in const else types[n] for n in names},
                         constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.warps))


@pytest.mark.parametrize("m,cfg", [(16, gemm_wgmma.WgmmaConfig(64, 128, 1, 8, 4)),
                                   (128, gemm_wgmma.WgmmaConfig(128, 64, 3, 6, 4)),
                                   (16, gemm_wgmma.WgmmaConfig(64, 128, 1, 8, 4, 132)),
                                   (64, gemm_wgmma.WgmmaConfig(128, 64, 1, 8, 4, 132))])
def test_sm90_code_is_tma_and_async_wgmma_with_weights_before_the_pdl_wait(m, cfg):
    if not gemm_wgmma.available():
        pytest.skip("this Triton has no Gluon")
    ptx = _ptx(m, cfg, use_pdl=True)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk16\.f32\.bf16\.bf16" % gemm_wgmma.block_t(m), ptx)
    assert "wgmma.wait_group" in ptx
    loads = [mt.start() for mt in re.finditer(r"cp\.async\.bulk\.tensor\.2d", ptx)]
    wait = ptx.find("griddepcontrol.wait")
    assert loads and wait > 0
    # the first STAGES W tiles are asked for before the wait; the x tiles (written by the previous kernel) after
    assert sum(pos < wait for pos in loads) == cfg.stages
    # the ticket of the split-K or stream-K fix-up
    assert "atom.global" in ptx or "red.global" in ptx or (cfg.split == 1 and not cfg.programs)
    assert "griddepcontrol.wait" not in _ptx(m, cfg, use_pdl=False)


def test_the_chooser_takes_a_wgmma_config_only_where_allowed(monkeypatch):
    gemm = pytest.importorskip("tabletune.engine.gemm")
    key = (24, 4096, 4096, False)
    wg, ptr = gemm_wgmma.WgmmaConfig(64, 128, 1, 8, 4), gemm.Config(32, 64, 128, 2, 4, 6)
    monkeypatch.setitem(gemm._choice, key, wg)
    monkeypatch.setitem(gemm._context_timings, key, {wg: 10.0, ptr: 12.0, None: 11.0})
    monkeypatch.setattr(gemm, "_current", {})
    assert gemm.current(key) == wg and gemm._is_triton(wg)  # a PDL kernel: part of the step's chain
    monkeypatch.setattr(gemm, "use_wgmma", False)
    assert gemm.current(key) is None  # cuBLAS, the fastest of the others
    monkeypatch.setattr(gemm, "triton_only", True)
    assert gemm.current(key) == ptr
    w = torch.zeros(4096, 4096, dtype=torch.bfloat16)
    assert not gemm._atomic_ok(wg, w)  # no accumulator variant
    assert not gemm._wgmma_ok(24, w)  # a CPU tensor: never a candidate
    assert gemm.WGMMA_MIN_ROWS == 9  # the fair A/B's range: M = 10-14 gained, M = 8 did not


def test_stream_k_candidates_are_their_own(monkeypatch):
    # the split-K list never holds a stream-K config; whether the chooser times them: the chooser test below
    assert not any(c.programs for c in gemm_wgmma.configs(32))
    sk = gemm_wgmma.stream_k_configs(32, num_sms=114)
    assert sk and all(c.programs == 114 and c.split == 1 and gemm_wgmma.fits(c, 32) for c in sk)


@given(tiles=st.integers(1, 400), k_blocks=st.integers(1, 200), programs=st.sampled_from([1, 7, 114, 132, 264]))
def test_stream_k_ranges_cover_every_iteration_once_and_tickets_count_the_partials(tiles, k_blocks, programs):
    ranges = gemm_wgmma.stream_k_ranges(tiles, k_blocks, programs)
    iters = tiles * k_blocks
    assert ranges[0][0] == 0 and ranges[-1][1] == iters
    assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(ranges, ranges[1:]))
    for t in range(tiles):
        lo, hi = t * k_blocks, (t + 1) * k_blocks
        touching = [p for p, (a, b) in enumerate(ranges) if a < b and a < hi and b > lo]  # runs some of it
        first, last, tickets = gemm_wgmma.stream_k_contributors(t, k_blocks, iters, programs)
        assert touching[0] == first and touching[-1] == last
        whole = len(touching) == 1 and ranges[first][0] <= lo and ranges[first][1] >= hi
        # a tile one program covers is stored directly; otherwise every program touching it takes one ticket
        assert whole or tickets == len(touching)


def test_the_stream_k_switch_leaves_the_other_wgmma_configs(monkeypatch):
    gemm = pytest.importorskip("tabletune.engine.gemm")
    key = (24, 4096, 4096, False)
    sk, wg = gemm_wgmma.WgmmaConfig(64, 128, 1, 8, 4, 132), gemm_wgmma.WgmmaConfig(64, 128, 1, 8, 4)
    monkeypatch.setitem(gemm._choice, key, sk)
    monkeypatch.setitem(gemm._context_timings, key, {sk: 9.0, wg: 10.0, None: 11.0})
    monkeypatch.setattr(gemm, "_current", {})
    assert gemm.current(key) == sk
    monkeypatch.setattr(gemm, "use_stream_k", False)
    assert gemm.current(key) == wg  # the split-K kernel, next fastest
    monkeypatch.setattr(gemm, "use_wgmma", False)
    assert gemm.current(key) is None


@pytest.mark.parametrize("m", [16, 64])
def test_every_stream_k_candidate_compiles_within_a_blocks_shared_memory(m):
    # its epilogue runs inside the loop, so the layout-conversion scratch sits beside the ring (a 256 x 64 tile
    # with 5 slots needed 232 KB at 64 tokens before the ring was sized for it)
    if not gemm_wgmma.available():
        pytest.skip("this Triton has no Gluon")
    cfgs = gemm_wgmma.stream_k_configs(m)
    assert {c.block_w for c in cfgs} == {64, 128, 256}
    for cfg in cfgs:
        assert gemm_wgmma.fits(cfg, m)
        assert _compiled(m, cfg, use_pdl=True).metadata.shared <= gemm_wgmma.SMEM_LIMIT, tuple(cfg)


def test_the_chooser_offers_stream_k_alone_above_the_split_k_rows(monkeypatch):
    gemm = pytest.importorskip("tabletune.engine.gemm")
    monkeypatch.setattr(gemm, "_wgmma_ok", lambda m, w: True)  # stands in for a bf16 weight on a Hopper GPU
    monkeypatch.setattr(gemm, "_num_sms", lambda w: 132)

    def wgmma_cands(m):
        return [c for c in gemm.candidates(m) if isinstance(c, gemm_wgmma.WgmmaConfig)]
    monkeypatch.setattr(gemm_wgmma, "STREAM_K", True)
    assert {bool(c.programs) for c in wgmma_cands(32)} == {True, False}
    assert wgmma_cands(96) and all(c.programs == 132 for c in wgmma_cands(96))  # split-K lost from 96 rows
    monkeypatch.setattr(gemm_wgmma, "STREAM_K", False)
    assert not any(c.programs for c in wgmma_cands(32)) and wgmma_cands(32)
    assert wgmma_cands(96) == []


@given(m=st.integers(1, 64), silu=st.booleans())
def test_fused_candidates_fit_with_their_weight_tiles(m, silu):
    """The fused-norm layers' candidates: split-K, one warp group, one token tile, a ring of >= 3 slots of one
    (two with SILU) W tiles and the x tile within SMEM_BYTES."""
    cfgs = gemm_wgmma.fused_configs(m, silu)
    bt = gemm_wgmma.block_t(m)
    assert cfgs and bt <= gemm_wgmma.FUSED_MAX_T
    tiles = 2 if silu else 1
    for cfg in cfgs:
        assert not cfg.programs and cfg.warps == 4 and cfg.stages >= 3 and cfg.split in gemm_wgmma.FUSED_SPLITS
        assert cfg.stages * (tiles * cfg.block_w + bt) * cfg.block_k * 2 <= gemm_wgmma.SMEM_BYTES
        assert gemm_wgmma.fits(cfg, m, tiles)
    assert not gemm_wgmma.fits(gemm_wgmma.WgmmaConfig(128, 128, 1, 8, 4), 16, 2)  # 8 x 272 x 256 B: 557 KB


@pytest.mark.parametrize("norm,silu,resid", [(True, False, False), (True, True, False), (False, False, True)])
@pytest.mark.parametrize("m,cfg", [(16, gemm_wgmma.WgmmaConfig(64, 128, 1, 5, 4)),
                                   (16, gemm_wgmma.WgmmaConfig(128, 64, 2, 5, 4)),
                                   (64, gemm_wgmma.WgmmaConfig(64, 64, 3, 4, 4))])
def test_sm90_code_of_the_fused_epilogues(norm, silu, resid, m, cfg):
    """The fused variants compile for sm_90 within the shared memory a block may have, with the plain kernel's
    schedule: every W copy of the first STAGES slots (two a slot with SILU) before the PDL wait, the gate and up
    wgmmas committed as two groups and the K loop waiting down to those two, and each epilogue's own instructions
    (1 / rms: a square root; silu: an exponential; the residual's sums of squares: a second global store)."""
    if not gemm_wgmma.available():
        pytest.skip("this Triton has no Gluon")
    compiled = _compiled(m, cfg, True, norm, silu, resid)
    assert compiled.metadata.shared <= gemm_wgmma.SMEM_LIMIT
    ptx = compiled.asm["ptx"]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n%dk16\.f32\.bf16\.bf16" % m, ptx)
    wait = ptx.find("griddepcontrol.wait")
    loads = [mt.start() for mt in re.finditer(r"cp\.async\.bulk\.tensor\.2d", ptx)]
    assert sum(pos < wait for pos in loads) == cfg.stages * (2 if silu else 1)
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    assert waits[0] == ("2" if silu else "1") and waits[-1] == "0"
    assert ("sqrt" in ptx) == norm
    assert ("ex2" in ptx) == silu
    plain = _ptx(m, cfg, use_pdl=True)
    assert "sqrt" not in plain and "ex2" not in plain
    if resid:  # y's tile and the sums of squares: more global stores than the plain kernel's
        assert ptx.count("st.global") > plain.count("st.global")
