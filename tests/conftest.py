import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
STARTER = ROOT / "profiles" / "starter"


@pytest.fixture
def starter_8b():
    return STARTER / "h200_qwen3-8b-shape_ctx1024_eagle-like.csv"


@pytest.fixture
def starter_32b():
    return STARTER / "h200_qwen3-32b-shape_ctx1024_eagle-like.csv"
