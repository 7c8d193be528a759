"""The reference engine on the CPU: lossless speculation, counters, CUDA graphs off, a real model."""

import random
import zlib

import numpy as np
import pytest
from margins import binomial_margin

torch = pytest.importorskip("torch")

from tabletune.engine.drafters import ReplayDrafter, make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS, config_from_hf  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, draw_caps, steady_throughput  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402

DRAFTERS = ("ngram", "eagle", "draft_model", "parallel_block")


def _engine(target, drafter, k_max=4, max_num_seqs=4, max_len=72, temperature=0.0, draft_model=None):
    d = make_drafter(drafter, target, k_max, draft_cfg=PRESETS["tiny"], draft_model=draft_model)
    return SpecEngine(target, d, EngineConfig(max_num_seqs=max_num_seqs, max_len=max_len, k_max=k_max,
                                              temperature=temperature))


def _serve(engine, prompts, table, max_new=24, **kw):
    reqs = [Request(list(p), max_new, i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, table, **kw).run(reqs)
    return [r.output for r in reqs], stats


def _random_table(rng, k_max, max_batch):
    bounds = sorted(rng.sample(range(2, max_batch + 1), 2))
    starts = [1] + bounds
    ends = [s - 1 for s in starts[1:]] + [max_batch]
    return DraftTable.from_ranges([[s, e, rng.randrange(k_max + 1)] for s, e in zip(starts, ends)])


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = Decoder(PRESETS["tiny"], torch.float32, "cpu")
    rng = random.Random(0)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 20))] for _ in range(6)]
    base, _ = _serve(_engine(target, "ngram"), prompts, DraftTable.fixed(0))
    return target, prompts, base


def test_cpu_engine_captures_no_graph(tiny):
    target, _, _ = tiny
    engine = _engine(target, "eagle")
    assert engine.graphs == {}
    assert engine.cache.scratch_slot == engine.buckets[-1]


def test_cpu_prefills_run_eager_and_capture_no_prefill_graph(tiny):
    """The prefill graphs are CUDA-only: on the CPU prompts of a repeated length stay eager (and lossless)."""
    target, prompts, base = tiny
    engine = _engine(target, "ngram")
    assert engine.prefills.max_len == 0
    out, _ = _serve(engine, prompts + [prompts[0]] * 3, DraftTable.fixed(2))
    assert out[: len(prompts)] == base and out[len(prompts):] == [base[0]] * 3
    assert engine.prefills.graphs == {}
    with pytest.raises(ValueError, match="bad engine config"):
        EngineConfig(prefill_graph_max_len=-1)


class _ReplayedForward:
    """A stand-in for a captured prefill on the CPU: replay() runs the forward again on the static inputs and
    writes the results into the static outputs, as a CUDA graph replay would."""

    def __init__(self, engine, tokens, slot):
        self.engine, self.tokens, self.slot = engine, tokens, slot
        self.hidden, self.logits = engine.prefills.forward(tokens, slot)
        self.replays = 0

    def replay(self):
        hidden, logits = self.engine.prefills.forward(self.tokens, self.slot)
        self.hidden.copy_(hidden)
        self.logits.copy_(logits)
        self.replays += 1


def test_prefill_graph_bookkeeping_with_a_stand_in_graph(tiny, monkeypatch):
    """The prefill graphs' bookkeeping (``engine.prefill.Prefill``) with the capture replaced by a stand-in:
    a length is captured after its second prompt, later prompts of that length replay with their own tokens and
    slot (lossless), other lengths stay eager, and a capture that fails leaves every prefill eager."""
    from tabletune.engine.prefill import PrefillGraph

    target, prompts, base = tiny
    engine = _engine(target, "eagle")
    engine.prefills.max_len = 64
    graphs = []

    def capture(tokens, slot):
        g = _ReplayedForward(engine, tokens, slot)
        graphs.append(g)
        return PrefillGraph(g, tokens, slot, g.hidden, g.logits)
    monkeypatch.setattr(engine.prefills, "capture", capture)
    n = len(prompts[0])
    others = [p for p in prompts if len(p) != n]
    same = [list(prompts[0])] * 3 + [[(t + 1) % 97 for t in prompts[0]]]  # a fourth prompt of that length
    out, _ = _serve(engine, same + others, DraftTable.fixed(2))
    eager, _ = _serve(_engine(target, "eagle"), same + others, DraftTable.fixed(2))
    assert out == eager and out[:3] == [base[0]] * 3
    seen, second = {}, []  # prompts are prefilled in request order: a length's graph comes at its second prompt
    for p in same + others:
        seen[len(p)] = seen.get(len(p), 0) + 1
        second += [len(p)] if seen[len(p)] == 2 else []
    assert list(engine.prefills.graphs) == second and second[0] == n
    assert graphs[0].replays == 2  # the third and fourth prompt of length n
    fails = _engine(target, "eagle")
    fails.prefills.max_len = 64

    def broken(tokens, slot):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(fails.prefills, "capture", broken)
    out2, _ = _serve(fails, same + others, DraftTable.fixed(2))
    assert out2 == eager and fails.prefills.graphs == {} and fails.prefills.max_len == 0


