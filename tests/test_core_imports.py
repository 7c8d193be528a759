"""The core imports neither torch nor vllm (nor transformers), even indirectly."""

import pkgutil
import subprocess
import sys

import tabletune

HEAVY = ("torch", "vllm", "transformers", "triton")
NOT_CORE = ("tabletune.engine", "tabletune.integrations")


def core_modules():
    for info in pkgutil.walk_packages(tabletune.__path__, "tabletune."):
        if not info.name.startswith(NOT_CORE) and info.name != "tabletune.__main__":
            yield info.name


def test_core_modules_import_no_heavy_framework():
    mods = sorted(core_modules())
    assert "tabletune.controller" in mods and "tabletune.sim" in mods and "tabletune.cli" in mods
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"print(','.join(sorted(h for h in {HEAVY!r} if h in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"core imports pulled in: {proc.stdout.strip()}"
