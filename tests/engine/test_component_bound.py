"""benchmarks/engine_component_bound.py on the CPU: saved GEMM times in, per-cell bound against the done line out."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tabletune.engine.presets import resolve  # noqa: E402
from tabletune.engine.profiling import Ceilings, best_kernel_serial_ms, gemm_floor_us, step_floor_ms  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_component_bound.py"
CEIL = Ceilings(bandwidth_gb_s=4000.0, matrix_tflop_s=800.0)
PROJS = ("qkv", "o", "gate_up", "down", "lm_head")


@pytest.fixture(scope="module")
def cb():
    spec = importlib.util.spec_from_file_location("engine_component_bound", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _times_file(tmp_path, us_at: dict[int, float], name="times.json") -> Path:
    """Every projection at each M: ``cublas_us`` = us_at[M] and a slower ``triton_us``, and one null time."""
    rows = [{"proj": p, "m": m, "cublas_us": us, "triton_us": us * 2, "lt_list_us": None}
            for m, us in us_at.items() for p in PROJS]
    path = tmp_path / name
    path.write_text(json.dumps({"model": "qwen3-8b", "rows": rows}))
    return path


def _grid_file(tmp_path, cells: list[tuple[int, int, float]]) -> Path:
    cfg = resolve("qwen3-8b")
    rows = []
    for b, k, ratio in cells:
        floor = step_floor_ms(cfg, b, k, 1024, CEIL)
        rows.append({"batch_size": b, "k": k, "step_ms": ratio * floor, "floor_ms": floor, "ratio": ratio})
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"model": "qwen3-8b", "context_len": 1024, "bandwidth_gb_s": CEIL.bandwidth_gb_s,
                                "matrix_tflop_s": CEIL.matrix_tflop_s, "rows": rows}))
    return path


def test_times_take_the_fastest_kernel_and_the_smallest_saved_m_above(cb, tmp_path):
    times = cb.load_times([str(_times_file(tmp_path, {8: 10.0, 64: 20.0})), str(_times_file(tmp_path, {8: 9.0},
                                                                                              "b.json"))])
    assert times[("qkv", 8)] == 9.0 and times[("down", 64)] == 20.0
    gemm_us, padded, floored = cb.lookup(times, "t")
    assert gemm_us("o", 8) == 9.0 and not padded
    assert gemm_us("o", 9) == 20.0 and padded == {("o", 9)}
    with pytest.raises(cb.TimesError, match="'o' at M >= 65"):
        gemm_us("o", 65)
    gemm_us, _, floored = cb.lookup(times, "t", lambda proj, m: 1000.0 + m)
    assert gemm_us("o", 65) == 1065.0 and floored == {("o", 65)}


@pytest.mark.parametrize("row,field", [({"proj": "o", "m": 8, "cublas_us": -1.0}, "cublas_us"),
                                       ({"proj": "o", "m": 8, "cublas_us": "fast"}, "cublas_us"),
                                       ({"proj": "o", "cublas_us": 3.0}, "'m'")])
def test_bad_times_name_the_file_and_field(cb, tmp_path, row, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"rows": [row]}))
    with pytest.raises(cb.TimesError) as exc:
        cb.load_times([str(path)])
    assert str(path) in str(exc.value) and field in str(exc.value)


def test_cpu_run_flags_exactly_the_cells_whose_bound_is_over_the_line(cb, tmp_path):
    """With 10 us a layer GEMM (and the LM head) at M <= 16 and 200 us at M <= 256: b = 1 stays under 1.3x, while
    (32, 7) (M = 256) costs 36 x 800 + 200 us = 29 ms of GEMMs, far over 1.3x of its ~5 ms floor."""
    grid = _grid_file(tmp_path, [(1, 0, 1.31), (1, 7, 1.25), (32, 7, 1.6)])
    times = _times_file(tmp_path, {16: 10.0, 256: 200.0})
    out = tmp_path / "bound"
    assert cb.main(["--grid", str(grid), "--times", str(times), "--over-line", "--out", str(out)]) == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    cells = {(c["batch_size"], c["k"]): c for c in doc["cells"]}
    assert set(cells) == {(1, 0), (32, 7)}  # (1, 7) met the line in the grid
    assert not cells[(1, 0)]["bound_over_line"] and cells[(32, 7)]["bound_over_line"]
    cfg = resolve("qwen3-8b")
    expect = best_kernel_serial_ms(cfg, 32, 7, 1024, CEIL, lambda p, m: 200.0)
    assert cells[(32, 7)]["bound_ms"] == pytest.approx(expect, abs=1e-4)
    assert cells[(1, 0)]["padded"] == sorted(PROJS)  # M = 1 took the M = 16 times
    assert "the bound is over the line at 1: (32, 7)" in out.with_suffix(".md").read_text()


def test_cpu_run_with_a_missing_shape_fails_and_writes_nothing(cb, tmp_path):
    grid = _grid_file(tmp_path, [(1, 0, 1.31)])
    rows = [{"proj": p, "m": 8, "cublas_us": 10.0} for p in PROJS if p != "lm_head"]
    times = tmp_path / "no_lm_head.json"
    times.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "bound"
    with pytest.raises(SystemExit, match="no_lm_head.json: no GEMM time for 'lm_head'"):
        cb.main(["--grid", str(grid), "--times", str(times), "--out", str(out)])
    assert not list(tmp_path.glob("bound*"))
    assert cb.main(["--grid", str(grid), "--times", str(times), "--floor-missing", "--out", str(out)]) == 0
    cell = json.loads(out.with_suffix(".json").read_text())["cells"][0]
    assert cell["at_floor"] == ["lm_head"]
    cfg = resolve("qwen3-8b")
    lm_head_us = gemm_floor_us(cfg.vocab_size, cfg.hidden_size, 1, CEIL)  # the LM head's weight bytes at 4 TB/s
    assert lm_head_us == pytest.approx(2 * 151936 * 4096 / 4000 / 1e3)
    expect = best_kernel_serial_ms(cfg, 1, 0, 1024, CEIL, lambda p, m: lm_head_us if p == "lm_head" else 10.0)
    assert cell["bound_ms"] == pytest.approx(expect, abs=1e-4)


def test_a_grid_without_its_fields_is_refused_by_name(cb, tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"model": "qwen3-8b", "context_len": 1024, "bandwidth_gb_s": 4000.0,
                                "matrix_tflop_s": 800.0, "rows": [{"batch_size": 1, "k": 0, "step_ms": "slow",
                                                                   "ratio": 1.2}]}))
    times = _times_file(tmp_path, {8: 10.0})
    with pytest.raises(SystemExit, match=r"grid.json: rows\[0\].step_ms must be a number, got 'slow'"):
        cb.main(["--grid", str(grid), "--times", str(times), "--out", str(tmp_path / "bound")])
    assert not list(tmp_path.glob("bound*"))
