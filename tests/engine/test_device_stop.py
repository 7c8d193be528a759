"""The per-request stop rule on the device: the same lengths as the host rule, no sync inside the draft loop,
outputs unchanged."""

import random
import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabletune.engine.device_stop import DeviceStop  # noqa: E402
from tabletune.engine.drafters import make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, no_hook, policy_context  # noqa: E402
from tabletune.cost import StepCost  # noqa: E402
from tabletune.policies import make_policy  # noqa: E402
from tabletune.policies.base import Decision  # noqa: E402
from tabletune.policies.stop_rule import LogitStopRule, threshold  # noqa: E402
from tabletune.profile import StepPoint, StepProfile  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402


def host_lengths(rule: LogitStopRule, top1: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """The scheduler's host loop: draft j for the active rows, then keep those the rule keeps, up to the caps."""
    drafted, active, j = np.zeros(len(caps), np.int64), caps > 0, 0
    while active.any():
        j += 1
        drafted[active] = j
        active &= drafted < caps
        active &= rule.keep(top1[:, :j], j)
    return drafted


def test_the_rule_hand_worked():
    """a = (0.9, 0.5, 0.5) before any fit (w = 0, c = logit a): S_1 a_2 = 0.45, S_2 a_3 = 0.225. With
    R dT = 0.3 at j = 1 and 0.2 at j = 2 a row drafts 3; with 0.25 at j = 2 it stops after 2."""
    a = np.array([0.9, 0.5, 0.5])
    c = tuple(np.log(a / (1 - a)))
    top1 = np.full((1, 3), 0.7)
    go = LogitStopRule(0.0, c, (threshold(1.0, 0.3, 0.5), threshold(1.0, 0.2, 0.5), float("inf")))
    assert go.keep(top1, 1)[0] and go.keep(top1, 2)[0] and not go.keep(top1, 3)[0]
    stop = LogitStopRule(0.0, c, (threshold(1.0, 0.3, 0.5), threshold(1.0, 0.25, 0.5), float("inf")))
    assert stop.keep(top1, 1)[0] and not stop.keep(top1, 2)[0]
    # with a fit, p = sigmoid(w logit(top1) + c_j): w = 1, c = 0 gives p = top1
    fitted = LogitStopRule(1.0, (0.0, 0.0, 0.0), (np.log(0.5), np.log(0.5), float("inf")))
    assert fitted.keep(np.array([[0.6, 0.9], [0.4, 0.9]]), 1).tolist() == [True, False]
    assert fitted.keep(np.array([[0.6, 0.9], [0.6, 0.8]]), 2).tolist() == [True, False]  # 0.54 > 0.5 > 0.48


def test_device_lengths_equal_the_host_rule():
    rng = np.random.default_rng(0)
    k_max, rows = 6, 48
    for trial in range(40):
        sig = torch.rand(rows + 1, k_max, 3)
        top1 = sig[:rows, :, 0].double().numpy()
        caps = rng.integers(0, k_max + 1, rows)
        rule = LogitStopRule(float(rng.uniform(0, 2)), tuple(rng.normal(0.5, 1.0, k_max)),
                             tuple(np.sort(rng.uniform(-3.0, 0.0, k_max))[::-1]))
        engine = SimpleNamespace(device=torch.device("cpu"), draft_sig=sig)
        stop = DeviceStop(engine, list(range(rows)), caps, rule)
        j = 0
        while j < caps.max() and not stop.done():
            j += 1
            stop.after_position(j)
        want = host_lengths(rule, top1, caps)
        assert stop.lengths().tolist() == want.tolist(), trial
        assert j == want.max(initial=0)  # the loop ended as soon as no row was alive


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    rng = random.Random(3)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 16))] for _ in range(4)]
    base, _, _ = _run(target, prompts, None, True)  # the greedy outputs of k = 0
    return target, prompts, base


class Recorded(DeviceStop):
    """DeviceStop that keeps, per step, its rule, caps, the drafter's top-1 of every row and the lengths it read."""

    steps: list = []

    def __init__(self, engine, slots, caps, rule):
        super().__init__(engine, slots, caps, rule)
        self.rule, self.caps_host = rule, np.asarray(caps)

    def lengths(self):
        out = super().lengths()
        self.steps.append((self.rule, self.caps_host, self.sig[self.slots, :, 0].double().numpy(), out))
        return out


