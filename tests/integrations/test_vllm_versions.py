"""vLLM version handling: the range, what each version has, and how acceptance is forced (no vLLM needed)."""

import pytest

from tabletune.errors import InputError
from tabletune.integrations.vllm import versions


@pytest.mark.parametrize("text, want", [("0.26.0", (0, 26, 0)), ("0.32.0+cpu", (0, 32, 0)),
                                        ("0.26.1.dev3+g1234", (0, 26, 1)), ("1.2", (1, 2, 0))])
def test_parse(text, want):
    assert versions.parse(text) == want


def test_check_refuses_versions_without_per_batch_tables_and_warns_outside_the_tested_range():
    with pytest.raises(InputError, match="0.24.0 or later"):
        versions.check("0.23.1")
    assert versions.check("0.26.0") is None
    assert versions.check("0.32.0+cpu") is None
    assert versions.check("0.29.3") is None
    assert "outside the tested range 0.26.0..0.32.0" in versions.check("0.25.0")
    assert "outside the tested range" in versions.check("0.33.0")


def test_adaptive_verification_starts_at_0_28():
    assert not versions.has_adaptive_verification("0.26.0")
    assert versions.has_adaptive_verification("0.28.0")


def test_unconditional_rates_are_the_running_products_and_zero_past_the_given():
    assert versions.unconditional_rates([0.8, 0.5, 0.5], 4) == [0.8, 0.4, 0.2, 0.0]


def test_gpu_forces_acceptance_with_vllms_synthetic_sampler_and_cpu_with_the_cap():
    config, cap = versions.forced_acceptance([0.9, 0.5], 2, on_cpu=False)
    assert not cap
    assert config == {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.45]}
    assert versions.forced_acceptance([0.9, 0.5], 2, on_cpu=True) == ({}, True)


def test_the_installed_vllm_is_in_range():
    vllm = pytest.importorskip("vllm")
    assert versions.check(vllm.__version__) is None
