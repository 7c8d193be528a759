import pytest

from tabletune.experiments.settings import EAGLE_DRAFT_SHARE, SETTINGS, TABLE1
from tabletune.profile import StepProfile


@pytest.fixture
def eagle(starter_8b):
    return StepProfile.load(starter_8b)


def test_eagle_setting_is_the_measured_profile(eagle):
    p = SETTINGS["eagle"].profile(eagle)
    for b in (1, 16, 128):
        for k in (0, 3, 7):
            assert p.step_ms(b, k) == pytest.approx(eagle.step_ms(b, k))


def test_ngram_removes_the_eagle_drafting_cost(eagle):
    p = SETTINGS["ngram-code-edit"].profile(eagle)
    t0 = eagle.step_ms(32, 0)
    assert p.step_ms(32, 5) == pytest.approx(eagle.step_ms(32, 5) - 5 * EAGLE_DRAFT_SHARE * t0)
    assert p.step_ms(32, 0) == pytest.approx(t0)


def test_parallel_block_pays_one_pass_whatever_k(eagle):
    p = SETTINGS["parallel-block"].profile(eagle)
    v = SETTINGS["ngram-code-edit"].profile(eagle)
    t0 = eagle.step_ms(8, 0)
    for k in (1, 4, 7):
        assert p.step_ms(8, k) - v.step_ms(8, k) == pytest.approx(0.15 * t0)


def test_drafter_costs_are_ordered(eagle):
    cost = {name: SETTINGS[name].profile(eagle).step_ms(1, 5) for name in TABLE1}
    assert cost["ngram-code-edit"] < cost["eagle"] < cost["draft-model"] < cost["weak-drafter"]


def test_split_cost_pays_the_setting_drafter_for_the_longest_chain(eagle):
    import numpy as np

    setting = SETTINGS["eagle"]
    cost = setting.cost(eagle, "split")
    t = SETTINGS["eagle"].profile(eagle)
    assert cost.mixed_ms(np.array([3, 3, 3, 3])) == pytest.approx(t.step_ms(4, 3))
    # ks (1, 1, 1, 5): verification at k_bar = 2, drafting d(b, k) = 0.04 k T0 at k_max = 5
    d = lambda k: EAGLE_DRAFT_SHARE * k * eagle.step_ms(4, 0)  # noqa: E731
    want = t.step_ms(4, 2) - d(2) + d(5)
    assert cost.mixed_ms(np.array([1, 1, 1, 5])) == pytest.approx(want)
    # the older one-constant rule charges half the per-k cost at k_max
    share = setting.cost(eagle, "share")
    t0 = t.step_ms(4, 0)
    assert share.mixed_ms(np.array([1, 1, 1, 5])) == pytest.approx(
        t0 + 0.5 * (t.step_ms(4, 5) - t0) + 0.5 * (t.step_ms(4, 2) - t0))
    with pytest.raises(ValueError):
        setting.cost(eagle, "bogus")


def test_ngram_split_is_per_token(eagle):
    import numpy as np

    cost = SETTINGS["ngram-code-edit"].cost(eagle)
    t = SETTINGS["ngram-code-edit"].profile(eagle)
    assert cost.mixed_ms(np.array([0, 4])) == pytest.approx(t.step_ms(2, 2))


def test_the_lab_costs_mixed_lengths_by_the_split_rule_unless_told(eagle):
    import numpy as np

    from tabletune.experiments.runner import Lab

    ks = np.array([1, 1, 1, 5])
    split, share = Lab(eagle), Lab(eagle, cost_rule="share")
    assert split.cost(SETTINGS["eagle"]).draft_grid is not None and share.cost(SETTINGS["eagle"]).draft_grid is None
    assert split.cost(SETTINGS["eagle"]).mixed_ms(ks) == pytest.approx(SETTINGS["eagle"].cost(eagle).mixed_ms(ks))
