import pytest

from tabletune.acceptance import AcceptanceCounts
from tabletune.goodput import DraftYield
from tabletune.optimizer import OptimizeOptions, optimize_yields
from tabletune.profile import StepPoint, StepProfile
from tabletune.tuner.yields import measure_yields, yield_from_counts


def counts(drafts: list[tuple[int, int]], undrafted: int) -> AcceptanceCounts:
    c = AcceptanceCounts(k_max=4)
    for k, m in drafts:
        c.observe_draft(k, m)
    c.observe_undrafted(undrafted)
    return c


def test_yield_from_counts_hand_worked():
    # 3 drafts accepting 2, 0, 4 tokens and 5 undrafted request-steps: 6 accepted over 8 request-steps
    y = yield_from_counts(4, counts([(4, 2), (4, 0), (4, 4)], 5))
    assert y == DraftYield(4, 1.0 + 6 / 8, 3 / 8)
    assert yield_from_counts(0, counts([], 3)) == DraftYield(0, 1.0, 0.0)


class FakeEngine:
    """Acceptance by k: a short k drafts more often (more steps inside matched spans)."""

    def __init__(self):
        self.asked = []

    def measure_acceptance(self, prompts, k, max_tokens):
        self.asked.append(k)
        return counts([(k, k)] * (10 - k), 2 * k)


def test_measure_yields_runs_every_k_and_the_table_follows_them():
    engine = FakeEngine()
    yields = measure_yields(engine, ["p"], (0, 1, 2, 3), 64)
    assert engine.asked == [1, 2, 3]
    assert [y.draft_rate for y in yields] == pytest.approx([0.0, 9 / 11, 8 / 12, 7 / 13])
    # T(b, k) = 10 + b (1 + k): drafting gets dear with b, so k falls as b grows
    prof = StepProfile(points=tuple(StepPoint(b, k, (10.0 + b * (1 + k),)) for b in (1, 64) for k in range(4)),
                       context_len=0)
    result = optimize_yields(prof, yields, 1.0, OptimizeOptions(max_batch=64))
    dense = result.table.dense(64)
    assert dense[1] == 3 and dense[64] < 3
    with pytest.raises(ValueError, match="no allowed draft length"):
        optimize_yields(prof, yields[1:], 1.0, OptimizeOptions(max_batch=64, ks=(0,)))
    with pytest.raises(ValueError):
        DraftYield(2, 3.5, 0.5)
