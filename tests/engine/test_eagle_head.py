"""A trained EAGLE head in the engine: loaded from its folder, lossless, and drafting as the replay measures."""

import random

import pytest

torch = pytest.importorskip("torch")

from tabletune.integrations.hf.eagle_head import EagleHead, HeadConfig, save_head, save_random_head  # noqa: E402
from tabletune.engine import tuner_adapter  # noqa: E402
from tabletune.engine.drafters import make_drafter  # noqa: E402
from tabletune.engine.model import Decoder  # noqa: E402
from tabletune.engine.presets import PRESETS, config_from_hf, replace  # noqa: E402
from tabletune.engine.runner import EngineConfig, SpecEngine  # noqa: E402
from tabletune.engine.scheduler import Request, Scheduler  # noqa: E402
from tabletune.errors import InputError  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402
from tabletune.tuner import EngineSpec  # noqa: E402

HEAD = "profiles/drafters/smollm2-135m-eagle"


def _serve(target, drafter, prompts, k, max_new):
    engine = SpecEngine(target, drafter, EngineConfig(max_num_seqs=len(prompts), max_len=max(map(len, prompts))
                                                      + max_new + 2 * k + 8, k_max=k))
    reqs = [Request(list(p), max_new, i) for i, p in enumerate(prompts)]
    stats = Scheduler(engine, DraftTable.fixed(k)).run(reqs)
    return [r.output for r in reqs], stats


def test_random_head_from_a_folder_is_lossless(tmp_path):
    cfg = replace(PRESETS["tiny"], name="tiny-llama", qk_norm=False)
    torch.manual_seed(0)
    target = Decoder(cfg, torch.float32, "cpu")
    save_random_head(cfg, tmp_path)
    rng = random.Random(0)
    prompts = [[rng.randrange(97) for _ in range(rng.randrange(3, 20))] for _ in range(4)]
    base, _ = _serve(target, make_drafter("ngram", target, 4), prompts, 0, 24)
    out, stats = _serve(target, make_drafter("eagle", target, 4, head=str(tmp_path)), prompts, 4, 24)
    assert out == base and stats.counts.num_drafts > 0


def test_head_refused_for_a_target_of_another_shape(tmp_path):
    head = EagleHead(HeadConfig(32, 4, 2, 8, 48, 10000.0, 1e-5, 97))
    save_head(head, tmp_path, {})
    target = Decoder(replace(PRESETS["tiny"], qk_norm=False), torch.float32, "cpu")
    with pytest.raises(InputError, match="shape"):
        make_drafter("eagle", target, 2, head=str(tmp_path))


def test_methods_with_a_draft_need_one_unless_the_acceptance_is_synthetic():
    for method in ("eagle", "eagle3", "draft_model"):
        with pytest.raises(InputError, match="--draft-model"):
            tuner_adapter.validate(EngineSpec(model="tiny", method=method, k_max=2, max_batch_size=2))
        tuner_adapter.validate(EngineSpec(model="tiny", method=method, k_max=2, max_batch_size=2,
                                          synthetic_acceptance=(0.5, 0.5)))
    tuner_adapter.validate(EngineSpec(model="tiny", method="ngram", k_max=2, max_batch_size=2))


@pytest.mark.slow
def test_trained_head_on_smollm2_is_lossless_and_drafts_as_the_replay_measures():
    transformers = pytest.importorskip("transformers")
    from tabletune.assets import load_prompts
    from tabletune.integrations.hf import smollm2 as assets
    from tabletune.integrations.hf.eagle import EagleScorer
    from tabletune.integrations.hf.model import SmolLM2Runner
    from tabletune.integrations.hf.replay import count, replay

    try:
        folder = assets.smollm2_model_dir()
    except Exception as exc:  # the package that carries the weights is missing
        pytest.skip(f"SmolLM2 weights unavailable: {exc}")
    target = Decoder(config_from_hf(folder), torch.float32, "cpu")
    target.load_safetensors(folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    prompts = [tok(p.text, add_special_tokens=False).input_ids for p in load_prompts("code", 2)]
    k, max_new = 4, 48
    with torch.inference_mode():
        base, _ = _serve(target, make_drafter("ngram", target, k), prompts, 0, max_new)
        out, stats = _serve(target, make_drafter("eagle", target, k, head=HEAD), prompts, k, max_new)
    assert out == base
    runner = SmolLM2Runner(folder)
    scorer = EagleScorer(runner, HEAD)
    replays = [replay(str(i), len(o), k, scorer.proposer(p, o, 0.0, 2, 5), None) for i, (p, o) in
               enumerate(zip(prompts, base))]
    expected = count(replays, k)
    assert stats.counts.accepted[0] / stats.counts.reached[0] > 0.5
    # the engine drafts what the measurement replays (float32 both; the last draft of a request may be cut)
    assert abs(stats.counts.accepted[0] - expected.accepted[0]) <= 2
    assert abs(stats.counts.num_drafts - expected.num_drafts) <= 2
