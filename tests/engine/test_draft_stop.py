"""Drafting that stops (DraftStop on the engine's draft loop), packed verification, and the traced replay's cost."""

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.engine.drafters import Drafter, make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine, layout  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler  # noqa: E402
from tabletune.engine.trace_replay import TracedReplayDrafter  # noqa: E402
from tabletune.policies.base import Decision  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402


class StopAt:
    """Test policy: k_max for every row, and a stop rule that ends request i's draft after position stop[i % n]."""

    name, uses_features = "stop-at", False

    def __init__(self, k, stops):
        self.k, self.stops, self.calls, self.outcomes = k, stops, [], []

    def decide(self, state):
        return Decision.batch(self.k)

    def keep_drafting(self, state, features, j, active):
        # the rule sees positions 1..j only: later columns are sure rejections
        assert (features.top1_prob[:, j:] == 0).all()
        self.calls.append((j, active.copy()))
        return np.array([j < self.stops[i % len(self.stops)] for i in state.request_ids])

    def observe(self, outcome):
        self.outcomes.append(outcome)


def _engine(target, drafter, k_max=4, max_num_seqs=4, split=True):
    d = drafter if not isinstance(drafter, str) else make_drafter(drafter, target, k_max, draft_cfg=PRESETS["tiny"])
    return SpecEngine(target, d, EngineConfig(max_num_seqs=max_num_seqs, max_len=80, k_max=k_max, split_steps=split))


def _serve(engine, prompts, policy, max_new=20):
    reqs = [Request(list(p), max_new, i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, policy).run(reqs)
    return [r.output for r in reqs], stats


def _record_positions(engine):
    """Wrap draft_position: the (position, rows) of every launch."""
    seen, draft_position = [], engine.draft_position
    engine.draft_position = lambda slots, j, k: (seen.append((j, list(slots))), draft_position(slots, j, k))[1]
    return seen


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    rng = random.Random(3)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 16))] for _ in range(4)]
    base, _ = _serve(_engine(target, "ngram", split=False), prompts, DraftTable.fixed(0), max_new=16)
    return target, prompts, base


def test_rows_stop_where_the_rule_says_and_stay_lossless(tiny):
    """Requests 0..3 (slots 0..3) stop after positions 1, 3, 4, 2 (cap 4). The first step drafts position 1 for
    all four, position 2 for requests 1..3, position 3 for 1 and 2, position 4 for request 2, and no more; each
    row verifies at most what it drafted, and the outputs are those without speculation."""
    target, prompts, base = tiny
    engine = _engine(target, "eagle")
    policy = StopAt(4, [1, 3, 4, 2])
    seen = _record_positions(engine)
    out, stats = _serve(engine, prompts, policy, max_new=16)
    assert out == base
    assert seen[:4] == [(0, [0, 1, 2, 3]), (1, [1, 2, 3]), (2, [1, 2]), (3, [2])] and seen[4][0] == 0
    # asked after position j about the rows that drafted it
    assert [(j, a.tolist()) for j, a in policy.calls[:3]] == [(1, [True, True, True, True]),
                                                              (2, [False, True, True, True]),
                                                              (3, [False, True, True, False])]
    for o in policy.outcomes:
        stop = np.array([policy.stops[i % 4] for i in o.state.request_ids])
        assert (o.ks <= stop).all() and (o.accepted <= o.ks).all()
    assert policy.outcomes[0].ks.tolist() == [1, 3, 4, 2]
    assert stats.step_drafted[0] == 1 + 3 + 4 + 2


@pytest.mark.parametrize("j", [1, 2])
def test_a_batch_whose_rows_all_stop_at_j_drafts_exactly_j_positions(tiny, j):
    """The rule stops every row after position j: each step drafts positions 1..j for every row and no more."""
    target, prompts, base = tiny
    engine = _engine(target, "eagle")
    policy = StopAt(4, [j])
    seen = _record_positions(engine)
    out, stats = _serve(engine, prompts, policy, max_new=16)
    assert out == base
    assert [p for p, _ in seen] == list(range(j)) * len(stats.step_batch_sizes)
    assert all(int(o.ks.max()) <= j for o in policy.outcomes)
    assert stats.step_drafted == [b * j for b in stats.step_batch_sizes]


def test_stop_rules_need_split_steps(tiny):
    target, _, _ = tiny
    with pytest.raises(ValueError, match="split_steps"):
        Scheduler(_engine(target, "eagle", split=False), StopAt(2, [1]))


def test_layout_hand_worked():
    """Rows feeding 1, 4, 1, 1 tokens (k = 3, bucket 4): 7 tokens, the token bucket 4 x 2 = 8; the last row takes the
    slack (2 tokens). Token t sits at row * 4 + position of the padded [4, 4]."""
    q, flat, j = layout(np.array([1, 4, 1, 1]), 3)
    assert j == 1 and q.tolist() == [1, 4, 1, 2]
    assert flat.tolist() == [0, 4, 5, 6, 7, 8, 12, 13]
    q, flat, j = layout(np.full(4, 4), 3)  # uniform: no padding, the identity
    assert j == 3 and flat.tolist() == list(range(16))
    q, flat, j = layout(np.array([8] + [1] * 127), 7)  # b = 128, one row drafting 7: 135 tokens -> 256
    assert j == 1 and q.sum() == 256 and q.max() == 8


