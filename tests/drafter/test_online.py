"""The head learning inside the engine's serving loop: lossless, it publishes, and it learns what it serves."""

import random

import pytest

torch = pytest.importorskip("torch")

from tabletune.integrations.hf.eagle_head import save_random_head  # noqa: E402
from tabletune.drafter.online import OnlineAdapter, OnlineConfig  # noqa: E402
from tabletune.engine.drafters import make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS, replace  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler, no_hook  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402

K = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = replace(PRESETS["tiny"], name="tiny-llama", qk_norm=False)
    torch.manual_seed(0)
    target = Decoder(cfg, torch.float32, "cpu")
    folder = tmp_path_factory.mktemp("head")
    save_random_head(cfg, folder)
    rng = random.Random(0)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
    return target, str(folder), prompts


def _serve(target, folder, prompts, rounds, k=K, online=None, max_new=20):
    """Serve ``rounds`` passes over the prompts, 2 at a time; (outputs, a_1 per round, adapter)."""
    engine = SpecEngine(target, make_drafter("eagle", target, max(k, 1), head=folder),
                        EngineConfig(max_num_seqs=2, max_len=64, k_max=max(k, 1)))
    adapter = OnlineAdapter(engine, folder, online) if online else None
    outputs, a1 = [], []
    for r in range(rounds):
        reqs = [Request(list(p), max_new, r * 100 + i) for i, p in enumerate(prompts)]
        sched = Scheduler(engine, DraftTable.fixed(k), after_step=adapter.after_step if adapter else no_hook)
        stats = sched.run(reqs)
        if adapter:
            adapter.flush()
        outputs.append([q.output for q in reqs])
        a1.append(stats.counts.accepted[0] / max(1, stats.counts.reached[0]) if k else None)
    if adapter:
        adapter.close()
    return outputs, a1, adapter, engine


@pytest.mark.parametrize("background", [False, True])
def test_greedy_outputs_are_identical_with_and_without_online_adaptation(setup, background):
    target, folder, prompts = setup
    base, _, _, _ = _serve(target, folder, prompts, 1, k=0)
    frozen, _, _, _ = _serve(target, folder, prompts, 2)
    learned, _, adapter, engine = _serve(target, folder, prompts, 2,
                                         online=OnlineConfig(lr=3e-3, steps=2, background=background))
    assert frozen == [base[0]] * 2 and learned == frozen
    assert adapter.stats.learned == adapter.stats.queued == 8 and adapter.stats.published >= 1
    assert 1 <= adapter.stats.updates <= 8  # one update for the requests a step finishes (or the worker finds)
    # each update's host time is kept; its GPU time only on CUDA (events on the side stream)
    assert adapter.stats.update_host_s > 0 and adapter.stats.update_gpu_ms == 0.0
    initial = make_drafter("eagle", target, K, head=folder)
    assert not torch.equal(engine.drafter.fc, initial.fc)  # the head the engine drafts with did change


def test_head_learns_the_stream_it_serves(setup):
    """A repeated stream at T = 0: the adapting head accepts more of it from round to round; the frozen one not."""
    target, folder, prompts = setup
    _, frozen, _, _ = _serve(target, folder, prompts, 3)
    _, learned, adapter, _ = _serve(target, folder, prompts, 3, online=OnlineConfig(lr=3e-3, steps=4))
    assert frozen[0] == frozen[-1]
    assert learned[-1] > frozen[-1] + 0.15, (frozen, learned)


def test_adapter_refuses_a_drafter_that_is_not_a_trained_eagle_head(setup):
    target, folder, _ = setup
    engine = SpecEngine(target, make_drafter("ngram", target, 2), EngineConfig(max_num_seqs=2, max_len=64, k_max=2))
    with pytest.raises(ValueError, match="EAGLE-1"):
        OnlineAdapter(engine, folder)


@pytest.mark.parametrize("background", [False, True])
def test_an_update_that_raises_stops_learning_not_serving(setup, monkeypatch, background):
    """The first failed update is kept in ``stats.error``; later requests are not queued, ``flush`` returns (the
    worker drains its queue), and the outputs stay the target's greedy ones."""
    target, folder, prompts = setup
    base, _, _, _ = _serve(target, folder, prompts, 1, k=0)

    def broken(self, seqs):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore lines")

    monkeypatch.setattr(OnlineAdapter, "_update", broken)
    learned, _, adapter, _ = _serve(target, folder, prompts, 2,
                                    online=OnlineConfig(lr=3e-3, steps=2, background=background))
    assert learned == [base[0]] * 2
    assert adapter.stats.error == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert adapter.stats.updates == 0 and adapter.stats.published == 0
    # in the foreground the first finishing step's update (its 1 or 2 requests) fails before the next is queued; a
    # worker fails a moment later
    assert 1 <= adapter.stats.queued <= (2 if not background else 7)


def test_one_update_over_padded_sequences_is_their_position_weighted_mean(setup):
    """``collate`` right-pads two sequences of different lengths into one batch: its loss is the mean of theirs
    weighted by their positions, so the padding is masked out and neither sequence sees the other's or its own
    padding (a mask that let the padding in, or a non-causal head, would change it)."""
    from tabletune.drafter.online import collate
    from tabletune.drafter.train import LossConfig, batch_loss
    from tabletune.integrations.hf.eagle_head import load_head

    target, folder, _ = setup
    head = load_head(folder)
    embed, lm_head = target.embed.detach(), target.lm_head.detach()
    gen = torch.Generator().manual_seed(0)
    hidden = embed.shape[1]
    seqs = [(torch.randint(0, 97, (n,), generator=gen), torch.randn(n, hidden, generator=gen)) for n in (9, 5)]
    cfg = LossConfig()
    with torch.no_grad():
        both, _ = batch_loss(head, embed, lm_head, collate(seqs), cfg, with_stats=False)
        each = [batch_loss(head, embed, lm_head, collate([s]), cfg, with_stats=False)[0] for s in seqs]
    weights = [n - 1 for n in (9, 5)]
    want = sum(w * float(x) for w, x in zip(weights, each)) / sum(weights)
    assert float(both) == pytest.approx(want, rel=1e-5)
    batch = collate(seqs)
    assert batch["mask"].sum(1).tolist() == weights and batch["ids"][1, 5:].eq(0).all()
