"""Ragged steps: per-request k, split draft/verify phases, draft signals, trace replay, policies on the engine."""

import math
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.engine.drafters import NgramDrafter, ReplayDrafter, draft_signals, make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, policy_context  # noqa: E402
from tabletune.engine.trace_replay import TracedReplayDrafter  # noqa: E402
from tabletune.policies import make_policy  # noqa: E402
from tabletune.policies.base import MODEL, NGRAM, Decision  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402
from tabletune.token_trace import TokenTrace, load_token_traces, pair_traces  # noqa: E402


class RandomKs:
    """Test policy: a random k_i per request every step (and a random drafter kind when ``kinds``)."""

    name = "random-ks"
    uses_features = False

    def __init__(self, k_max, seed, kinds=False):
        self.rng, self.k_max, self.kinds = np.random.default_rng(seed), k_max, kinds
        self.outcomes, self.asked = [], []

    def decide(self, state):
        ks = self.rng.integers(0, self.k_max + 1, state.batch_size)
        self.asked.append(ks)
        kinds = self.rng.integers(0, 2, state.batch_size) if self.kinds else None
        return Decision.per_request(ks, kinds)

    def observe(self, outcome):
        self.outcomes.append(outcome)


def _engine(target, drafter, k_max=4, max_num_seqs=4, max_len=80, temperature=0.0, split=False):
    d = drafter if not isinstance(drafter, str) else make_drafter(drafter, target, k_max, draft_cfg=PRESETS["tiny"])
    return SpecEngine(target, d, EngineConfig(max_num_seqs=max_num_seqs, max_len=max_len, k_max=k_max,
                                              temperature=temperature, split_steps=split))


def _code_traces(n):
    """The first n paired code traces (early exit's model chain, the n-gram chain)."""
    model = load_token_traces("profiles/traces/early-exit_code_T0.csv.gz")
    ngram = load_token_traces("profiles/traces/ngram_code_T0.csv.gz")
    return pair_traces(model, ngram)[:n]


def _traced_engine(target):
    """A split-step engine on the traced replay, and its policy context (prior and n-gram rates given)."""
    engine = _engine(target, TracedReplayDrafter(), split=True)
    return engine, policy_context(engine, prior_rates=(0.7, 0.6, 0.5, 0.4), ngram_rates=(0.0, 0.3, 0.5, 0.6, 0.7))


def _serve(engine, prompts, policy, max_new=20, oracle=None, traces=None, **kw):
    reqs = [Request(list(p), max_new, i, oracle=None if oracle is None else oracle[i],
                    trace=None if traces is None else traces[i]) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, policy, **kw).run(reqs)
    return [r.output for r in reqs], stats


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    rng = random.Random(1)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 16))] for _ in range(4)]
    base, _ = _serve(_engine(target, "ngram"), prompts, DraftTable.fixed(0), max_new=24)
    return target, prompts, base


@pytest.mark.parametrize("drafter", ["ngram", "eagle", "parallel_block",
                                     pytest.param("draft_model", marks=pytest.mark.slow)])
def test_greedy_outputs_identical_under_random_per_request_k(tiny, drafter):
    target, prompts, base = tiny
    for seed in (0, 1, 2):
        policy = RandomKs(4, seed)
        out, stats = _serve(_engine(target, drafter), prompts, policy, max_new=24)
        assert out == base, (drafter, seed)
        ks = np.concatenate([o.ks for o in policy.outcomes])
        assert len(set(ks.tolist())) > 2  # the steps really were ragged
        assert all((o.accepted <= o.ks).all() for o in policy.outcomes)


def test_replay_of_the_oracle_accepts_every_verified_draft_under_random_k(tiny):
    target, prompts, base = tiny
    oracle = [b + [0] * 8 for b in base]
    policy = RandomKs(4, 7)
    out, stats = _serve(_engine(target, ReplayDrafter()), prompts, policy, max_new=24, oracle=oracle)
    assert out == base
    for o in policy.outcomes:  # the oracle is the target's path: every verified draft passes, tail aside
        full = o.state.num_generated + o.ks < 24
        assert (o.accepted[full] == o.ks[full]).all()


@pytest.mark.parametrize("name", ["disco:variant=threshold", "controller:per-request,stop=1", "vllm-av:warmup_steps=2",
                                  pytest.param("tapout", marks=pytest.mark.slow),
                                  pytest.param("adaptive-verification", marks=pytest.mark.slow)])
