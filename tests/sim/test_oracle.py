"""The headroom oracle on a hand-worked trace."""

import numpy as np
import pytest

from tabletune.policies import make_policy
from tabletune.sim import Schedule, SimConfig, Simulator, Workload
from tabletune.sim.oracle import FateOracle, headroom_share, oracle_lengths, oracle_ratio
from tabletune.sim.replay import TraceStreams

from test_stop_loop import stop_cost

# one cyclic stream: rows 0..4 accepted 1, 1, 1, 0, 0; k_max 3; T(1, k) = 11 + 4k
TRACE = TraceStreams(np.full(5, 0.5), np.full(5, 1.0), np.full(5, 0.2), np.array([1, 1, 1, 0, 0], bool),
                     np.zeros(5, np.int64))


def tok_s(policy_of, cost=None) -> float:
    w = Workload("w", rates=(0.6, 0.6, 0.6), heterogeneity=0.0, output_len=10**9, prompt_len_mean=0.0)
    sim = Simulator(cost or stop_cost(), Schedule.constant(w), SimConfig(duration_s=30.0, load=1, seed=0),
                    replay=TRACE)
    return sim.run(policy_of(sim.context())).throughput_tok_s


def test_oracle_ratio_on_a_hand_worked_trace():
    # oracle: at row 0 the run is 3: c = 3 gives 4 tokens / 23 ms > c = 2's 3 / 19 > c = 1's 2 / 15; then at
    # row 4 the run is 0: 1 token / 11 ms; back at row 0. Cycle: 5 tokens in 34 ms = 147.06 tok/s.
    oracle = tok_s(FateOracle)
    assert oracle == pytest.approx(5000 / 34, rel=0.01)
    # fixed k: k=1 rows 0, 2, 4: 2 + 2 + 1 tokens in 3 x 15 ms = 111.1 (best); k=3: 4 + 1 in 46 ms = 108.7;
    # k=2: rows 0, 3, 4: 3 + 1 + 1 in 57 ms = 87.7; k=0: 1 / 11 ms = 90.9
    fixed = {k: tok_s(lambda ctx, k=k: make_policy(f"fixed:{k}", ctx)) for k in range(4)}
    assert fixed[1] == pytest.approx(5000 / 45, rel=0.01) and fixed[3] == pytest.approx(5000 / 46, rel=0.01)
    assert fixed[2] == pytest.approx(5000 / 57, rel=0.01) and max(fixed, key=fixed.get) == 1
    ratio = oracle_ratio(oracle, max(fixed.values()))
    assert ratio == pytest.approx(45 / 34, rel=0.01)
    assert headroom_share(fixed[3] / fixed[1], ratio) == pytest.approx((45 / 46 - 1) / (45 / 34 - 1), rel=0.05)
    assert headroom_share(1.2, 1.0) is None
    # it knows the fates before drafting, so its plan runs fused: a split step's extra (5 ms) is not its to pay
    import dataclasses

    assert tok_s(FateOracle, dataclasses.replace(stop_cost(), split_extra=((1, 5.0),))) == pytest.approx(oracle)


def test_oracle_lengths_cut_runs_that_cost_more_than_they_earn():
    from tabletune.policies.base import BatchState, PolicyContext

    ctx = PolicyContext(cost=stop_cost(), prior_rates=(0.5,) * 3, ks=(0, 1, 2, 3))
    assert oracle_lengths(np.array([3, 0]), ctx).tolist() == [3, 0]  # never a rejected token
    # b = 2, runs (1, 0): c = 1: 3 tokens / T(2; (1, 0)) = 3 / (V~(2, 0.5) + D(1, 1)) = 3 / (14 - 1 + 1) = 0.214
    # > c = 0's 2 / 12 = 0.167
    assert oracle_lengths(np.array([1, 0]), ctx).tolist() == [1, 0]
    with pytest.raises(ValueError, match="fate"):
        FateOracle(ctx).decide(BatchState(0, 0.0, np.arange(2), np.zeros(2, np.int64)))


def test_oracle_takes_the_ngram_chain_when_its_run_is_longer():
    from tabletune.sim.replay import NgramStreams

    # the model chain is always rejected at once; the n-gram chain proposes 3 accepted tokens everywhere:
    # the oracle takes 3 n-gram tokens a step with no model drafting: 4 tokens in V~(1, 3) = T(1, 3) - D(1, 3)
    # = 23 - 3 = 20 ms = 200 tok/s (model alone: 1 / 11 ms)
    model = TraceStreams(np.full(4, 0.5), np.full(4, 1.0), np.full(4, 0.2), np.zeros(4, bool), np.zeros(4, np.int64))
    ngram = NgramStreams(np.ones(4, bool), np.full(4, 3, np.int64), np.full(4, 5, np.int64))
    w = Workload("w", rates=(0.6, 0.6, 0.6), heterogeneity=0.0, output_len=10**9, prompt_len_mean=0.0)
    sim = Simulator(stop_cost(), Schedule.constant(w), SimConfig(duration_s=10.0, load=1, seed=0), replay=model,
                    ngram_replay=ngram)
    assert sim.run(FateOracle(sim.context())).throughput_tok_s == pytest.approx(4000 / 20, rel=0.01)
    alone = Simulator(stop_cost(), Schedule.constant(w), SimConfig(duration_s=10.0, load=1, seed=0), replay=model)
    assert alone.run(FateOracle(alone.context())).throughput_tok_s == pytest.approx(1000 / 11, rel=0.01)
