from pathlib import Path

import numpy as np
import pytest

from tabletune.acceptance import AcceptanceProfile
from tabletune.experiments.runner import Lab
from tabletune.experiments.settings import SETTINGS, TABLE1
from tabletune.policies.base import NGRAM

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def test_every_setting_names_measured_h200_steps_and_measured_acceptance():
    assert TABLE1 == ("eagle", "draft-model", "parallel-block", "ngram-code-edit", "32b", "moe")
    for setting in SETTINGS.values():
        fp = setting.step_profile(PROFILES).fingerprint
        assert fp.device == "NVIDIA H200" and fp.engine == "builtin", setting.name
        entry = AcceptanceProfile.load(PROFILES / setting.acceptance).select()
        assert entry.num_drafts > 0 and entry.temperature == 0.0
        assert setting.workload(PROFILES).rates == pytest.approx(entry.known_rates(), abs=1e-9)
    assert SETTINGS["ngram-code-edit"].default_drafter == NGRAM
    assert (PROFILES / SETTINGS["ngram-code-edit"].ngram_trace).is_file()
    # the paper's targets: 8B with four drafters, 32B and the MoE
    models = {n: SETTINGS[n].step_profile(PROFILES).fingerprint.model.split()[0] for n in TABLE1}
    assert models == {"eagle": "qwen3-8b", "draft-model": "qwen3-8b", "parallel-block": "qwen3-8b",
                      "ngram-code-edit": "qwen3-8b", "32b": "qwen3-32b", "moe": "qwen3-30b-a3b"}


def test_the_lab_costs_mixed_steps_with_its_draft_share():
    lab = Lab(PROFILES, draft_share=0.25)
    cost = lab.cost(SETTINGS["eagle"])
    t = cost.profile
    assert cost.mixed_ms(np.array([1, 1, 1, 5])) == pytest.approx(
        t.step_ms(4, 0) + 0.25 * (t.step_ms(4, 5) - t.step_ms(4, 0)) + 0.75 * (t.step_ms(4, 2) - t.step_ms(4, 0)))
    assert cost.mixed_ms(np.array([3, 3])) == pytest.approx(t.step_ms(2, 3))


def test_calibration_recovers_the_measured_rates():
    lab = Lab(PROFILES, duration_s=2.0)
    setting = SETTINGS["eagle"]
    rates, q = lab.measured_prior(setting)
    assert q == 1.0
    assert rates == pytest.approx(setting.workload(PROFILES).rates[:7], abs=0.05)


def test_ngram_calibration_measures_a_draft_rate_and_yields_per_k():
    lab = Lab(PROFILES, duration_s=2.0)
    setting = SETTINGS["ngram-code-edit"]
    _, q = lab.measured_prior(setting)
    # the recorded run (k = 8) drafted in 91 of 156 request-steps (0.58); the replay at k = 7 is close
    assert 0.5 < q < 0.7
    yields = lab.measured_yields(setting)
    assert [y.k for y in yields] == list(range(8))
    assert yields[0].tokens_per_step == 1.0 and yields[0].draft_rate == 0.0
    tokens = [y.tokens_per_step for y in yields]
    assert tokens == sorted(tokens)
    # a shorter k spends more steps inside matched spans: q falls as k grows
    assert yields[1].draft_rate > yields[7].draft_rate + 0.1
    assert lab.measured_yields(SETTINGS["eagle"]) == ()
