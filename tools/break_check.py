"""Break each guarded behaviour on purpose and check that a fast test fails (not run by CI).

For every entry of ``BREAKS``: copy the committed tree once into a scratch folder, apply the one
textual change to one file there, run the listed fast test files (``-m "not slow"``), record which
tests failed, and put the file back. A break that no test catches is reported as NOT CAUGHT and the
script exits 1.

    python tools/break_check.py [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Break:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


HOOK = "tabletune/integrations/vllm/controller_hook.py"
METRICS = "tabletune/integrations/vllm/metrics.py"
HOOK_TESTS = ("tests/integrations/test_controller_hook_window.py", "tests/integrations/test_table_check.py",
              "tests/integrations/test_live_control.py", "tests/integrations/test_metrics_names.py",
              "tests/integrations/test_attach.py")
METRIC_TESTS = ("tests/integrations/test_metrics_names.py", "tests/integrations/test_live_control.py",
                "tests/integrations/test_prometheus.py")
FLEET_TESTS = ("tests/sim/test_fleet.py",)
TUNE_TESTS = ("tests/cli/test_tune_failures.py", "tests/cli/test_tune_cmd.py", "tests/tuner/test_static_check.py")

def rename(kind: str, name: str, exported: str) -> tuple[str, str]:
    """(old, new) text that exports the family ``name`` as ``tabletune_<exported>`` (the code keeps its key)."""
    family = "GaugeMetricFamily" if kind == "g" else "CounterMetricFamily"
    old = f'{kind} = {{name: {family}(f"tabletune_{{name}}", doc,'
    return old, old.replace('f"tabletune_{name}"', f'f"tabletune_{{name}}".replace("{name}", "{exported}")')


BREAKS = (
    Break("fleet: round-robin sends every request to replica 0", "tabletune/sim/fleet.py",
          "return turn % len(loads)", "return 0", FLEET_TESTS),
    Break("fleet: least-loaded replaced by fill-first", "tabletune/sim/fleet.py",
          "return min(range(len(loads)), key=loads.__getitem__)",
          "return next((i for i, n in enumerate(loads) if n < 128), 0)", FLEET_TESTS),
    Break("budget: need_bytes ignores the weights", "tabletune/tuner/budget.py",
          "return self.weights_bytes + self.engines *", "return self.engines *",
          ("tests/tuner/test_budget.py", "tests/engine/test_tuner_adapter.py")),
    Break("memory_plan: the draft model to load not counted", "tabletune/engine/tuner_adapter.py",
          'if self.method != "draft_model":\n            return 0\n', "return 0\n",
          ("tests/engine/test_tuner_adapter.py",)),
    Break("memory_plan: the loaded weights not reported", "tabletune/engine/tuner_adapter.py",
          "already_allocated_bytes=loaded)", "already_allocated_bytes=0)", ("tests/engine/test_tuner_adapter.py",)),
    Break("memory_plan: KV for max_batch slots (no spare slot)", "tabletune/engine/tuner_adapter.py",
          "kv_bytes=(slots + 1) * self._sequence_bytes", "kv_bytes=slots * self._sequence_bytes",
          ("tests/engine/test_tuner_adapter.py",)),
    Break("draft check: a good step does not end a stretch", "tabletune/integrations/vllm/table_check.py",
          "elif table_k < self.k_max:\n            self.run = 0", "elif False:\n            self.run = 0", HOOK_TESTS),
    Break("hook: never builds its draft check", HOOK,
          "self.check = DraftCheck(self.num_spec_tokens, describe=engine_description)", "self.check = None",
          HOOK_TESTS),
    Break("hook: state leaves table_honoured out", HOOK,
          "**(self.check.state() if self.check is not None else {}),", "", HOOK_TESTS),
    Break("hook: never wraps the scheduler's methods", HOOK, "        self._wrap()\n", "", HOOK_TESTS),
    Break("hook: rows still override after the controller installed a table", HOOK,
          "and not explore and c.installs == 0 and c.pins == 0:", "and not explore:", HOOK_TESTS),
    Break("hook: rows override a pinned table", HOOK,
          "and not explore and c.installs == 0 and c.pins == 0:", "and not explore and c.installs == 0:",
          HOOK_TESTS),
    Break("attach: the controller gets the largest context's profile", HOOK,
          "table.rows[0].max_context_len", "table.rows[-1].max_context_len", HOOK_TESTS),
    Break("attach: table_by_context.json not read", HOOK, "    if not path.is_file():\n", "    if True:\n",
          HOOK_TESTS),
    Break("controller: a pinned controller explores", "tabletune/controller/controller.py",
          "        if self.pinned:\n            return False\n        self._credit", "        self._credit",
          HOOK_TESTS + ("tests/controller/test_controller.py",)),
    Break("metrics: tabletune_draft_rate renamed", METRICS, *rename("g", "draft_rate", "draft_ratio"), METRIC_TESTS),
    Break("metrics: tabletune_steps renamed", METRICS, *rename("c", "steps", "step_count"), METRIC_TESTS),
    Break("metrics: tabletune_table_installs renamed", METRICS, *rename("c", "table_installs", "installs"),
          METRIC_TESTS),
    Break("metrics: tabletune_exploration_steps renamed", METRICS,
          *rename("c", "exploration_steps", "explore_steps"), METRIC_TESTS),
    Break("metrics: tabletune_ignored_windows renamed", METRICS, *rename("c", "ignored_windows", "ignored"),
          METRIC_TESTS),
    Break("metrics: ignored windows never exported", METRICS,
          'c["ignored_windows"].add_metric([e, reason], n)', "pass", METRIC_TESTS),
    Break("metrics: the draft rate exported as a constant", METRICS,
          'g["draft_rate"].add_metric([e], snap.get("draft_rate", 1.0))', 'g["draft_rate"].add_metric([e], 1.0)',
          METRIC_TESTS),
    Break("provenance: file_digest returns a constant", "tabletune/experiments/provenance.py",
          "return hashlib.sha256(path.read_bytes()).hexdigest()[:10]", 'return "0d93cfb955"',
          ("tests/experiments/test_provenance.py",)),
    Break("drafter: training loop without its optimizer step", "tabletune/drafter/train.py",
          "            opt.step()\n            step += 1", "            step += 1", ("tests/drafter/test_train.py",)),
    Break("sglang: stale windows kept after a step down", "tabletune/policies/sglang.py",
          "for w in self.windows[best:]:\n                w.clear()", "for w in self.windows[best:]:\n                pass",
          ("tests/policies/test_sglang.py",)),
    Break("tune: the checkpoint folder appears before the engine starts", "tabletune/tuner/checkpoint.py",
          "            cp._fresh = True  #", "            cp.folder.mkdir(parents=True, exist_ok=True)\n"
          "            cp._fresh = True  #", TUNE_TESTS),
    Break("tune: vLLM's KV cap never caps", "tabletune/integrations/vllm/tuner_engine.py",
          "    b = largest_batch(have_tokens, shared, per_request, n)", "    b = n", TUNE_TESTS),
    Break("tune: vLLM's KV need counts the prompt per request under prefix caching",
          "tabletune/integrations/vllm/tuner_engine.py", "    shared = prompt_tokens if shared_prompt else 0",
          "    shared = 0", TUNE_TESTS),
    Break("tune: the static-mode engine runs before the tables are written", "tabletune/cli/tune.py",
          "    results, files = write_runs(", "    _static_check(adapter, spec, plan, outcomes[0], lens[0], noise_floor,"
          " console) if static_check else None\n    results, files = write_runs(", TUNE_TESTS),
    Break("checkpoint: a corrupted line in the middle is skipped", "tabletune/tuner/checkpoint.py",
          "                if i == len(lines) - 1:\n                    break",
          "                if True:\n                    continue", ("tests/tuner/test_checkpoint.py",)),
    Break("checkpoint: a malformed record is a traceback", "tabletune/tuner/checkpoint.py",
          "except (AttributeError, KeyError, TypeError, ValueError) as exc:", "except ZeroDivisionError as exc:",
          ("tests/tuner/test_checkpoint.py",)),
    Break("tuner: per-k runs at q = 0.95 itself", "tabletune/tuner/run.py",
          "if counts.draft_rate >= plan.yields_below_draft_rate:", "if counts.draft_rate > plan.yields_below_draft_rate:",
          ("tests/tuner/test_yields.py",)),
    Break("sim replay: the next draft starts one row early", "tabletune/sim/loop.py",
          "reqs.trace_pos = reqs.trace_pos + tokens", "reqs.trace_pos = reqs.trace_pos + tokens - 1",
          ("tests/engine/test_replay_agreement.py",)),
    Break("engine replay: the cap counts every accepted row, not the leading run",
          "tabletune/engine/trace_replay.py", "torch.cumprod(ok, dim=1).sum(1)], 1)", "ok.sum(1)], 1)",
          ("tests/engine/test_replay_agreement.py",)),
    Break("verify: acceptance 4% below min(1, p/q)", "tabletune/engine/verify.py",
          "accept = u * q_d < p_d  #", "accept = u * q_d < 0.96 * p_d  #", ("tests/engine/test_verify.py",)),
    Break("acceptance cap: rates 0.02 low", "tabletune/integrations/vllm/acceptance_cap.py",
          "reject = (uniform >= rate) &", "reject = (uniform >= rate - 0.02) &",
          ("tests/integrations/test_acceptance_cap.py",)),
    Break("engine caps: rates 0.02 low", "tabletune/engine/scheduler.py",
          "rng.random() < rates[min(j, len(rates) - 1)]:", "rng.random() < rates[min(j, len(rates) - 1)] - 0.02:",
          ("tests/engine/test_engine.py",)),
    Break("sim acceptance: margins shifted down", "tabletune/sim/acceptance.py",
          "return logits - np.log(u / (1.0 - u))", "return logits - 0.05 - np.log(u / (1.0 - u))",
          ("tests/sim/test_acceptance.py",)),
    Break("hf replay: fractional acceptance 0.03 low", "tabletune/integrations/hf/replay.py",
          "ok = p >= 1.0 or (p > 0.0 and rng.random() < p)", "ok = p >= 1.0 or (p > 0.0 and rng.random() < p - 0.03)",
          ("tests/integrations/hf/test_hf_replay.py",)),
    Break("test-slow: stops at the first failing file", "tools/run_slow_tests.sh",
          'failed+=("$f (exit $rc)")', "exit $rc", ("tests/test_makefile.py",)),
    Break("test-slow: no slow test collected counts as a failure", "tools/run_slow_tests.sh",
          ' && [ "$rc" -ne 5 ]', "", ("tests/test_makefile.py",)),
    Break("report: figures not embedded", "tabletune/experiments/report.py",
          'images = "".join(f"\\n![{f}]({f})\\n" for f in section.files if f.endswith(".png"))', 'images = ""',
          ("tests/experiments/test_experiments.py",)),
)


def run(brk: Break, scratch: Path) -> list[str]:
    """The failing test ids with ``brk`` applied in ``scratch``."""
    target = scratch / brk.path
    pristine = target.read_text()
    if pristine.count(brk.old) != 1:
        raise SystemExit(f"{brk.name}: the text to change occurs {pristine.count(brk.old)} times in {brk.path}")
    target.write_text(pristine.replace(brk.old, brk.new))
    try:
        env = {**os.environ, "PYTHONPATH": str(scratch), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-m", "not slow", "-p", "no:cacheprovider",
                               *brk.tests], cwd=scratch, env=env, capture_output=True, text=True)
        return re.findall(r"^FAILED (\S+)", proc.stdout, re.M) or (
            [f"(exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]})"] if proc.returncode else [])
    finally:
        target.write_text(pristine)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="substrings of the break names to run")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    todo = [b for b in BREAKS if not args.only or any(s in b.name for s in args.only)]
    if args.list:
        print("\n".join(b.name for b in todo))
        return 0
    missed = 0
    with tempfile.TemporaryDirectory(prefix="break-check-") as tmp:
        scratch = Path(tmp) / "tree"
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        scratch.mkdir()
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
        for brk in todo:
            failed = run(brk, scratch)
            missed += not failed
            print(f"{brk.name}: " + ("NOT CAUGHT" if not failed else "caught by " + ", ".join(failed)), flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
