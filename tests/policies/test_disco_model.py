import json

import numpy as np
import pytest
from sklearn.metrics import roc_curve as sk_roc_curve

from tabletune.errors import InputError
from tabletune.policies.disco_model import DiscoModel, roc_curve, roc_threshold, train_disco
from tabletune.sim.traces import draft_log
from tabletune.sim.workload import preset


@pytest.fixture(scope="module")
def sim_log():
    return draft_log(preset("chat"), 4000, 7, seed=1).training_rows()


def auc(y, s):
    fpr, tpr, _ = roc_curve(y, s)
    return float(np.trapezoid(tpr, fpr))


def test_roc_threshold_hand_worked():
    # pos = neg = 3. Costs FPR + 3 FNR at thresholds inf,.9,.8,.7,.6,.5,.3:
    # 3, 2, 1, 4/3, 1/3, 2/3, 1  -> 0.6
    labels = [1, 1, 0, 1, 0, 0]
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.3]
    assert roc_threshold(labels, scores) == 0.6
    # false negatives at half price: 1/2, 1/3, 1/6, 1/2, 1/3, 2/3, 1 -> 0.8
    assert roc_threshold(labels, scores, fn_cost=0.5) == 0.8


def test_roc_curve_matches_sklearn():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.random(300), 2)  # rounded: many ties
    fpr, tpr, thr = roc_curve(y, s)
    sk_fpr, sk_tpr, sk_thr = sk_roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    np.testing.assert_allclose(thr[1:], sk_thr[1:])
    assert thr[0] == np.inf


def test_roc_needs_both_labels():
    with pytest.raises(ValueError, match="both labels"):
        roc_curve([1, 1], [0.2, 0.3])


def test_train_disco_learns_confidence_and_beats_top1_alone(sim_log, tmp_path):
    x, y = sim_log
    model = train_disco(x, y, trained_on="sim chat")
    assert model.coef[0] > 0  # higher top-1 probability -> more likely accepted
    p = model.accept_prob(x)
    # held out: fresh drafts of the same workload (another seed). Top-1 alone ranks tokens by its
    # probability; any classifier on top-1 alone is a monotone map of it and has the same AUC.
    x_new, y_new = draft_log(preset("chat"), 4000, 7, seed=2).training_rows()
    auc_model, auc_top1 = auc(y_new, model.accept_prob(x_new)), auc(y_new, x_new[:, 0])
    assert auc_model > 0.7 and auc_model >= auc_top1
    assert 0.0 < model.threshold < 1.0
    path = tmp_path / "disco.json"
    model.save(path)
    assert json.loads(path.read_text())["schema"] == "tabletune.disco_model"  # JSON, no pickle
    again = DiscoModel.load(path)
    np.testing.assert_allclose(again.accept_prob(x[:50]), p[:50])


def test_model_file_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "tabletune.disco_model", "version": 1, "features": ["top1_prob"],
                               "coef": [1.0, 2.0], "intercept": 0, "mean": [0], "scale": [1], "threshold": 0.5}))
    with pytest.raises(InputError, match="coef"):
        DiscoModel.load(bad)
