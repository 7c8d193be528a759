import gzip

import numpy as np
import pytest

from tabletune.sim.traces import auc, signal_noise_for_auc, trace_top1_auc
from tabletune.sim.workload import Workload


def test_auc_hand_worked():
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)  # ties count half
    with pytest.raises(ValueError):
        auc([0.1, 0.2], [1, 1])


def test_trace_auc_reads_issue7_csv(tmp_path):
    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("request,draft_pos,top1_prob,accepted\n")
        fh.write("a,1,0.9,1\na,2,0.2,0\nb,1,0.7,1\nb,2,0.8,0\nc,1,,1\n")
    value, n = trace_top1_auc(str(path))
    assert n == 4 and value == pytest.approx(0.75)


def test_fitted_noise_moves_the_auc_the_right_way():
    w = Workload("w", (0.8, 0.7, 0.6))
    noisy = signal_noise_for_auc(0.70, w, k_max=3, num_drafts=500)
    clean = signal_noise_for_auc(0.90, w, k_max=3, num_drafts=500)
    assert noisy > clean > 0
    assert np.isfinite(noisy)
