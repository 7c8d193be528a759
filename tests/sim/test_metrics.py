import numpy as np
import pytest

from tabletune.sim.metrics import RequestLog, SimResult, StepLog


def test_hand_worked_metrics():
    steps = StepLog(start_s=np.array([0.0, 0.5, 1.0]), step_ms=np.array([500.0, 500.0, 1000.0]),
                    batch_size=np.array([2, 2, 2]), mean_k=np.array([2.0, 1.0, 0.0]), tokens=np.array([6, 4, 2]),
                    drafted=np.array([4, 2, 0]), accepted=np.array([4, 2, 0]))
    reqs = RequestLog(arrival_s=np.array([0.0]), first_token_s=np.array([0.5]), finish_s=np.array([2.0]),
                      num_tokens=np.array([4]))
    r = SimResult("p", 2.0, steps, reqs)
    assert r.throughput_tok_s == 6.0 and r.mean_k == 1.0 and r.acceptance == 1.0
    assert r.tpot_ms == pytest.approx(500.0)
    assert r.window_throughput(1.0).tolist() == [6.0, 6.0]
    s = r.summary()
    assert s["steps"] == 3 and s["latency_p50_s"] == 2.0


def test_summary_has_no_nan():
    empty = RequestLog(*(np.zeros(0) for _ in range(4)))
    steps = StepLog(*(np.ones(1) for _ in range(7)))
    s = SimResult("p", 1.0, steps, empty).summary()
    assert s["tpot_ms"] is None and s["latency_p99_s"] is None
