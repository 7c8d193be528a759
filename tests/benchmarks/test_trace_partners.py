"""Each committed model trace and its n-gram partner (``policies_sim.trace_files``) follow the same continuations.

The engine's and the simulator's replay pair the two chains request by request and position by position, so a
partner recorded along other continuations (other prompts, another length, another generation) would pair one
text's model drafts with another text's n-gram lookups. Both traces record the n-gram lookup's match length at
every draft start (the model traces as a signal, the n-gram traces as the drafter's own match), a function of the
text up to that position: wherever both start a draft at the same position of the same request, they must agree.
"""

import csv
import gzip
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from policies_sim import NGRAM_PARTNER, TRACES, trace_files  # noqa: E402


def draft_starts(path: Path) -> dict[tuple[str, int], int]:
    """(request, generation position) of every draft start -> the n-gram match length recorded there."""
    with gzip.open(path, "rt") as fh:
        return {(r["request"], int(r["gen_pos"])): int(r["ngram_len"]) for r in csv.DictReader(fh)
                if r["draft_pos"] == "1"}


PAIRS = [(m, p.name[len(m) + 1:-len("_T0.csv.gz")]) for m in NGRAM_PARTNER
         for p in sorted(TRACES.glob(f"{m}_*_T0.csv.gz"))]


def test_every_model_trace_has_a_partner():
    assert {m for m, _ in PAIRS} == set(NGRAM_PARTNER)
    for model_trace, workload in PAIRS:
        assert trace_files(model_trace, workload)[1].exists(), (model_trace, workload)


@pytest.mark.parametrize("model_trace,workload", PAIRS)
def test_a_model_trace_and_its_partner_agree_on_the_lookup_at_every_common_draft_start(model_trace, workload):
    model_path, ngram_path = trace_files(model_trace, workload)
    model, ngram = draft_starts(model_path), draft_starts(ngram_path)
    requests = {r for r, _ in model}
    # the partner covers the model trace's requests (a request whose lookup never matched has no n-gram row)
    assert len(requests & {r for r, _ in ngram}) >= 0.9 * len(requests)
    common = set(model) & set(ngram)
    assert len(common) >= 20, (model_trace, workload, len(common))
    disagree = sorted(key for key in common if model[key] != ngram[key])
    assert not disagree, (model_trace, workload, len(disagree), disagree[:5])
