import gzip
import json

import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim
from sklearn.metrics import roc_curve as sk_roc_curve

from tabletune.errors import InputError
from tabletune.policies.disco import ConfidenceThreshold, DiscoPolicy, verified_labels
from tabletune.policies.disco_model import DiscoModel, roc_curve, roc_threshold, train_disco
from tabletune.policies.trace_fit import fit_ngram_table, read_traces, trace_rows
from tabletune.sim.traces import draft_log
from tabletune.sim.workload import preset


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


def test_verified_labels_censor_after_first_rejection():
    assert verified_labels(4, 2) == [1, 1, 0]  # the 4th token was never tested
    assert verified_labels(3, 3) == [1, 1, 1]
    assert verified_labels(2, 0) == [0]


def test_confidence_threshold_default_and_retune():
    rule = ConfidenceThreshold()
    assert rule.threshold == 0.4 and rule.keep_drafting(0.4) and not rule.keep_drafting(0.39)
    rule.observe([0.9, 0.8], 2)  # 2 tokens, one label only: no retune yet
    assert rule.threshold == 0.4
    # accepted tokens have p >= 0.7, rejected ones p <= 0.3: theta moves into (0.3, 0.7]
    for _ in range(5):
        rule.observe([0.9, 0.7, 0.3], 2)
        rule.observe([0.2, 0.95], 0)
    assert 0.3 < rule.threshold <= 0.7


def test_threshold_variant_stops_after_first_low_confidence_token():
    ctx = make_ctx()
    k_max = ctx.k_max
    top1 = np.full((3, k_max), 0.95)
    top1[1, 1] = 0.3  # request 1: position 2 below 0.4 -> verify 2 tokens
    top1[2, 0] = 0.1  # request 2: the first token is drafted, then it stops
    policy = DiscoPolicy(ctx, variant="threshold")
    ks = policy.decide(make_state(top1)).ks
    assert ks.tolist() == [k_max, 2, 1]


@pytest.fixture(scope="module")
def sim_log():
    return draft_log(preset("chat"), 4000, 7, seed=1).training_rows()


def test_train_disco_learns_confidence_and_beats_top1_alone(sim_log, tmp_path):
    x, y = sim_log
    model = train_disco(x, y, trained_on="sim chat")
    assert model.coef[0] > 0  # higher top-1 probability -> more likely accepted
    p = model.accept_prob(x)
    # held out: fresh drafts of the same workload (another seed). Top-1 alone ranks tokens by its
    # probability; any classifier on top-1 alone is a monotone map of it and has the same AUC.
    x_new, y_new = draft_log(preset("chat"), 4000, 7, seed=2).training_rows()
    auc_model, auc_top1 = _auc(y_new, model.accept_prob(x_new)), _auc(y_new, x_new[:, 0])
    assert auc_model > 0.7 and auc_model >= auc_top1
    assert 0.0 < model.threshold < 1.0
    path = tmp_path / "disco.json"
    model.save(path)
    assert json.loads(path.read_text())["schema"] == "tabletune.disco_model"  # JSON, no pickle
    again = DiscoModel.load(path)
    np.testing.assert_allclose(again.accept_prob(x[:50]), p[:50])


def _auc(y, s):
    fpr, tpr, _ = roc_curve(y, s)
    return float(np.trapezoid(tpr, fpr))


def test_model_file_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "tabletune.disco_model", "version": 1, "features": ["top1_prob"],
                               "coef": [1.0, 2.0], "intercept": 0, "mean": [0], "scale": [1], "threshold": 0.5}))
    with pytest.raises(InputError, match="coef"):
        DiscoModel.load(bad)


def test_classifier_policy_trains_online_and_stops_on_low_confidence(sim_log):
    ctx = make_ctx()
    policy = DiscoPolicy(ctx, variant="online", warmup_tokens=500)
    assert policy.model is None  # starts with the threshold rule
    rng = np.random.default_rng(0)
    x, y = sim_log
    for step in range(40):  # feed outcomes consistent with the log's confidence
        top1 = rng.uniform(0.05, 0.99, (32, ctx.k_max))
        state = make_state(top1, step=step)
        ks = policy.decide(state).ks
        ok = rng.random(top1.shape) < top1  # accepted with probability top1
        acc = np.where(ok.all(axis=1), ctx.k_max, np.argmin(ok, axis=1))
        policy.observe(make_outcome(state, ks, np.minimum(acc, ks)))
    assert policy.model is not None
    high = np.full((1, ctx.k_max), 0.97)
    low = high.copy()
    low[0, 2] = 0.05
    assert policy.decide(make_state(high)).ks[0] > policy.decide(make_state(low)).ks[0] == 3


