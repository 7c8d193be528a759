"""The carry of vLLM to a GPU machine: what lands in the site folder, parts that join back, missing parts named."""

import json
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import vllm_gpu  # noqa: E402


@pytest.mark.parametrize("member, want", [
    ("vllm/__init__.py", "vllm/__init__.py"),
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", None),  # Hopper runs FA3
    ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"),
    ("vllm/third_party/fmha_sm100/cutlass/x.hpp", None),
    ("vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so", None),
    ("vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so",
     "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so"),
    ("pkg-1.0.data/purelib/pkg/mod.py", "pkg/mod.py"),
    ("pkg-1.0.data/platlib/pkg/ext.so", "pkg/ext.so"),
    ("pkg-1.0.data/scripts/run", None),
    ("pkg/", None),
])
def test_site_path_maps_wheel_members_as_pip_target_would(member, want):
    assert vllm_gpu.site_path(member) == want


def test_unpack_wheel_keeps_modes_and_skips_excluded(tmp_path):
    wheel = tmp_path / "vllm-0.26.0-cp38-abi3-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        info = zipfile.ZipInfo("vllm/tool.so")
        info.external_attr = 0o755 << 16
        zf.writestr(info, b"\x7fELF")
        zf.writestr("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", b"x" * 100)
        zf.writestr("vllm-0.26.0.dist-info/entry_points.txt", "[console_scripts]\n")
    site = tmp_path / "site"
    assert vllm_gpu.unpack_wheel(wheel, site) == 4 + len("[console_scripts]\n")
    assert (site / "vllm/tool.so").stat().st_mode & 0o777 == 0o755
    assert not (site / "vllm/vllm_flash_attn").exists()


def test_parts_join_back_and_missing_or_damaged_parts_are_named(tmp_path):
    blob = tmp_path / "blob"
    data = bytes(range(256)) * 41  # 10496 bytes -> parts of 4096, 4096, 2304
    blob.write_bytes(data)
    out = tmp_path / "parts"
    out.mkdir()
    parts = vllm_gpu.split(blob, out, 4096)
    assert [p.size_bytes for p in parts] == [4096, 4096, 2304]
    manifest = json.loads(json.dumps({"parts": [vars(p) for p in parts]}))
    assert vllm_gpu.check_parts(manifest, out) == []
    joined = tmp_path / "joined"
    vllm_gpu.join(manifest, out, joined)
    assert joined.read_bytes() == data
    (out / "part-01").unlink()
    (out / "part-02").write_bytes(b"tampered")
    assert vllm_gpu.check_parts(manifest, out) == ["part-01 (missing)", "part-02 (damaged)"]


def test_install_refuses_before_joining_when_a_part_is_missing(tmp_path):
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "part-00").write_bytes(b"a")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"parts": [{"name": "part-00", "size_bytes": 1, "sha256": vllm_gpu.sha256(
        stash / "part-00")}, {"name": "part-01", "size_bytes": 1, "sha256": "0"}]}))
    with pytest.raises(SystemExit, match=r"1 of 2 parts not ready: part-01 \(missing\)"):
        vllm_gpu.install(manifest, stash, tmp_path / "site")
    assert not (stash / "site.tar.xz").exists()


def test_compressed_site_extracts_to_the_same_files(tmp_path):
    import lzma
    import tarfile

    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "a.py").write_text("x = 1\n")
    blob = tmp_path / "site.tar.xz"
    vllm_gpu.compress(site, blob)
    back = tmp_path / "back"
    with lzma.open(blob) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(back, filter="fully_trusted")
    assert (back / "pkg" / "a.py").read_text() == "x = 1\n"


def test_plugin_metadata_points_vllm_at_the_repos_entry_point(tmp_path):
    import importlib.metadata

    info = vllm_gpu.write_plugin_metadata(tmp_path, Path(__file__).resolve().parents[2])
    dist = importlib.metadata.Distribution.at(info)
    eps = [ep for ep in dist.entry_points if ep.group == "vllm.general_plugins"]
    assert [(ep.name, ep.value) for ep in eps] == [("tabletune", "tabletune.integrations.vllm.plugin:register")]


def test_every_pinned_requirement_is_exact():
    pins = vllm_gpu.pinned(vllm_gpu.REQUIREMENTS)
    assert "vllm==0.26.0" in pins and "flashinfer-python==0.6.14" in pins
    assert all(p.count("==") == 1 for p in pins)
    assert len({p.split("==")[0] for p in pins}) == len(pins)


def test_prompts_travel_as_jsonl_that_tune_reads(tmp_path):
    from tabletune import assets

    path = vllm_gpu.write_prompts(tmp_path, "code", limit=3)
    back = assets.load_prompts(str(path))
    assert [p.text for p in back] == [p.text for p in assets.load_prompts("code", limit=3)]
