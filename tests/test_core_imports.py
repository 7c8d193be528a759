"""The core imports neither torch nor vllm (nor transformers), even indirectly, and never ``integrations/``."""

import ast
import pathlib
import pkgutil
import subprocess
import sys

import tabletune

HEAVY = ("torch", "vllm", "transformers", "triton")
NOT_CORE = ("tabletune.engine", "tabletune.integrations", "tabletune.drafter")  # drafter: trains with torch
PACKAGE = pathlib.Path(tabletune.__file__).resolve().parent
# front ends may reach the integrations (lazily, inside their commands); the core may not
FRONT_ENDS = ("tabletune.__main__", "tabletune.cli")


def core_modules():
    for info in pkgutil.walk_packages(tabletune.__path__, "tabletune."):
        if not info.name.startswith(NOT_CORE) and info.name != "tabletune.__main__":
            yield info.name


def is_front_end(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FRONT_ENDS)


def module_path(module: str) -> pathlib.Path:
    rel = pathlib.Path(*module.split(".")[1:])
    package = PACKAGE / rel / "__init__.py"
    return package if package.exists() else (PACKAGE / rel).with_suffix(".py")


def imported_names(path: pathlib.Path) -> set[str]:
    """Absolute module names imported anywhere in the file, inside functions too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_core_modules_import_no_heavy_framework():
    mods = sorted(core_modules())
    new_layout = ["tabletune.controller", "tabletune.controller.controller", "tabletune.controller.estimator",
                  "tabletune.controller.config", "tabletune.cost", "tabletune.policies", "tabletune.sim",
                  "tabletune.tuner", "tabletune.tuner.plan", "tabletune.assets"]
    assert set(new_layout) <= set(mods) and "tabletune.cli" in mods
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"print(','.join(sorted(h for h in {HEAVY!r} if h in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"core imports pulled in: {proc.stdout.strip()}"


def test_imported_names_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from tabletune import integrations\n    import tabletune.integrations.hf\n")
    assert {"tabletune.integrations", "tabletune.integrations.hf"} <= imported_names(src)


def test_core_modules_never_import_integrations():
    core = [m for m in core_modules() if not is_front_end(m)]
    assert {"tabletune.controller.controller", "tabletune.policies.disco", "tabletune.assets",
            "tabletune.tuner.files"} <= set(core)
    offenders = {m: sorted(n for n in imported_names(module_path(m)) if n.startswith("tabletune.integrations"))
                 for m in core}
    assert {m: names for m, names in offenders.items() if names} == {}