def test_prefill_attention_takes_a_slot_tensor_and_sdpa_causal_from_position_0():
    """ops.prefill_attention: the slot as an int and as a device tensor (a captured prefill's), from position 0
    (SDPA's causal mask) and from position 2 (an explicit mask), against attention written out by hand."""
    from tabletune.engine import ops

    torch.manual_seed(0)
    h, hkv, d, length = 4, 2, 16, 12
    kc, vc = torch.randn(3, hkv, length, d), torch.randn(3, hkv, length, d)
    for start, plen in ((0, 7), (2, 5)):
        q = torch.randn(1, plen, h, d)
        end = start + plen
        k = kc[1, :, :end].repeat_interleave(h // hkv, 0)  # [H, end, D]
        v = vc[1, :, :end].repeat_interleave(h // hkv, 0)
        scores = torch.einsum("phd,hnd->hpn", q[0], k) * d ** -0.5
        visible = torch.arange(end)[None, :] <= start + torch.arange(plen)[:, None]
        ref = torch.einsum("hpn,hnd->phd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)[None]
        for slot in (1, torch.tensor([1])):
            got = ops.prefill_attention(q, kc, vc, start, slot, d ** -0.5)
            assert torch.allclose(got, ref, atol=1e-5), (start, slot)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphs_captured_per_bucket_k_and_token_bucket():
    from tabletune.engine.runner import token_js

    target = Decoder(PRESETS["tiny"], torch.float32, "cuda")
    engine = _engine(target, "eagle", k_max=2, max_num_seqs=4)
    assert set(engine.graphs) == {("step", b, k, j) for b in (1, 2, 4) for k in (0, 1, 2) for j in token_js(b, k)}


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_outputs_identical_with_speculation(tiny, drafter):
    target, prompts, base = tiny
    rng = random.Random(zlib.crc32(drafter.encode()))  # hash() of a str changes between processes
    for _ in range(2):
        table = _random_table(rng, 4, 4)
        out, stats = _serve(_engine(target, drafter), prompts, table)
        assert out == base, f"{drafter} with table {table}"
        expect = [table.k_for(b) for b in stats.step_batch_sizes]
        if drafter == "ngram":  # a row verifies only the drafts that follow its match (none without one)
            assert all(k <= e for k, e in zip(stats.step_ks, expect)) and stats.step_drafts != expect
            continue
        # one draft per row of every step that ran with k > 0 (the table's k at that step's batch size)
        assert stats.step_ks == expect
        assert stats.counts.num_drafts == sum(b for b, k in zip(stats.step_batch_sizes, stats.step_ks) if k > 0)


@pytest.mark.slow
def test_self_drafting_accepts_everything(tiny):
    """The target as its own draft model: every draft matches (checks the catch-up bookkeeping)."""
    target, prompts, base = tiny
    out, stats = _serve(_engine(target, "draft_model", draft_model=target), prompts, DraftTable.fixed(3))
    assert out == base
    assert stats.counts.rates() == [1.0, 1.0, 1.0, None]


def test_counters_match_hand_worked_steps(tiny):
    """Replay of the exact greedy continuation, capped at position 1 every step (rates 1, 0).

    One request, 9 new tokens, k = 3: the prefill emits 1 token, each step accepts 1 draft and
    emits 2 tokens, so 4 steps. Per position: drafted [4, 4, 4] (every draft has length 3),
    reached [4, 4, 0] (position 2 is tested after position 1 passed), accepted [4, 0, 0].
    """
    target, prompts, base = tiny
    engine = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=1, max_len=72, k_max=3))
    req = Request(list(prompts[0]), 9, 0, oracle=base[0] + [0] * 8)
    stats = Scheduler(engine, DraftTable.fixed(3), cap_rates=[1.0, 0.0, 0.0]).run([req])
    assert req.output == base[0][:9]
    assert stats.num_steps == 4
    c = stats.counts
    assert (c.num_drafts, c.drafted, c.reached, c.accepted) == (4, [4, 4, 4], [4, 4, 0], [4, 0, 0])


@pytest.mark.parametrize("drafter", ["ngram", "eagle"])
def test_steps_launched_ahead_are_lossless(tiny, drafter):
    """Steps launched before the last step's read-back (``launch_ahead``: the same rows, none of them able to
    finish; a table's k, TurboSpec-style's, SGLang-style's) give the greedy outputs token for token: six requests
    of different lengths through two rows, so that the batch changes (a request finished, another admitted: that
    step is not launched ahead) and stays (launched ahead); every token is counted in the step that made it."""
    from tabletune.engine.scheduler import policy_context
    from tabletune.policies import make_policy

    target, prompts, _ = tiny
    lens = [5, 24, 13, 30, 9, 17]

    def serve(policy, ahead):
        reqs = [Request(list(p), n, i) for i, (p, n) in enumerate(zip(prompts, lens))]
        engine = _engine(target, drafter, max_num_seqs=2)
        if isinstance(policy, str):
            policy = make_policy(policy, policy_context(engine))
        stats = Scheduler(engine, policy, launch_ahead=ahead).run(reqs)
        return [r.output for r in reqs], stats

    ref, stats = serve(DraftTable.fixed(0), False)
    assert [len(o) for o in ref] == lens and not any(stats.step_ahead)
    for policy in (DraftTable.fixed(0), DraftTable.fixed(2), DraftTable.fixed(4), "turbospec", "sglang"):
        out, stats = serve(policy, True)
        assert out == ref
        ahead = np.array(stats.step_ahead)
        assert 0 < ahead.sum() < len(ahead) and sum(stats.step_tokens) == sum(lens)
        assert not ahead[sorted(set(stats.replaced_at_step.values()) & set(range(len(ahead))))].any()


def test_the_batch_controller_decides_ahead_once_a_step_on_statistics_one_step_old(tiny):
    """The batch controller (``decides_ahead``, ``observe_may_lag``) decides step t + 1 after it observed step
    t - 1 and before it observes step t, once a step, whether the engine launches steps ahead or not, and every
    step runs the k decided for it; launching ahead, it decides while the device runs step t, and a step goes
    ahead only on step t's ks (not into an exploration step's k_max). The greedy outputs stay the same."""
    from tabletune.controller.config import ControllerConfig
    from tabletune.engine.scheduler import policy_context
    from tabletune.policies.controller import ControllerPolicy

    target, prompts, _ = tiny
    lens = [5, 24, 13, 30, 9, 17]
    log = []

    class Logged(ControllerPolicy):
        def decide(self, state):
            log.append(("decide", state.step))
            decision = super().decide(state)
            ks_decided[state.step] = decision.k
            return decision

        def observe(self, outcome):
            log.append(("observe", outcome.state.step))
            super().observe(outcome)

    outputs, ks_decided = [], {}
    for ahead in (False, True):
        engine = _engine(target, "ngram", max_num_seqs=2)
        # its table stays at k = 1 (no install), so that its exploration steps draft k_max
        policy = Logged(policy_context(engine), start=DraftTable.fixed(1),
                        config=ControllerConfig(explore_fraction=0.2, min_install_interval_s=1e9))
        reqs = [Request(list(p), n, i) for i, (p, n) in enumerate(zip(prompts, lens))]
        log.clear()
        stats = Scheduler(engine, policy, launch_ahead=ahead).run(reqs)
        outputs.append([r.output for r in reqs])
        steps = stats.num_steps
        assert [t for what, t in log if what == "decide"] == list(range(steps))
        assert sorted(t for what, t in log if what == "observe") == list(range(steps))
        at = {entry: i for i, entry in enumerate(log)}
        for t in range(1, steps - 1):
            assert at[("observe", t - 1)] < at[("decide", t + 1)] < at[("observe", t)]
        flags = np.array(stats.step_ahead)
        asked = [ks for ks, _ in stats.step_rows]
        assert [int(ks.max()) for ks in asked] == [ks_decided[t] for t in range(steps)]  # each decision served
        assert (flags.sum() > 0) == ahead
        assert all(np.array_equal(asked[t], asked[t - 1]) for t in np.flatnonzero(flags))
        if ahead:  # an exploration step's k_max, decided ahead on the same rows, was launched after the read
            explored = [t for t in range(1, steps) if asked[t].max() > asked[t - 1].max() and len(asked[t]) == 2
                        and len(asked[t - 1]) == 2 and t not in stats.replaced_at_step.values()]
            assert explored and not flags[explored].any()
    assert outputs[0] == outputs[1]


def test_replay_without_cap_accepts_all_and_is_lossless(tiny):
    target, prompts, base = tiny
    engine = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=4, max_len=72, k_max=4))
    reqs = [Request(list(p), 13, i, oracle=base[i] + [0] * 8) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, DraftTable.fixed(4)).run(reqs)
    assert [r.output for r in reqs] == [b[:13] for b in base]
    assert stats.counts.rates()[0] == 1.0


