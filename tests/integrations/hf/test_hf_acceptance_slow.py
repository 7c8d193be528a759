"""The CI-sized acceptance run: 4 prompts, 32 tokens, on the real SmolLM2-135M (CPU)."""

import gzip

import numpy as np
import pytest
from click.testing import CliRunner

from tabletune.acceptance import AcceptanceProfile
from tabletune.cli import main
from tabletune.integrations.hf import measure

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    """Trajectories in a fresh folder (generation runs for real); the model comes from the asset cache."""
    path = tmp_path_factory.mktemp("cache")
    patch = pytest.MonkeyPatch()
    patch.setattr(measure, "cache_dir", lambda: path)
    yield path
    patch.undo()


def run_cli(tmp_path, drafter, temperature, *extra):
    out, trace = tmp_path / f"{drafter}_T{temperature}.json", tmp_path / f"{drafter}_T{temperature}.csv.gz"
    result = CliRunner().invoke(main, ["acceptance", "--model", "smollm2-135m", "--drafter", drafter, "--workload",
                                       "code-edit", "--temperature", str(temperature), "--k-max", "8",
                                       "--num-prompts", "4", "--max-new-tokens", "32", "--out", str(out),
                                       "--trace-out", str(trace), *extra])
    assert result.exit_code == 0, result.output
    entry = AcceptanceProfile.load(out).entries[0]
    rows = [line.split(",") for line in gzip.decompress(trace.read_bytes()).decode().splitlines()[1:]]
    return entry, rows, measure.detail_path(out)


def test_ngram_greedy_on_code_edit(fresh_cache, tmp_path):
    entry, rows, detail = run_cli(tmp_path, "ngram", 0)
    assert (entry.drafter, entry.workload, entry.temperature, entry.k_max) == ("ngram", "code-edit", 0.0, 8)
    assert entry.num_drafts > 0 and all(a <= r for a, r in zip(entry.accepted, entry.reached))
    assert len(rows) == sum(entry.reached)  # one trace row per tested token
    assert sum(int(r[-1]) for r in rows) == sum(entry.accepted)
    assert all(r[4] == "" and r[-2] in ("0", "1") for r in rows)  # no probabilities; greedy accept is 0/1
    # the answer copies its input: prompt lookup must find and pass long runs
    assert entry.rates()[0] > 0.3 and entry.mean_accepted_length() > 1.0
    assert len(list((fresh_cache / "trajectories").glob("code-edit_T0_*"))) == 1


def test_early_exit_greedy_and_sampled(fresh_cache, tmp_path):
    greedy, rows, _ = run_cli(tmp_path, "early-exit", 0, "--exit-layer", "24")
    assert all(0 < float(r[4]) <= 1 and r[-2] in ("0", "1") for r in rows)
    assert greedy.drafted[0] == greedy.num_drafts  # always proposes, k=8 or the tokens left
    sampled, rows, _ = run_cli(tmp_path, "early-exit", 1, "--exit-layer", "24")
    probs = np.array([float(r[-2]) for r in rows])
    assert ((probs >= 0) & (probs <= 1)).all() and ((probs > 0) & (probs < 1)).any()


def test_greedy_trajectory_is_the_targets_argmax(fresh_cache):
    """Lossless at T=0: every replayed token is the target's own greedy choice under teacher forcing."""
    import torch

    from tabletune.integrations.hf.smollm2 import smollm2_model_dir
    from tabletune.integrations.hf.model import SmolLM2Runner

    run = measure.AcceptanceRun(drafter="ngram", workload="code-edit", temperature=0.0, num_prompts=4, max_new_tokens=32)
    runner = SmolLM2Runner(smollm2_model_dir())
    for t in measure.trajectories(run, runner):
        with torch.no_grad():
            logits = runner.model(torch.tensor([t.prompt + t.output])).logits[0, len(t.prompt) - 1:-1]
        agree = (logits.argmax(-1) == torch.tensor(t.output)).float().mean().item()
        assert agree >= 0.95