def test_feature_policies_on_split_steps_stay_lossless(tiny, name):
    """Draft phase (k_max drafts of an EAGLE head of random weights), the policy on their signals, verify phase."""
    target, prompts, base = tiny
    engine = _engine(target, "eagle", split=True)
    policy = make_policy(name, policy_context(engine))
    seen = []
    observe = policy.observe
    policy.observe = lambda o: (seen.append(o), observe(o))
    out, stats = _serve(engine, prompts, policy, max_new=24)
    assert out == base, name
    assert all(o.state.features.top1_prob.shape == (o.state.batch_size, 4) for o in seen)
    # the verified positions carry real signals, not the one-hot defaults (a row that stopped reads 0 past its stop)
    top1 = np.concatenate([o.state.features.top1_prob[np.arange(4)[None, :] < o.ks[:, None]] for o in seen])
    assert len(top1) and ((top1 > 0) & (top1 <= 1)).all() and top1.std() > 0


def test_feature_policies_need_split_steps(tiny):
    target, _, _ = tiny
    engine = _engine(target, "eagle")
    with pytest.raises(ValueError, match="split_steps"):
        Scheduler(engine, make_policy("tapout", policy_context(engine)))


def test_draft_signals_hand_worked():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    sig = draft_signals(torch.log(p), 0.0)[0]
    entropy = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))  # 1.0297
    assert torch.allclose(sig, torch.tensor([0.5, entropy, 0.2]), atol=1e-5)
    # T = 2: softmax(log p / 2) = sqrt(p) / sum sqrt(p)
    q = p.sqrt() / p.sqrt().sum()
    assert abs(float(draft_signals(torch.log(p), 2.0)[0, 0]) - float(q[0, 0])) < 1e-6


def test_ngram_match_length_and_proposals_hand_worked(tiny):
    """History 5 6 7 5 6 (start = 4): the suffix "5 6" matched at 0..1 (n = 2; "7 5 6" never came before), so the
    drafts are what followed it, 7 5 6 (3 real tokens; the 4th repeats the last). History 1 2 3: no match."""
    target, _, _ = tiny
    engine = _engine(target, NgramDrafter())
    engine.history[0, :5] = torch.tensor([5, 6, 7, 5, 6])
    engine.history[1, :3] = torch.tensor([1, 2, 3])
    engine.drafter.begin(torch.tensor([0, 1]), torch.tensor([4, 2]), torch.tensor([6, 3]), 4)
    assert engine.drafts[0].tolist() == [7, 5, 6, 6]
    assert engine.draft_meta[:2, 0].tolist() == [2, 0] and engine.draft_meta[:2, 1].tolist() == [3, 0]


def test_ngram_rows_verify_only_their_real_drafts(tiny):
    target, prompts, base = tiny
    engine = _engine(target, "ngram")
    policy = RandomKs(4, 3)
    out, stats = _serve(engine, prompts, policy, max_new=24)
    assert out == base
    # rows that asked for drafts but had no match verified nothing: counted as undrafted, not as drafts
    undrafted = sum(int(((a > 0) & (o.ks == 0)).sum()) for a, o in zip(policy.asked, policy.outcomes))
    assert undrafted > 0 and stats.counts.undrafted == undrafted
    assert stats.counts.num_drafts == sum(int((o.ks > 0).sum()) for o in policy.outcomes)


def _trace(accepted, top1=None):
    n = len(accepted)
    top1 = np.full(n, 0.9) if top1 is None else np.asarray(top1)
    sig = np.stack([top1, 1 - top1, top1 - 0.05], axis=1).astype(np.float32)
    return TokenTrace("r", sig, np.asarray(accepted, bool), np.ones(n, bool), np.full(n, 3))


def test_trace_replay_accepts_the_recorded_run_and_stays_lossless(tiny):
    """Trace accepted flags 1 1 0 1 by output position (wrapping: g = 5 reads flag 1, ...) and fixed k = 3.
    First draft at g = 1: flags 1 1 0, accepts 2 and emits 3 tokens (g = 1..3). Next at g = 4: flags of g = 4, 5, 6
    are 1, 1, 1: accepts 3, emits 4 (g = 4..7). Next at g = 8: 1, 1, 1 again: accepts 3."""
    target, prompts, base = tiny
    oracle = [b + [0] * 8 for b in base]
    trace = _trace([1, 1, 0, 1])
    engine = _engine(target, TracedReplayDrafter())
    policy = RandomKs(0, 0)
    policy.decide = lambda state: Decision.batch(3)
    policy.observe = policy.outcomes.append
    out, _ = _serve(engine, prompts[:1], policy, max_new=13, oracle=oracle, traces=[(trace, None)])
    assert out == [base[0][:13]]
    assert [int(o.accepted[0]) for o in policy.outcomes][:3] == [2, 3, 3]