def _run(target, prompts, policy_name, device_stop, k_max=4, overlap=False):
    engine = SpecEngine(target, make_drafter("eagle", target, k_max, draft_cfg=PRESETS["tiny"]),
                        EngineConfig(max_num_seqs=4, max_len=80, k_max=k_max, split_steps=True))
    # each drafted position costs 0.4 ms on a 1 ms step: with a prior of 0.5 the rule stops rows early
    cost = StepCost(StepProfile(tuple(StepPoint(b, k, (1.0 + 0.4 * k,)) for b in (1, 4) for k in range(k_max + 1)),
                                context_len=1))
    policy = make_policy(policy_name, policy_context(engine, cost)) if policy_name else DraftTable.fixed(0)
    reads, copy_drafts = [], engine.copy_drafts
    engine.copy_drafts = lambda slots, k: (reads.append(k), copy_drafts(slots, k))[1]
    reqs = [Request(list(p), 24, i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, policy, device_stop=device_stop, overlap_observe=overlap).run(reqs)
    return [r.output for r in reqs], stats, reads


def test_the_per_request_controller_on_the_device_is_lossless_and_reads_once_a_step(tiny, monkeypatch):
    """Its stop rule on the device: the target's greedy outputs, at every step the lengths the host rule gives on
    the same signals, and one read of the drafts per step (the host rule reads after every position it
    continues). Its R is fixed at 0.5 tokens a ms, not taken from the measured step times, which would make the
    plans, and whether the rule stops a row at all, follow this machine's speed: at the cost's 0.4 ms a position a
    row then drafts on while its survival times the next position's rate exceeds 0.2."""
    import tabletune.engine.scheduler as scheduler
    from tabletune.policies.controller import PerRequestController

    monkeypatch.setattr(PerRequestController, "rate", lambda self, b, surv, table_k: 0.5)

    target, prompts, base = tiny
    # fitted early: row-dependent stops; no exploration (an exploring step keeps the rule on the host)
    name = "controller:per-request,stop=1,ngram=0,refit_every=2,explore_max_batch=0"
    monkeypatch.setattr(scheduler, "DeviceStop", Recorded)
    Recorded.steps = []
    out_dev, stats_dev, reads_dev = _run(target, prompts, name, True)
    out_host, stats_host, reads_host = _run(target, prompts, name, False)
    assert out_dev == base and out_host == base
    # one rule and one read of the drafts a step that drafts (a step whose plan drafts nothing sets up no rule)
    drafting = sum(1 for _, drafted in stats_dev.step_rows if np.max(drafted, initial=0) > 0)
    assert len(Recorded.steps) == drafting and len(reads_dev) == drafting
    # the host rule reads once more after every position where a row goes on
    assert len(reads_host) > sum(1 for _, drafted in stats_host.step_rows if np.max(drafted, initial=0) > 0)
    for rule, caps, top1, lengths in Recorded.steps:
        assert lengths.tolist() == host_lengths(rule, top1, caps).tolist()
    drafted = np.concatenate([s[3] for s in Recorded.steps])
    caps = np.concatenate([s[1] for s in Recorded.steps])
    assert (drafted > 0).any() and (drafted < caps).any()  # rows drafted, and the rule stopped some early


class Slow:
    """Test policy: k = 2 for every row; decide sleeps 4 ms, observe 6 ms; records the order of its calls."""

    name, uses_features, observe_may_lag = "slow", False, True

    def __init__(self):
        self.calls = []

    def decide(self, state):
        time.sleep(0.004)
        self.calls.append(("decide", state.step))
        return Decision.batch(2)

    def observe(self, outcome):
        time.sleep(0.006)
        self.calls.append(("observe", outcome.state.step))


def test_host_time_on_the_critical_path_and_the_observe_overlapped(tiny):
    """decide is always on the critical path; observe is too unless overlapped, when it runs before the next step's
    first read and sees decide(t + 1) come before observe(t). Outputs are the target's either way. (A step's tokens
    are appended to the outputs while the next step runs: overlapped either way.)"""
    target, prompts, base = tiny
    runs = {}
    for overlap in (False, True):
        engine = SpecEngine(target, make_drafter("eagle", target, 4, draft_cfg=PRESETS["tiny"]),
                            EngineConfig(max_num_seqs=4, max_len=80, k_max=4))
        policy = Slow()
        reqs = [Request(list(p), 24, i) for i, p in enumerate(prompts)]
        stats = Scheduler(engine, policy, overlap_observe=overlap).run(reqs)
        assert [r.output for r in reqs] == base
        runs[overlap] = (policy.calls, np.mean(stats.step_host_critical_s[1:]) * 1e3,
                         np.mean(stats.step_host_overlapped_s[1:]) * 1e3)
        # the critical time's parts: decide's 4 ms every step, and an observe not overlapped in the bookkeeping
        book, decide = np.array(stats.step_host_bookkeeping_s[1:]), np.array(stats.step_host_decide_s[1:])
        assert decide.min() >= 0.004 and np.all(book + decide <= np.array(stats.step_host_critical_s[1:]))
        assert (book.min() >= 0.006) == (not overlap)
    calls, critical_ms, overlapped_ms = runs[False]
    assert calls[:4] == [("decide", 0), ("observe", 0), ("decide", 1), ("observe", 1)]
    assert critical_ms >= 10.0 and overlapped_ms < 6.0  # only the tokens' emission overlaps, never observe's 6 ms
    calls, critical_ms, overlapped_ms = runs[True]
    assert calls[:4] == [("decide", 0), ("decide", 1), ("observe", 0), ("decide", 2)]
    # sleeps never undersleep: 4 ms of decide is critical; the 6 ms of observe, counted there, would make it >= 10
    assert 4.0 <= critical_ms < 10.0 and overlapped_ms >= 6.0
    # a policy that keeps per-step state (no ``observe_may_lag``) is observed in order all the same
    engine = SpecEngine(target, make_drafter("eagle", target, 4, draft_cfg=PRESETS["tiny"]),
                        EngineConfig(max_num_seqs=4, max_len=80, k_max=4))
    policy = Slow()
    policy.observe_may_lag = False
    stats = Scheduler(engine, policy, overlap_observe=True).run([Request(list(p), 8, i) for i, p in enumerate(prompts)])
    assert policy.calls[:4] == [("decide", 0), ("observe", 0), ("decide", 1), ("observe", 1)]
    assert max(stats.step_host_overlapped_s) < 0.006


def test_the_per_request_controller_overlapped_stays_lossless(tiny):
    """Observing step t during step t + 1 (decisions on one-step-old statistics, the plan made ahead): the greedy
    outputs, and the observe time counted as overlapped."""
    target, prompts, base = tiny
    for name in ("controller:per-request,stop=1,refit_every=2", "controller:per-request,stop=1,ngram=0,refit_every=2"):
        out, stats, _ = _run(target, prompts, name, True, overlap=True)
        assert out == base, name
        assert sum(stats.step_host_overlapped_s) > 0


def test_the_per_request_controller_without_its_stop_rule_reads_nothing_back_before_verifying(tiny, monkeypatch):
    """``stop=0``: the plan's k_i drafted whole, no drafted signal copied to the host (the blind plan needs none),
    no stop-rule lengths read, and the target's greedy outputs."""
    import tabletune.engine.scheduler as scheduler

    target, prompts, base = tiny
    monkeypatch.setattr(scheduler, "DeviceStop", Recorded)
    Recorded.steps = []
    for name in ("controller:per-request,stop=0", "controller:per-request,stop=0,ngram=0"):
        out, stats, reads = _run(target, prompts, name, True, overlap=True)
        assert out == base, name
        assert reads == [] and Recorded.steps == [], name
        assert sum(stats.step_drafted) > 0, name  # it drafted: planned rows ran the model chain


def test_a_steps_tokens_reach_the_outputs_while_the_next_step_runs(tiny):
    """The scheduler counts what the next step needs (lengths, finished requests) at once and appends the tokens
    later: at decide(t + 1) the outputs still lack step t's tokens, the lengths the policy sees do not, and they
    equal those of a run that appends at once (a step hook forces it); outputs are the target's."""
    target, prompts, base = tiny

    def serve(hook):
        engine = SpecEngine(target, make_drafter("eagle", target, 4, draft_cfg=PRESETS["tiny"]),
                            EngineConfig(max_num_seqs=4, max_len=80, k_max=4))
        reqs = [Request(list(p), 24, i) for i, p in enumerate(prompts)]
        seen = []

        class Record:
            name, uses_features, observe_may_lag = "record", False, False

            def decide(self, state):
                seen.append((state.num_generated.tolist(), [len(reqs[i].output) for i in state.request_ids]))
                return Decision.batch(2)

            def observe(self, outcome):
                pass

        Scheduler(engine, Record(), after_step=hook).run(reqs)
        return [r.output for r in reqs], seen

    out, deferred = serve(no_hook)
    out_now, at_once = serve(lambda running, res, finished: None)
    assert out == base and out_now == base
    assert [g for g, _ in deferred] == [g for g, _ in at_once]
    assert all(g == lengths for g, lengths in at_once)
    assert any(n > m for g, lengths in deferred[1:] for n, m in zip(g, lengths))
