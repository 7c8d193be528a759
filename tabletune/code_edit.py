"""The ``code-edit`` workload: edits of HumanEval canonical solutions whose answers copy most of
the input, the case where prompt-lookup (n-gram) drafting does well.

Problem i (HumanEval order) gets edit ``EDITS[i % 3]``; the input code is the problem's prompt
followed by its canonical solution:

* ``rename``: rename the entry point's first parameter ``p`` to ``p_value`` (the original text,
  comments kept). Problems without a parameter get ``docstring`` instead.
* ``type-hints``: every annotation removed (``ast``), then "add type hints".
* ``docstring``: every docstring removed (``ast``), then "add a docstring to each function".

The rewritten inputs are printed by ``ast.unparse``, so they are valid Python without comments.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

EDITS = ("rename", "type-hints", "docstring")
REPLY = "Reply with the complete updated code only."


def build_code_edit_tasks(problems: Iterable[dict]) -> list[tuple[str, str]]:
    """(task id, user message) per HumanEval problem that parses; ids are ``<task_id>/<edit>``."""
    tasks = []
    for i, problem in enumerate(problems):
        code = problem["prompt"] + problem["canonical_solution"]
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        fn = _entry_point(tree, problem.get("entry_point", ""))
        kind = EDITS[i % len(EDITS)]
        if kind == "rename" and (fn is None or not fn.args.args):
            kind = "docstring"
        if kind == "rename":
            user = rename_task(code, tree, fn)
        elif kind == "type-hints":
            user = type_hints_task(tree)
        else:
            user = docstring_task(tree)
        tasks.append((f"{problem['task_id']}/{kind}", user))
    return tasks


def _entry_point(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def rename_task(code: str, tree: ast.Module, fn: ast.FunctionDef) -> str:
    old = fn.args.args[0].arg
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(tree)
                                                                         if isinstance(a, ast.arg)}
    new = f"{old}_value"
    while new in used:
        new += "_"
    return (f"Rename the parameter `{old}` of the function `{fn.name}` to `{new}` everywhere in this code. "
            f"{REPLY}\n\n{_fence(code)}")


def strip_annotations(tree: ast.Module) -> ast.Module:
    """A copy of ``tree`` with argument and return annotations removed (in place on the copy)."""
    tree = ast.parse(ast.unparse(tree))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                arg.annotation = None
            for arg in (node.args.vararg, node.args.kwarg):
                if arg is not None:
                    arg.annotation = None
    return tree


def strip_docstrings(tree: ast.Module) -> ast.Module:
    """A copy of ``tree`` without function docstrings (a ``pass`` where a body would be empty)."""
    tree = ast.parse(ast.unparse(tree))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def type_hints_task(tree: ast.Module) -> str:
    code = ast.unparse(strip_annotations(tree))
    return f"Add Python type hints to every function signature in this code. {REPLY}\n\n{_fence(code)}"


def docstring_task(tree: ast.Module) -> str:
    code = ast.unparse(strip_docstrings(tree))
    return f"Add a short docstring to every function in this code. {REPLY}\n\n{_fence(code)}"