def test_verify_linears_see_only_the_scheduled_tokens(tiny):
    """A step of k = (3, 0, 0, 0) on bucket 4 feeds 4 + 1 + 1 + 1 = 7 tokens, the token bucket 8: every GEMM of the
    target sees 8 rows, not the padded 4 x 4 = 16; attention still pads rows to k + 1 = 4."""
    target, prompts, _ = tiny
    engine = _engine(target, "ngram", split=False)
    for i, p in enumerate(prompts):
        engine.prefill(i, p)
    rows, linear = [], target.ops.linear
    target.ops.linear = lambda x, w, gated=False: (rows.append((x.reshape(-1, x.shape[-1]).shape[0], w.shape[0])),
                                                   linear(x, w, gated))[1]
    try:
        engine.launch([0, 1, 2, 3], [3, 0, 0, 0])
        uniform = len(rows)
        engine.launch([0, 1, 2, 3], [3, 3, 3, 3])
    finally:
        del target.ops.linear
    wqkv = target.layers[0].wqkv.shape[0]
    assert [m for m, n in rows[:uniform] if n == wqkv] == [8, 8]
    assert [m for m, n in rows[uniform:] if n == wqkv] == [16, 16]


def test_the_traced_replay_runs_the_heads_computation_for_the_rows_that_draft(tiny):
    """The replay drafter's draft phase runs an EAGLE-style head at the target's shape: its catch-up forward and
    one single-token layer forward per drafted position, for the active rows only; the drafts it verifies stay
    the oracle's. The null cost drafter runs nothing."""
    target, prompts, _ = tiny
    engine = _engine(target, TracedReplayDrafter())
    head = engine.drafter.cost
    assert head.name == "eagle" and head.layer.wqkv.shape == target.layers[0].wqkv.shape
    for i, p in enumerate(prompts):
        engine.prefill(i, p)
    engine.oracle[:4, :40] = 7
    calls, step = [], head._step
    head._step = lambda toks, hid, pos, slots, *a: (calls.append(tuple(toks.shape)), step(toks, hid, pos, slots))[1]
    engine.draft_position([0, 1, 2, 3], 0, 3)  # begin: catch-up of width k + 1 = 4 for the 4 rows
    engine.draft_position([1, 3], 1, 3)  # position 2 for two rows (bucket 2)
    engine.draft_position([3], 2, 3)  # position 3 for one row
    assert calls == [(4, 4), (2, 1), (1, 1)]
    assert (engine.drafts[[1, 3], 1] == 7).all()  # the oracle's tokens, not the head's
    free = _engine(target, TracedReplayDrafter(Drafter()))
    free.prefill(0, prompts[0])
    free.draft_position([0], 0, 3)
    assert free.drafter.cost.name == "none"


class NgramFirst:
    """Test policy with a stop rule: before drafting, a row with an n-gram proposal takes the n-gram chain at k 3,
    the others the model chain at k 2; records what the lookup said."""

    name, uses_features = "ngram-first", False

    def __init__(self):
        self.proposed, self.outcomes = [], []

    def decide(self, state):
        from tabletune.policies.base import MODEL, NGRAM
        assert state.features is None and state.ngram_num_proposed is not None
        self.proposed.append(state.ngram_num_proposed.tolist())
        ngram = state.ngram_num_proposed > 0
        return Decision.per_request(np.where(ngram, 3, 2), np.where(ngram, NGRAM, MODEL))

    def keep_drafting(self, state, features, j, active):
        return active

    def observe(self, outcome):
        self.outcomes.append(outcome)


def test_rows_put_on_the_ngram_chain_before_drafting_take_no_model_draft(tiny):
    """Request 0 has an n-gram chain of 30 accepted proposals, request 1 none; both model chains reject every
    draft. Row 0 verifies 3 n-gram proposals a step (all accepted: 4 tokens) and drafts no model position; row 1
    drafts 2 model positions and accepts none. The lookup before drafting reports row 0's proposals (capped at
    k_max 4) and 0 for row 1; outputs are the target's own."""
    from tabletune.token_trace import TokenTrace
    target, prompts, base = tiny
    engine = _engine(target, TracedReplayDrafter())
    seen = _record_positions(engine)
    n = 30
    sig = np.zeros((n, 3), np.float32)
    model = TokenTrace("m", sig, np.zeros(n, bool), np.ones(n, bool), np.zeros(n, np.int64))
    chain = TokenTrace("g", sig, np.ones(n, bool), np.ones(n, bool), np.full(n, 3, np.int64))
    none = TokenTrace("g", sig, np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, np.int64))
    reqs = [Request(list(prompts[i]), 13, i, oracle=base[i] + [0] * 8, trace=(model, g))
            for i, g in ((0, chain), (1, none))]
    policy = NgramFirst()
    Scheduler(engine, policy).run(reqs)
    assert [r.output for r in reqs] == [base[0][:13], base[1][:13]]
    assert policy.proposed[0] == [4, 0]
    first = policy.outcomes[0]
    assert first.ks.tolist() == [3, 2] and first.accepted.tolist() == [3, 0]
    assert all(0 not in slots for _, slots in seen)  # slot 0 never drafted by the model drafter
