"""The controller as a sidecar: acceptance from vLLM's Prometheus counters.

For deployments that cannot load the plugin. It scrapes ``/metrics`` with
``prometheus_client``'s text parser and reads, summed over engines:

* ``vllm:spec_decode_num_drafts_total`` (D), ``vllm:spec_decode_num_draft_tokens_total`` (T),
* ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=j-1}`` (acc_j),
* ``vllm:num_requests_running`` (the batch size, for the record only).

The bias: vLLM exports accepted-per-position but *not drafted-per-position*.
The naive rate acc_j / D assumes every draft reached length j; when k varies
with the batch size (the whole point of a table), drafts shorter than j count
as failures at j and deep positions look worse than they are. We correct with
the table in force: the k values it can schedule are known, and the window's
mean draft length T / D lies between two of them, k_lo <= T/D <= k_hi. We take
the drafts as that two-point mixture (share q = (T/D - k_lo) / (k_hi - k_lo) of
length k_hi), so drafted_j = D for j <= k_lo, q D for k_lo < j <= k_hi, 0 above.
This is exact when the window used one k or two adjacent ones, and still an
approximation when the batch size swept over more ranges in one window, or
when the drafter proposed fewer tokens than scheduled (n-gram without a match
proposes nothing, which is not a draft and does not bias). Reached counts then
follow ``StepObservation.from_vllm_counts`` (length independent of acceptance).

With the plugin loaded, the engine also exports exact censored counts
(``tabletune_reached_total{position}``, ``tabletune_accepted_total{position}``,
``tabletune_drafts_total``, ``tabletune_undrafted_total``, see
``tabletune.integrations.vllm.metrics``); the sidecar then uses those and needs no
correction.

Several replicas (``Sidecar.feed_all``): each source keeps its own cumulative
baseline, and the window's deltas of all sources are summed into one observation,
so the pooled estimate gets N replicas' evidence per window. A source whose counters
went backwards (a restart) or that could not be scraped skips that window alone.

The sidecar cannot change the engine's k, so it cannot explore: positions above
the table's largest k keep their prior (chained to the measured level), unless the
engines' plugins explore (their exact counts include those steps).
Counter resets (an engine restart) and NaN scrapes are ignored for one window.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from tabletune.controller import Controller
from tabletune.controller.estimator import CumulativeCounters, StepObservation
from tabletune.table import DraftTable

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
RUNNING = "vllm:num_requests_running"
TT_DRAFTS = "tabletune_drafts"
TT_UNDRAFTED = "tabletune_undrafted"
TT_REACHED = "tabletune_reached"
TT_ACCEPTED = "tabletune_accepted"


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative spec-decode counters of one scrape (summed over engines)."""

    num_drafts: float
    num_draft_tokens: float
    accepted_per_pos: tuple[float, ...]
    num_requests_running: float = 0.0
    # the plugin's exact censored counts (None without the plugin): drafts, reached_j, accepted_j, undrafted
    exact: tuple[float, tuple[float, ...], tuple[float, ...], float] | None = None


