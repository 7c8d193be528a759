import ast
import json
import subprocess
import sys

import pytest

from tabletune import assets
from tabletune.assets import Prompt, load_prompts, smollm2_chat_prompt
from tabletune.code_edit import build_code_edit_tasks, strip_annotations, strip_docstrings
from tabletune.errors import InputError


def test_import_pulls_in_neither_torch_nor_transformers():
    code = "import sys, tabletune.assets; print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name,count", [("code", 164), ("code-edit", 164), ("chat", 30), ("chat-ifeval", 541),
                                        ("math", 20), ("extraction", 10)])
def test_workload_sizes(name, count):
    prompts = load_prompts(name)
    assert len(prompts) == count
    assert len({p.id for p in prompts}) == count
    assert all(p.workload == name for p in prompts)


def test_chat_workloads_use_the_chat_template():
    first = load_prompts("chat", limit=1)[0]
    assert first == Prompt("mtbench/81", "chat", smollm2_chat_prompt(
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
        "and must-see attractions."))
    assert first.text.startswith("<|im_start|>system\n") and first.text.endswith("<|im_start|>assistant\n")
    ifeval = load_prompts("chat-ifeval", limit=1)[0]
    assert ifeval.id == "ifeval/1000" and ifeval.text.endswith("<|im_start|>assistant\n")
    assert "Write a 300+ word summary of the wikipedia page" in ifeval.text
    code = load_prompts("code", limit=1)[0]
    assert code.id == "HumanEval/0" and "def has_close_elements(numbers: List[float]" in code.text
    assert code.text.endswith("<|im_start|>assistant\n")


def test_limit():
    assert [p.id for p in load_prompts("math", limit=2)] == ["mtbench/101", "mtbench/102"]  # reasoning 101-110, math 111-120
    with pytest.raises(InputError, match="limit"):
        load_prompts("math", limit=0)


def test_unknown_workload_is_an_input_error():
    with pytest.raises(InputError, match="choose one of"):
        load_prompts("poetry")


PROBLEMS = [
    {"task_id": "T/0", "entry_point": "f", "prompt": "def f(xs: list, n: int) -> int:\n    \"\"\"Doc.\"\"\"\n",
     "canonical_solution": "    return len(xs) + n  # add\n"},
    {"task_id": "T/1", "entry_point": "g", "prompt": "def g(a: int) -> int:\n    \"\"\"Doc.\"\"\"\n",
     "canonical_solution": "    return a\n"},
    {"task_id": "T/2", "entry_point": "h", "prompt": "def h(s: str) -> str:\n    \"\"\"Doc.\"\"\"\n",
     "canonical_solution": "    return s\n"},
    {"task_id": "T/3", "entry_point": "z", "prompt": "def z():\n    \"\"\"Doc.\"\"\"\n",
     "canonical_solution": "    return 1\n"},
]


def test_code_edit_tasks_hand_worked():
    tasks = dict(build_code_edit_tasks(PROBLEMS))
    assert list(tasks) == ["T/0/rename", "T/1/type-hints", "T/2/docstring", "T/3/docstring"]  # z() has no parameter
    assert "Rename the parameter `xs` of the function `f` to `xs_value`" in tasks["T/0/rename"]
    assert "return len(xs) + n  # add" in tasks["T/0/rename"]  # original text, comment kept
    assert "def g(a):\n    \"\"\"Doc.\"\"\"\n    return a" in tasks["T/1/type-hints"]
    assert "def h(s: str) -> str:\n    return s" in tasks["T/2/docstring"]
    assert "def z():\n    return 1" in tasks["T/3/docstring"]


def test_strip_helpers_leave_valid_python():
    tree = ast.parse("def f(a: int, *b: str, c: float = 1.0, **d: bool) -> None:\n    'doc'\n")
    assert ast.unparse(strip_annotations(tree)).startswith("def f(a, *b, c=1.0, **d):")
    assert ast.unparse(strip_docstrings(tree)).endswith("-> None:\n    pass")


def test_rename_avoids_existing_names():
    problem = {"task_id": "T/9", "entry_point": "f", "prompt": "def f(x):\n", "canonical_solution": "    x_value = x\n"
               "    return x_value\n"}
    [(_, user)] = build_code_edit_tasks([problem])
    assert "to `x_value_`" in user


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"text": "raw prompt"}) + "\n\n" + json.dumps({"id": "q", "user": "hi",
                                                                            "workload": "w"}) + "\n")
    assert load_prompts(str(path)) == [Prompt("1", "mine", "raw prompt"), Prompt("q", "w", smollm2_chat_prompt("hi"))]


@pytest.mark.parametrize("line,problem", [('{"id": 1}', "exactly one of"), ('{"text": "a", "user": "b"}', "exactly one"),
                                          ("[1]", "JSON object"), ("{oops", "invalid JSON")])
def test_jsonl_errors(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InputError, match=problem):
        load_prompts(str(path))


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("TABLETUNE_CACHE", str(tmp_path))
    assert assets.cache_dir() == tmp_path
    monkeypatch.delenv("TABLETUNE_CACHE")
    assert assets.cache_dir().parts[-2:] == (".cache", "tabletune")


def test_assets_imports_nothing_from_integrations():
    tree = ast.parse(open(assets.__file__).read())
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert names and not [n for n in names if n.startswith("tabletune.integrations")]
