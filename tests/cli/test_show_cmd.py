"""``tabletune show``: the PNG and the summary."""

import json

from click.testing import CliRunner

from tabletune.cli import main

RATES = "0.8,0.75,0.7,0.65,0.6,0.55,0.5"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_show_writes_png_and_summary(starter_8b, tmp_path):
    png = tmp_path / "x.png"
    r = CliRunner().invoke(main, ["show", "--step-times", str(starter_8b), "--acceptance", RATES, "--png", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == PNG_MAGIC
    table = CliRunner().invoke(main, ["table", "--step-times", str(starter_8b), "--acceptance", RATES, "--quiet"])
    ranges = json.loads(table.stdout)["num_speculative_tokens_per_batch_size"]
    assert f"  table: {ranges}" in r.stdout.splitlines()  # the same table as `tabletune table`
    assert r.stdout.splitlines()[-1] == f"wrote {png}"


def test_show_without_acceptance_draws_the_heatmap_only(tmp_path):
    src = tmp_path / "p.csv"
    src.write_text("batch_size,k,step_ms\n1,0,2\n1,1,3\n4,0,5\n4,1,7\n")
    png = tmp_path / "x.png"
    r = CliRunner().invoke(main, ["show", "--step-times", str(src), "--png", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert "  T(1,0)=2.000 ms, T(4,1)=7.000 ms" in r.stdout.splitlines()
    assert "table:" not in r.stdout


def test_show_bad_ks_is_bad_input(starter_8b, tmp_path):
    png = tmp_path / "x.png"
    r = CliRunner().invoke(main, ["show", "--step-times", str(starter_8b), "--acceptance", RATES, "--ks", "99",
                                  "--png", str(png)])
    assert r.exit_code == 2 and "--ks: field 'ks' = [99]" in r.stderr
    assert not png.exists()
