"""The static-mode engine asks vLLM for at most the memory free when it starts, less the 10% of the card vLLM's
default leaves (a vLLM start refuses more, and its steps overrun its profile by about 1 GiB)."""

import pytest

from tabletune.integrations.vllm import static_engine, tuner_engine
from tabletune.tuner import EngineSpec

GIB = 1 << 30


@pytest.mark.parametrize("flags, want", [
    # the H100 case: 63.28 of 79.18 GiB free after the tuning engine closed, 0.9 asked
    (("--gpu-memory-utilization", "0.9", "--max-model-len", "10240"), ("--max-model-len", "10240",
                                                                      "--gpu-memory-utilization", "0.69")),
    (("--gpu-memory-utilization=0.9",), ("--gpu-memory-utilization", "0.69")),
    ((), ("--gpu-memory-utilization", "0.69")),  # vLLM's default 0.9 does not fit either
    (("--gpu-memory-utilization", "0.5"), ("--gpu-memory-utilization", "0.5")),  # fits: unchanged
    (("--gpu-memory-utilization", "0.7"), ("--gpu-memory-utilization", "0.69")),  # leaves 10% of the card free
])
def test_utilization_is_lowered_to_what_is_free(flags, want):
    assert static_engine.fit_memory_flags(flags, int(63.28 * GIB), int(79.18 * GIB)) == want


def test_start_static_passes_the_fitted_flags_to_the_child(monkeypatch):
    seen = {}

    class Child:
        def __init__(self, spec, k):
            seen.update(flags=spec.engine_args, k=k)

    monkeypatch.setattr("tabletune.integrations.vllm.static_engine.StaticEngine", Child)
    spec = EngineSpec(model="qwen3-8b", method="ngram", k_max=7, max_batch_size=256,
                      engine_args=("--gpu-memory-utilization", "0.9"))
    tuner_engine.start_static(spec, 3, memory=lambda: (40 * GIB, 80 * GIB))
    assert seen == {"flags": ("--gpu-memory-utilization", "0.40"), "k": 3}
    tuner_engine.start_static(spec, 3, memory=lambda: None)  # CPU: as given
    assert seen["flags"] == ("--gpu-memory-utilization", "0.9")


@pytest.mark.parametrize("cap, want", [
    (256, (1, 16, 256)),  # holds every size: unchanged
    (100, (1, 16, 64)),  # the largest measured size it holds stands in for 256
    (10, (1, 4)),
    (0, ()),  # holds none: no check
])
def test_static_check_keeps_the_sizes_the_static_engine_holds(cap, want):
    from rich.console import Console

    from tabletune.cli.tune import static_sizes
    from tabletune.tuner.budget import BatchCap

    got = static_sizes((1, 16, 256), (1, 4, 16, 64, 256), BatchCap(1024, cap, 256), Console(quiet=True))
    assert got == want