@pytest.mark.parametrize("name", ["fixed:2", "tabletune", "gammatune", "dsde", "hybrid-spark", "hybrid-static",
                                  "disco"])
def test_policies_run_on_the_traced_replay_engine_losslessly(tiny, name):
    target, prompts, base = tiny
    oracle = [b + [0] * 8 for b in base]
    traces = _code_traces(len(prompts))
    engine, ctx = _traced_engine(target)
    policy = make_policy(name, ctx)
    seen, reads = [], []
    observe = policy.observe
    policy.observe = lambda o: (seen.append(o), observe(o))
    copy_drafts = engine.copy_drafts
    engine.copy_drafts = lambda *a: (reads.append(a), copy_drafts(*a))[1]
    out, stats = _serve(engine, prompts, policy, max_new=24, oracle=oracle, traces=traces)
    assert out == base
    assert sum(int(o.accepted.sum()) for o in seen) > 0
    if name == "hybrid-spark":
        assert {int(x) for o in seen for x in o.drafter} <= {MODEL, NGRAM}
    if name == "hybrid-static":  # before drafting, on the lookup alone: its matches on the n-gram chain
        assert all(o.state.features is None and o.state.ngram_match_len is not None for o in seen)
        assert all(((o.drafter == NGRAM) == ((o.state.ngram_match_len >= 1) & (o.state.ngram_num_proposed > 0))).all()
                   for o in seen)
        assert any((o.drafter == NGRAM).any() for o in seen) and any((o.drafter == MODEL).any() for o in seen)
        assert reads == []  # no stop rule and no signal used: nothing read back from the drafting at all


@pytest.mark.parametrize("name", ["hybrid-static", "controller:per-request"])
def test_a_plan_made_before_drafting_runs_fused_and_accepts_what_a_split_step_accepts(tiny, name):
    """No stop rule and no drafted signal read: a step runs as one graph with the plan's ragged ks and chains, and
    is split only where its n-gram rows verify more than its longest model draft; step by step it accepts what the
    same plan accepts split throughout (``split_plans=True``); both lossless. The code traces put rows on the n-gram
    chain, so each row's chain counts."""
    def outruns(o):  # an n-gram row verifies more than the longest model draft
        ng = o.drafter == NGRAM
        return ng.any() and o.ks[ng].max() > o.ks[~ng].max(initial=0)

    target, prompts, base = tiny
    oracle = [b + [0] * 8 for b in base]
    traces = _code_traces(len(prompts))
    runs = {}
    for split in (False, True):
        engine, ctx = _traced_engine(target)
        policy = make_policy(name, ctx)
        seen, paths = [], []
        observe = policy.observe
        policy.observe = lambda o, seen=seen, observe=observe: (seen.append(o), observe(o))
        for method, path in (("launch", "fused"), ("verify_drafted", "split")):
            f = getattr(engine, method)
            setattr(engine, method, lambda *a, f=f, p=path, **kw: (paths.append(p), f(*a, **kw))[1])
        out, _ = _serve(engine, prompts, policy, max_new=24, oracle=oracle, traces=traces, split_plans=split)
        assert out == base, (name, split)
        runs[split] = seen, paths
    (fused, paths), (split, split_paths) = runs[False], runs[True]
    assert set(split_paths) == {"split"}
    assert paths == ["split" if outruns(o) else "fused" for o in fused]
    assert "split" in paths
    assert any(p == "fused" and (o.drafter == NGRAM).any() and (o.drafter == MODEL).any()
               for p, o in zip(paths, fused))
    assert [o.ks.tolist() for o in fused] == [o.ks.tolist() for o in split]
    assert [o.drafter.tolist() for o in fused] == [o.drafter.tolist() for o in split]
    assert [o.accepted.tolist() for o in fused] == [o.accepted.tolist() for o in split]


def test_a_draft_cap_known_up_front_shortens_the_draft_phase(tiny):
    """A policy's optional draft_cap(state) sizes the split step's draft phase: DISCO's threshold rule then sees
    positions 3..4 as sure rejections (top-1 0) and never verifies more than 2 drafts; outputs stay lossless."""
    target, prompts, base = tiny
    engine = _engine(target, "eagle", split=True)
    policy = make_policy("disco:variant=threshold,threshold=0.0", policy_context(engine))
    policy.draft_cap = lambda state: 2
    drafted = []
    draft_position = engine.draft_position
    engine.draft_position = lambda slots, j, k: (drafted.append(j), draft_position(slots, j, k))[1]
    seen = []
    observe = policy.observe
    policy.observe = lambda o: (seen.append(o), observe(o))
    out, _ = _serve(engine, prompts, policy, max_new=24)
    assert out == base and set(drafted) == {0, 1}
    assert max(int(o.ks.max()) for o in seen) == 2  # threshold 0 keeps drafting to the cap
    f = seen[0].state.features
    assert (f.top1_prob[:, 2:] == 0).all() and (f.top1_prob[:, :2] > 0).all()