def test_scheduler_replaces_finished_requests_in_the_same_step(tiny):
    """k = 0 (one token per step), max_num_seqs 2, outputs of 3, 5 and 4 tokens (the prefill gives the first).

    step 0: r0, r1 admitted (2 tokens each after it); step 1: r0 reaches 3 -> replaced before step 2, where
    r2 is admitted; r1 reaches 5 after step 3 -> gone from step 4; r2 reaches 4 after step 4 -> gone at 5.
    """
    target, prompts, _ = tiny
    engine = _engine(target, "ngram", max_num_seqs=2)
    reqs = [Request(list(prompts[i]), n, i) for i, n in enumerate((3, 5, 4))]
    stats = Scheduler(engine, DraftTable.fixed(0)).run(reqs)
    assert [len(r.output) for r in reqs] == [3, 5, 4]
    assert stats.step_batch_sizes == [2, 2, 2, 2, 1]
    assert stats.step_admitted == [2, 0, 1, 0, 0]
    assert stats.replaced_at_step == {0: 2, 1: 4, 2: 5}
    assert stats.step_tokens == [2 + 2, 2, 1 + 2, 2, 1]  # first tokens of the admitted + one per running row
    assert len(stats.step_prefill_s) == 5 and stats.step_prefill_s[1] == 0.0 < stats.step_prefill_s[0]


