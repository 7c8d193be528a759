import numpy as np
import pytest
from per_request_helpers import make_ctx, make_outcome, make_state, run_sim

from tabletune.errors import InputError
from tabletune.policies.disco import ConfidenceThreshold, DiscoPolicy, verified_labels
from tabletune.policies.disco_model import DiscoModel, roc_curve
from tabletune.policies.trace_fit import read_traces, trace_rows
from tabletune.sim.traces import draft_log
from tabletune.sim.workload import preset


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


def _auc(y, s):
    fpr, tpr, _ = roc_curve(y, s)
    return float(np.trapezoid(tpr, fpr))


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


def test_tau_replaces_the_classifier_threshold_and_a_higher_tau_drafts_less():
    top1 = np.tile(np.linspace(0.99, 0.3, 7), (4, 1))
    lengths = {}
    for tau in (0.3, 0.9):
        p = DiscoPolicy(make_ctx(), tau=tau)
        assert p.model.threshold == tau
        lengths[tau] = p.decide(make_state(top1)).ks
    assert (lengths[0.9] <= lengths[0.3]).all() and lengths[0.9].sum() < lengths[0.3].sum()
    with pytest.raises(InputError):
        DiscoPolicy(make_ctx(), tau=1.5)
