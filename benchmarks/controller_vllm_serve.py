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
from vllm_serve_common import SERVE_SHIM, wait_ready  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", type=int, default=16)
    ap.add_argument("--duration-s", type=float, default=90.0)
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()
    from tabletune.integrations.vllm.presets import tiny_llama_dir
    from tabletune.table import VLLM_DOCUMENTED_DIV4_RANGES, DraftTable

    model = str(tiny_llama_dir())
    start = DraftTable(VLLM_DOCUMENTED_DIV4_RANGES).clamped(4).as_lists()
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
            "num_speculative_tokens_per_batch_size": start}
    env = {**os.environ, "TABLETUNE_PROFILE": str(PROFILE), "TABLETUNE_ACCEPTANCE_CAP": RATES,
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-c", SERVE_SHIM, "serve", model, "--load-format", "dummy", "--dtype", "float32",
           "--skip-tokenizer-init", "--max-num-seqs", "64", "--max-model-len", "1024", "--host", "127.0.0.1",
           "--port", str(args.port), "--speculative-config", json.dumps(spec)]
    log_path = ROOT / "out" / "controller_vllm_serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(args.port, proc, timeout_s=600)
            t0 = time.time()
            tokens = drive(args.port, model, args.load, args.duration_s)
            wall_s = time.time() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    lines = [ln.strip() for ln in log_path.read_text().splitlines() if "tabletune:" in ln]
    installs = [ln for ln in lines if "installed table" in ln]
    report = [
        "# `vllm serve` with the TableTune controller", "",
        f"load {args.load} open requests over HTTP for {wall_s:.0f} s: {tokens} output tokens "
        f"({tokens / wall_s:.1f} tok/s); start table {start}; acceptance cap {RATES}.", "",
        f"plugin log lines ({len(installs)} installs):", "", "```", *lines, "```", "",
        "command: `" + " ".join(sys.argv) + "`",
    ]
    out = ROOT / "benchmarks" / "results" / "controller_vllm_serve.md"
    from tabletune import fileio
    fileio.write_text(out, "\n".join(report) + "\n")
    print("\n".join(report))
    if not installs:
        sys.exit("no table was installed")


if __name__ == "__main__":
    main()