def parse_metrics(text: str) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text exposition; None if the engine has none."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    exact: dict[str, dict[int, float]] = {TT_REACHED: {}, TT_ACCEPTED: {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in exact and sample.name.endswith("_total"):
                pos = int(sample.labels.get("position", "1"))
                exact[name][pos] = exact[name].get(pos, 0.0) + sample.value
            elif name in (TT_DRAFTS, TT_UNDRAFTED) and sample.name.endswith("_total"):
                totals[name] = totals.get(name, 0.0) + sample.value
            elif name == ACCEPTED_PER_POS and sample.name.endswith("_total"):
                pos = int(sample.labels.get("position", "0"))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif name in (DRAFTS, DRAFT_TOKENS) and sample.name.endswith("_total"):
                totals[name] = totals.get(name, 0.0) + sample.value
            elif sample.name == RUNNING:
                totals[RUNNING] = totals.get(RUNNING, 0.0) + sample.value
    exact_counts = None
    if TT_DRAFTS in totals and exact[TT_REACHED]:
        n = max(exact[TT_REACHED])
        exact_counts = (totals[TT_DRAFTS], tuple(exact[TT_REACHED].get(j, 0.0) for j in range(1, n + 1)),
                        tuple(exact[TT_ACCEPTED].get(j, 0.0) for j in range(1, n + 1)), totals.get(TT_UNDRAFTED, 0.0))
    if (DRAFTS not in totals or not per_pos) and exact_counts is None:
        return None
    accepted = tuple(per_pos.get(j, 0.0) for j in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(totals.get(DRAFTS, 0.0), totals.get(DRAFT_TOKENS, 0.0), accepted, totals.get(RUNNING, 0.0),
                        exact_counts)


def scrape(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (operator-given URL)
        return response.read().decode()


def drafted_per_position(num_drafts: float, num_draft_tokens: float, table_ks: Sequence[int],
                         k_max: int) -> tuple[float, ...]:
    """drafted_j from D and T, taking the drafts as a mixture of the two table k around T / D."""
    ks = sorted({k for k in table_ks if 0 < k <= k_max}) or list(range(1, k_max + 1))
    if num_drafts <= 0:
        return (0.0,) * k_max
    mean = min(max(num_draft_tokens / num_drafts, ks[0]), ks[-1])
    lo = max(k for k in ks if k <= mean)
    hi = min(k for k in ks if k >= mean)
    share_hi = (mean - lo) / (hi - lo) if hi > lo else 0.0
    return tuple(num_drafts if j <= lo else num_drafts * share_hi if j <= hi else 0.0
                 for j in range(1, k_max + 1))


def naive_rates(num_drafts: float, accepted: Sequence[float]) -> list[float | None]:
    """What the counter alone suggests, acc_j / D: a *survival* ratio, and biased when k varies."""
    return [a / num_drafts if num_drafts > 0 else None for a in accepted]


class Sidecar:
    """Feeds scrape windows of one or more replicas to a Controller (see the module docstring)."""

    def __init__(self, controller: Controller, table_in_force: DraftTable) -> None:
        self.controller = controller
        self.table_in_force = table_in_force
        self.baselines: dict[str, CumulativeCounters] = {}
        self.windows = 0

    def feed(self, counters: SpecCounters, now_s: float) -> StepObservation | None:
        """One scrape of one engine; returns the window's observation, or None (first scrape, reset, NaN, no drafts)."""
        return self.feed_all({"": counters}, now_s)

    def feed_all(self, scrapes: dict[str, SpecCounters | None], now_s: float) -> StepObservation | None:
        """One scrape per source (None: the scrape failed); their windows pooled into one observation."""
        windows = [w for source, counters in scrapes.items()
                   if counters is not None and (w := self.window(source, counters)) is not None]
        if not windows:
            return None
        k_max = self.controller.k_max
        drafts = sum(w[0] for w in windows)
        reached, accepted, drafted = (tuple(sum(w[i][j] for w in windows) for j in range(k_max)) for i in (1, 2, 3))
        undrafted = sum(w[4] for w in windows)
        batch = sum(w[5] for w in windows)
        obs = StepObservation(max(batch, 1), k_max, int(drafts), reached, accepted, drafted, now_s, undrafted)
        self.windows += 1
        self.controller.observe(obs)
        return obs

    def window(self, source: str, counters: SpecCounters) -> tuple | None:
        """(drafts, reached, accepted, drafted, undrafted, batch) of one source since its last scrape."""
        k_max = self.controller.k_max
        baseline = self.baselines.setdefault(source, CumulativeCounters())
        pad = (0.0,) * k_max
        if counters.exact is not None:  # the plugin's exact censored counts
            n, r, a, u = counters.exact
            delta = baseline.delta((n, u, *(tuple(r) + pad)[:k_max], *(tuple(a) + pad)[:k_max]))
            if delta is None or delta[0] <= 0:
                return None
            reached, accepted = delta[2:2 + k_max], delta[2 + k_max:]
            drafted = reached  # drafted_j >= reached_j; the estimator uses reached and accepted only
            drafts, undrafted = delta[0], delta[1]
        else:
            acc = (tuple(counters.accepted_per_pos) + pad)[:k_max]
            delta = baseline.delta((counters.num_drafts, counters.num_draft_tokens, *acc))
            if delta is None or delta[0] <= 0:
                return None
            drafts, tokens, accepted = delta[0], delta[1], delta[2:]
            ks = [k for _, _, k in self.table_in_force.ranges]
            drafted = tuple(max(d, a) for d, a in zip(drafted_per_position(drafts, tokens, ks, k_max), accepted))
            reached = StepObservation.from_vllm_counts(1, 1, int(drafts), drafted, accepted).reached
            undrafted = 0.0
        running = counters.num_requests_running
        batch = max(1, round(running)) if math.isfinite(running) else 1
        return drafts, reached, accepted, drafted, undrafted, batch


def parse_tabletune(text: str) -> dict[str, dict]:
    """The plugin's ``tabletune_*`` series per engine label: table, acceptance, counters ({} if none)."""
    from prometheus_client.parser import text_string_to_metric_families

    engines: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("tabletune_"):
            continue
        name = family.name.removeprefix("tabletune_")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = dict(sample.labels)
            e = engines.setdefault(labels.pop("engine", "0"), {"table": [], "acceptance": {}})
            if name == "k":
                e["table"].append([int(labels["start_bs"]), int(labels["end_bs"]), int(sample.value)])
            elif name == "acceptance":
                e["acceptance"][int(labels["position"])] = sample.value
            elif labels:  # by reason, kind or position
                e.setdefault(name, {})[next(iter(labels.values()))] = sample.value
            else:
                e[name] = sample.value
    for e in engines.values():
        e["table"].sort()
        e["acceptance"] = [e["acceptance"][j] for j in sorted(e["acceptance"])]
    return engines