@pytest.mark.parametrize("launch_ahead", [False, True])
def test_a_run_stops_when_its_stop_says_so(tiny, launch_ahead):
    """stop once three steps are in the stats: asked after each step with the lines of the steps before it (a
    step's line is written while the next one runs), it stops the run after the fourth, and a fifth launched
    ahead of the fourth's read-back (a table's k: the same rows, none finishing) is read and counted too; the
    waiting requests never admitted, outputs cut there, every step served in the stats."""
    target, prompts, _ = tiny
    engine = _engine(target, "ngram", max_num_seqs=2)
    reqs = [Request(list(prompts[i]), 20, i) for i in range(4)]
    seen = []
    stats = Scheduler(engine, DraftTable.fixed(0), launch_ahead=launch_ahead).run(
        reqs, stop=lambda s: seen.append(len(s.step_batch_sizes)) or len(s.step_batch_sizes) >= 3)
    steps = 5 if launch_ahead else 4
    assert seen == [0, 1, 2, 3]
    assert stats.num_steps == steps and stats.step_batch_sizes == [2] * steps and len(stats.step_tokens) == steps
    assert [len(r.output) for r in reqs] == [1 + steps] * 2 + [0, 0]  # prefill + a token a step at k = 0


def test_steady_throughput_window_hand_worked():
    # steps: batch [2, 2, 2, 1], tokens [4, 2, 3, 1], wall [1, 1, 2, 1] s; load 2 -> last full step is 2
    args = ([2, 2, 2, 1], [1.0, 1.0, 2.0, 1.0], [4, 2, 3, 1], 2)
    assert steady_throughput(*args) == pytest.approx((2 + 3) / (1 + 2))  # default: from step 1
    assert steady_throughput(*args, start=2) == pytest.approx(3 / 2)
    assert steady_throughput(*args, start=9) == pytest.approx(3 / 2)  # never past the last full step
    assert steady_throughput([1, 1], [1.0, 1.0], [1, 1], 2) == 0.0  # the load never ran


def test_draw_caps_replays_conditional_rates():
    rng = random.Random(0)
    caps = draw_caps([0.8, 0.5], 2, 20000, rng)
    reached_2 = sum(c >= 1 for c in caps)
    assert abs(reached_2 / len(caps) - 0.8) <= binomial_margin(0.8, len(caps))
    assert abs(sum(c == 2 for c in caps) / reached_2 - 0.5) <= binomial_margin(0.5, reached_2)


