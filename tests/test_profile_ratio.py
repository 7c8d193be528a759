"""``tabletune show --against``: T(b, k) of one profile over another, on the cells both measured."""

from click.testing import CliRunner

from tabletune.cli import main
from tabletune.profile import StepPoint, StepProfile
from tabletune.profile_ratio import cell_ratios, ratio_markdown


def _profile(cells: dict[tuple[int, int], float]) -> StepProfile:
    return StepProfile(tuple(StepPoint(b, k, (ms,)) for (b, k), ms in cells.items()), context_len=1024)


def test_ratios_cover_the_shared_cells_only():
    mine = _profile({(1, 0): 6.0, (1, 1): 7.0, (8, 0): 9.0, (8, 1): 12.0})
    vllm = _profile({(1, 0): 8.0, (1, 1): 10.0, (8, 0): 12.0, (16, 0): 20.0})  # (8, 1) and (16, 0) not shared
    got = cell_ratios(mine, vllm)
    assert [(c.batch_size, c.k, round(c.ratio, 3)) for c in got] == [(1, 0, 0.75), (1, 1, 0.7), (8, 0, 0.75)]
    lines = ratio_markdown(got, "builtin", "vllm")
    assert "| 1 | 0.75 | 0.70 |" in lines and "| 8 | 0.75 |  |" in lines
    assert lines[-1] == "3 cells: median 0.75, range 0.70-0.75"
    assert ratio_markdown((), "a", "b") == ["a and b share no measured (b, k) cell"]


def test_show_prints_the_comparison(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _profile({(1, 0): 6.0, (2, 0): 6.5}).save(a)
    _profile({(1, 0): 8.0, (2, 0): 13.0}).save(b)
    got = CliRunner().invoke(main, ["show", "--step-times", str(a), "--against", str(b),
                                    "--png", str(tmp_path / "x.png")])
    assert got.exit_code == 0, got.output
    assert "| 2 | 0.50 |" in got.output and "median 0.62, range 0.50-0.75" in got.output