def test_policy_context_of_the_engine(tiny):
    """The engine's ks, largest bucket and drafter kind; a flat 1 ms cost when none is given."""
    from tabletune.engine.scheduler import flat_cost

    target, _, _ = tiny
    ctx = policy_context(_engine(target, "ngram", k_max=3, max_num_seqs=6))
    assert ctx.ks == (0, 1, 2, 3) and ctx.max_num_seqs == 6 and ctx.default_drafter == NGRAM
    assert ctx.prior_rates == (0.5, 0.5, 0.5)
    assert policy_context(_engine(target, "eagle", k_max=3)).default_drafter == MODEL
    cost = flat_cost(3, 8)
    assert cost.step_ms(5, 2) == 1.0 and cost.mixed_ms(np.array([0, 3, 1])) == 1.0


def test_bad_ragged_inputs_are_refused(tiny):
    target, _, _ = tiny
    engine = _engine(target, "eagle", k_max=3)
    with pytest.raises(ValueError, match="one k >= 0 per row"):
        engine.launch([0, 1], [1])
    with pytest.raises(ValueError, match="k=5 has no graph"):
        engine.launch([0], [5])
    with pytest.raises(ValueError, match="MODEL .* or NGRAM"):
        engine.launch([0], [1], kinds=[2])


def test_split_steps_keep_the_draft_distributions_for_sampling(tiny):
    """T = 1 with a sampling EAGLE head: the draft phase keeps q [slots + 1, k_max, V] for the verify phase's rejection
    sampling; every request gets its tokens and no row accepts more than it verified."""
    target, prompts, _ = tiny
    engine = _engine(target, "eagle", split=True, temperature=1.0)
    assert engine.draft_probs.shape == (5, 4, PRESETS["tiny"].vocab_size)
    assert _engine(target, "ngram", split=True, temperature=1.0).draft_probs is None
    policy = make_policy("tapout", policy_context(engine))
    seen = []
    observe = policy.observe
    policy.observe = lambda o: (seen.append(o), observe(o))
    out, _ = _serve(engine, prompts, policy, max_new=12)
    assert [len(o) for o in out] == [12] * len(prompts)
    assert all((o.accepted <= o.ks).all() for o in seen) and sum(int(o.accepted.sum()) for o in seen) > 0


def test_a_step_with_the_last_inputs_keeps_the_buffer_and_any_other_step_writes_its_own(tiny):
    """``SpecEngine._write`` leaves a bucket's host buffer as it is when a step's inputs are the ones last written
    there; every step reads its own inputs all the same: steps drawn from inputs that differ from a base step in
    one field each (slots, ks, caps, kinds, a longer k), so that a step often repeats the last one and often
    differs from it in that field alone."""
    from tabletune.engine.runner import ROWS, layout
    from tabletune.policies.base import MODEL, NGRAM

    target, _, _ = tiny
    engine = _engine(target, "eagle", k_max=4, max_num_seqs=4)
    base = ([0, 1, 2], [2, 2, 2], None, None)
    steps = [base, ([0, 1, 3], *base[1:]), (base[0], [2, 1, 2], None, None), (*base[:2], [1, 2, 0], None),
             (*base[:3], [MODEL, NGRAM, MODEL]), (base[0], [3, 3, 3], None, None)]
    rng = random.Random(0)
    for i in [rng.randrange(len(steps)) for _ in range(80)]:
        slots, ks, caps, kinds = steps[i]
        buf, k, j = engine._fill(slots, ks, caps, kinds, 0)
        b, n = buf.out.shape[0], len(slots)
        q, flat, j_want = layout(np.array(ks + [0] * (b - n)) + 1, k)
        host = buf.host.numpy()
        rows = host[: ROWS * b].reshape(ROWS, b)
        assert j == j_want and rows[0, :n].tolist() == slots and rows[1, :n].tolist() == ks
        assert rows[2, :n].tolist() == (caps if caps is not None else [k] * n)
        assert rows[3, :n].tolist() == (kinds if kinds is not None else [engine.default_kind] * n)
        assert rows[5].tolist() == q.tolist() and host[ROWS * b: ROWS * b + len(flat)].tolist() == flat.tolist()


