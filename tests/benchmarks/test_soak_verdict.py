"""The soak's verdict judges each scrape by the last event before it (benchmarks/soak_vllm_serve.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import soak_vllm_serve as soak  # noqa: E402

PINNED = [[1, 64, 2]]


def record(samples: list[tuple[float, bool]], events: list[dict]) -> dict:
    """A soak record whose other checks pass: only the pin checks can fail."""
    rows = [{"t_s": t, "pinned": 1.0 if pinned else 0.0, "table": PINNED if pinned else [[1, 64, 3]],
             "sidecar_table": [[1, 64, 3]], "rejected": 1, "installs": 1, "errors": {}} for t, pinned in samples]
    return {"num_failures": 0, "short": 0, "requests": 10, "tokens": 100, "duration_s": 40.0, "samples": rows,
            "installs_logged": [], "events": events, "rejected_at_start": 0, "refused_log_lines": 1,
            "sidecar_ignored": 1, "k_max": 4, "fault_period_s": 10.0,
            "rss": [(10.0, 100.0), (40.0, 100.0)], "rss_processes": [(10.0, {"api": 100.0}), (40.0, {"api": 100.0})]}


def test_a_scrape_taken_with_an_event_belongs_to_it_and_a_late_one_is_judged():
    events = [{"t_s": 20.0, "event": "unpin"}, {"t_s": 31.6, "event": "pin", "table": PINNED}]
    # scraped in the iteration that wrote the pin (same time stamp): not judged as "after unpin"
    ok = record([(27.0, False), (31.6, True), (37.0, True)], events)
    assert soak.verdict(ok, rss_scope="api-server")[1] == []
    # still pinned well after the unpin: a failure
    late = record([(27.0, True), (31.6, True), (37.0, True)], events)
    assert soak.verdict(late, rss_scope="api-server")[1] == ["at 27.0 s after unpin: pinned 1.0 table [[1, 64, 2]]"]
