"""The package's folders are floors: a module imports only its own folder and the floors below it (imports
inside functions count), so no two folders import each other and the core never reaches torch or vLLM."""

import ast
import pathlib

import tabletune

PACKAGE = pathlib.Path(tabletune.__file__).resolve().parent
# bottom first; "core" is the package's top-level modules (profile, goodput, table, cost, ...)
FLOORS = ("core", "controller", "tuner", "policies", "sim", "experiments", "integrations", "engine", "drafter", "cli")
CORE_FLOORS = FLOORS[: FLOORS.index("integrations")]  # pure Python + numpy: no torch, vllm, transformers, triton
HEAVY = ("torch", "vllm", "transformers", "triton")


def floor_of(module: str) -> str:
    """The floor of a module named ``tabletune.x.y``: its folder, "core" for a top-level module."""
    if module == "tabletune.__main__":
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "core"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = path
    return out


def imports(module: str, path: pathlib.Path) -> set[str]:
    """Every module name the file imports, anywhere in it (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def upward_imports() -> list[str]:
    found = []
    for module, path in sorted(modules().items()):
        here = FLOORS.index(floor_of(module))
        for name in sorted(imports(module, path)):
            if name.startswith("tabletune.") and FLOORS.index(floor_of(name)) > here:
                found.append(f"{module} ({floor_of(module)}) imports {name} ({floor_of(name)})")
    return found


def test_every_folder_is_on_a_floor():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders <= set(FLOORS), f"place {sorted(folders - set(FLOORS))} in FLOORS"


def test_no_import_runs_up_a_floor():
    """Hence no folder imports one that imports it back: policies never import sim, the engine never the
    drafter, the integrations neither the engine nor the drafter."""
    assert upward_imports() == []


def test_the_core_never_imports_a_heavy_framework():
    offenders = {m: sorted(n for n in imports(m, p) if n.split(".")[0] in HEAVY)
                 for m, p in modules().items() if floor_of(m) in CORE_FLOORS}
    assert {m: names for m, names in offenders.items() if names} == {}


def test_the_check_sees_relative_imports_and_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from ..sim import loop\n    import torch.nn\n")
    assert {"tabletune.sim", "tabletune.sim.loop", "torch.nn"} <= imports("tabletune.policies.m", src)
    assert floor_of("tabletune.sim.loop") == "sim" and floor_of("tabletune.cost") == "core"
    assert floor_of("tabletune.sim") == "sim" and floor_of("tabletune.__main__") == "cli"
    assert floor_of("tabletune.fileio.atomic_path") == "core"