def test_kept_layouts_write_what_a_fresh_layout_writes(tiny):
    """A step's host buffer is the same whether its token layout was computed now or kept from an earlier step
    with the same ks (``SpecEngine._write``): every row input and the packed layout, over random ragged steps."""
    from tabletune.engine.runner import ROWS, layout

    target, _, _ = tiny
    engine = _engine(target, "eagle", k_max=4, max_num_seqs=4)
    rng = random.Random(0)
    patterns = [[rng.randrange(5) for _ in range(rng.randrange(1, 5))] for _ in range(12)]
    for ks in patterns * 3:  # each pattern again: the kept layout
        n = len(ks)
        buf, k, j = engine._fill(list(range(n)), ks, None, None, 0)
        b = buf.out.shape[0]
        q, flat, j_want = layout(np.array(ks + [0] * (b - n)) + 1, k)
        host = buf.host.numpy()
        rows = host[: ROWS * b].reshape(ROWS, b)
        assert j == j_want and rows[1, :n].tolist() == ks and rows[5].tolist() == q.tolist()
        assert rows[4].tolist() == (np.cumsum(q) - q).tolist()
        assert host[ROWS * b: ROWS * b + len(flat)].tolist() == flat.tolist()


def test_the_gated_per_request_controller_launches_its_batch_steps_ahead_and_stays_lossless(tiny):
    """``controller:per-request,gate=1`` with a gate of short windows: its trial alternates plans on the lookup
    (``ROWS``: the lookup read, rows on both chains) and the batch controller's k (``BATCH``: no lookup, one k, the
    model chain). The batch steps go ahead of the last read-back where the batch stays, the plans never do; the
    greedy outputs are those without speculation."""
    from tabletune.controller.mode_gate import BATCH, ROWS, GateConfig, ModeGate

    target, prompts, base = tiny
    oracle = [b + [0] * 8 for b in base]
    traces = _code_traces(len(prompts))
    engine, ctx = _traced_engine(target)
    policy = make_policy("controller:per-request,gate=1", ctx)
    policy.gate = ModeGate(GateConfig(window_steps=3, trial_pairs=3))
    modes, seen, lookups = {}, [], []
    decide, observe = policy.decide, policy.observe
    policy.decide = lambda s: (modes.setdefault(s.step, policy.gate.mode), decide(s))[1]
    policy.observe = lambda o: (seen.append(o), observe(o))
    host_lookup = engine.drafter.host_lookup
    engine.drafter.host_lookup = lambda *a: (lookups.append(1), host_lookup(*a))[1]
    out, stats = _serve(engine, prompts, policy, max_new=24, oracle=oracle, traces=traces)
    assert out == base
    assert sorted(modes) == list(range(stats.num_steps))
    by_mode = {m: [o for o in seen if modes[o.state.step] == m] for m in (ROWS, BATCH)}
    assert by_mode[ROWS] and by_mode[BATCH] and len(policy.gate.pairs) > 0
    assert all(o.state.ngram_match_len is not None for o in by_mode[ROWS])
    assert any((o.drafter == NGRAM).any() for o in by_mode[ROWS])
    assert all(o.state.ngram_match_len is None and (o.drafter == MODEL).all() for o in by_mode[BATCH])
    assert len(lookups) == len(by_mode[ROWS])
    assert stats.step_looked_up == [modes[t] == ROWS for t in range(stats.num_steps)]
    ahead = np.flatnonzero(stats.step_ahead)
    assert len(ahead) > 0 and all(modes[t] == BATCH for t in ahead)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_steps_outcome_carries_the_prefills_run_before_it(tiny, overlap):
    """Four requests through two slots of different lengths: admissions happen before the first step and wherever
    a request finished; each step's outcome carries those prefills' time (``StepOutcome.prefill_ms``, what the
    gate leaves out of a window's span), as its line in the stats does, and none where nothing was admitted."""
    target, prompts, _ = tiny
    engine = _engine(target, "ngram", max_num_seqs=2)
    policy = RandomKs(engine.k_max, 0)
    policy.observe_may_lag = True
    reqs = [Request(list(p), 6 + 5 * i, i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, policy, max_num_seqs=2, overlap_observe=overlap).run(reqs)
    got = [o.prefill_ms for o in policy.outcomes]
    assert len(got) == stats.num_steps
    assert got == pytest.approx([1e3 * s for s in stats.step_prefill_s])
    admitted = np.array(stats.step_admitted) > 0
    assert admitted.sum() >= 3 and all(g > 0 for g in np.array(got)[admitted])
    assert all(g == 0 for g in np.array(got)[~admitted])