@pytest.mark.slow
def test_sampling_engine_runs_every_drafter(tiny):
    target, prompts, _ = tiny
    for drafter in DRAFTERS:
        torch.manual_seed(0)
        out, stats = _serve(_engine(target, drafter, temperature=0.8), prompts[:2], DraftTable.fixed(2), max_new=10)
        assert all(len(o) == 10 and all(0 <= t < 97 for t in o) for o in out)


@pytest.mark.slow
def test_smollm2_real_weights_match_transformers_and_stay_lossless():
    transformers = pytest.importorskip("transformers")
    from tabletune.integrations.hf import smollm2 as assets

    try:
        folder = assets.smollm2_model_dir()
    except Exception as exc:  # the package that carries the weights is missing
        pytest.skip(f"SmolLM2 weights unavailable: {exc}")
    cfg = config_from_hf(folder)
    model = Decoder(cfg, torch.float32, "cpu")
    model.load_safetensors(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok("def fibonacci(n):\n    if n < 2:\n        return n\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = hf(ids).logits[0]
    engine = SpecEngine(model, make_drafter("ngram", model, 4), EngineConfig(max_num_seqs=2, max_len=96, k_max=4))
    with torch.inference_mode():
        hidden = model(ids, torch.zeros(1, dtype=torch.long), torch.tensor([0]), engine.cache, prefill_at=(0, 0))
        ours = model.logits(hidden)[0]
    assert (ours - ref).abs().max().item() < 1e-3 * ref.abs().max().item()
    prompts = [ids[0].tolist()]
    base, _ = _serve(engine, prompts, DraftTable.fixed(0), max_new=32)
    spec, stats = _serve(engine, prompts, DraftTable.fixed(4), max_new=32)
    assert spec == base
    assert base[0][0] == int(ref[-1].argmax())
    assert stats.counts.accepted[0] > 0  # code repeats itself: prompt lookup finds matches


def test_replay_stops_counting_a_request_once_its_oracle_leaves_the_target_path(tiny):
    """A capped step that accepts less than its cap means the oracle is stale: that request's drafts stop counting."""
    target, prompts, base = tiny
    engine = SpecEngine(target, ReplayDrafter(), EngineConfig(max_num_seqs=4, max_len=72, k_max=2))
    good = Request(list(prompts[0]), 24, 0, oracle=base[0] + [0] * 4)
    wrong = list(base[1])
    wrong[7] = (wrong[7] + 1) % 97  # the oracle goes wrong at output token 7 (a draft of the third step)
    bad = Request(list(prompts[1]), 24, 1, oracle=wrong + [0] * 4)
    stats = Scheduler(engine, DraftTable.fixed(2), cap_rates=[1.0, 1.0]).run([good, bad])
    assert [good.output, bad.output] == base[:2]  # lossless whatever the oracle
    assert (good.oracle_stale, bad.oracle_stale) == (False, True)
    # every counted draft was accepted in full: the stale request's rejection and later steps are left out
    assert stats.counts.rates() == [1.0, 1.0]
    assert 0 < stats.counts.num_drafts < sum(k > 0 for k in stats.step_ks) * 2


def test_fixed_shape_keeps_one_bucket_while_the_batch_drains(tiny):
    target, prompts, base = tiny
    engine = _engine(target, "eagle", k_max=2, max_num_seqs=8)
    rows = []
    launch = engine.launch

    def spy(slots, k, caps=None, min_rows=0, kinds=None, on_replay=None):
        buf = launch(slots, k, caps, min_rows, kinds, on_replay)
        rows.append(buf.slots.shape[0])  # the bucket the step ran
        return buf
    engine.launch = spy
    reqs = [Request(list(p), 6 + 3 * i, i) for i, p in enumerate(prompts)]  # staggered lengths: the batch drains
    Scheduler(engine, DraftTable.fixed(2), fixed_shape=True).run(reqs)
    assert set(rows) == {8}  # 6 requests -> the 8-row bucket, also once only one is left
    assert [r.output for r in reqs] == [b[: 6 + 3 * i] for i, b in enumerate(base)]
    rows.clear()
    Scheduler(engine, DraftTable.fixed(2)).run([Request(list(p), 6 + 3 * i, i) for i, p in enumerate(prompts)])
    assert len(set(rows)) > 1  # without it the bucket follows the batch
