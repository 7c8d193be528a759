import logging

import pytest


@pytest.fixture(autouse=True)
def engine_log_settings(monkeypatch):
    """`tabletune tune` sets the engines' log environment and the vllm logger's level at its entry;
    in-process CLI tests put both back afterwards."""
    for name in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    yield
    vllm_logger.setLevel(level)