def test_default_classifier_is_the_committed_sim_model():
    policy = DiscoPolicy(make_ctx())
    assert policy.model is not None and policy.model.features[0] == "top1_prob" and policy.model.coef[0] > 0
    assert policy.model.trained_on.startswith("sim presets")


def test_unknown_variant_is_an_input_error():
    with pytest.raises(InputError, match="disco.variant"):
        DiscoPolicy(make_ctx(), variant="psychic")


def test_trace_files_train_disco_and_the_ngram_table(tmp_path):
    rows = ["request,draft_start,draft_pos,gen_pos,top1_prob,entropy,margin,ngram_len,accept_prob,accepted"]
    rng = np.random.default_rng(0)
    for i in range(400):  # model drafter: accepted iff confident
        p = rng.uniform(0.05, 0.99)
        rows.append(f"r{i},0,{1 + i % 4},{i},{p:.3f},{-np.log(p):.3f},{p / 2:.3f},0,{p:.3f},{int(p > 0.5)}")
    for i in range(200):  # n-gram drafter (no probabilities): long matches accepted
        length = 2 + i % 10
        rows.append(f"n{i},0,1,{i},nan,nan,nan,{length},1,{int(length >= 6)}")
    path = tmp_path / "traces.csv.gz"
    path.write_bytes(gzip.compress("\n".join(rows).encode()))
    cols = read_traces(tmp_path)
    x, y = trace_rows(cols)
    assert x.shape == (400, 4)
    model = train_disco(x, y)
    assert model.accept_prob(np.array([[0.9, 0.1, 0.45, 1.0]]))[0] > 0.5 > model.accept_prob(
        np.array([[0.1, 2.3, 0.05, 1.0]]))[0]
    table = fit_ngram_table(cols, k_max=4)
    assert table.rates[9, 0] > 0.8 and table.rates[3, 0] < 0.2
    bad = tmp_path / "bad.csv"
    bad.write_text("draft_pos,accepted\n1,1\n")
    with pytest.raises(InputError, match="missing columns"):
        read_traces(bad)


@pytest.mark.parametrize("spec", ["disco", "disco:variant=threshold", "disco:variant=online"])
def test_disco_runs_in_simulator_within_k_max_and_is_deterministic(spec):
    seen = []
    result, policy = run_sim(spec, load=8, duration_s=2.0, seed=5, recorder=lambda d, s: seen.append(d.ks))
    ks = np.concatenate(seen)
    assert ks.min() >= 1 and ks.max() <= policy.ctx.k_max
    assert result.throughput_tok_s > 0
    again, _ = run_sim(spec, load=8, duration_s=2.0, seed=5)
    assert again.throughput_tok_s == result.throughput_tok_s


def test_policy_modules_import_neither_torch_nor_vllm_nor_sklearn():
    import subprocess
    import sys

    code = ("import sys\n"
            "import tabletune.policies.disco, tabletune.policies.tapout, tabletune.policies.dsde\n"
            "import tabletune.policies.gammatune, tabletune.policies.adaptive_verification\n"
            "import tabletune.policies.hybrid_spark, tabletune.policies.trace_fit\n"
            "print(sorted(m for m in ('torch', 'vllm', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_committed_trace_model_separates_accepted_tokens_in_the_measured_traces():
    from per_request_helpers import STARTER_8B

    root = STARTER_8B.parents[2]
    model = DiscoModel.load(root / "profiles" / "policies" / "disco-smollm2-early-exit.json")
    x, y = trace_rows(read_traces(root / "profiles" / "traces" / "early-exit_code_T0.csv.gz"))
    assert model.trained_on.startswith("traces") and _auc(y, model.accept_prob(x)) > 0.75
    result, _ = run_sim(f"disco:model={root / 'profiles' / 'policies' / 'disco-smollm2-early-exit.json'}",
                        load=4, duration_s=1.0)
    assert result.throughput_tok_s > 0
