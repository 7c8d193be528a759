import pathlib

import pytest
from hypothesis import settings

# No per-example deadline: these properties are about results, and on a busy two-core machine one example can take
# longer than hypothesis's 200 ms (seen once: a JSON fuzz example at 266 ms while another process compiled)
settings.register_profile("tabletune", deadline=None)
settings.load_profile("tabletune")

ROOT = pathlib.Path(__file__).resolve().parents[1]
STARTER = ROOT / "profiles" / "starter"


@pytest.fixture
def starter_8b():
    return STARTER / "h200_qwen3-8b-shape_ctx1024_eagle-like.csv"


@pytest.fixture
def starter_32b():
    return STARTER / "h200_qwen3-32b-shape_ctx1024_eagle-like.csv"
