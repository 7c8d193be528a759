"""Table 2: what the controller gains when it starts from a mistuned table.

Cases (static table vs the controller starting from that table, same seeds):

1. ``documented-div4`` with a mismatched prior: the controller's prior rates are
   the trained head's measured on HumanEval (``eagle-code``) while chat is served;
2. ``documented``: vLLM's documented table, prior measured offline;
3. a hand-written n-gram table on code edits, ``HAND_NGRAM`` (k = 5 up to 32
   requests, 3 up to 128, 1 beyond), prior measured offline.

Gain = controller / static - 1, per load (mean over seeds); we report its mean and
maximum over loads, and both policies' worst share of the best fixed k.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tabletune import fileio
from tabletune.experiments.analysis import Section, md_table, pct, shares, worst_loss, write_csv
from tabletune.experiments.provenance import inputs_markdown
from tabletune.experiments.runner import Lab, fixed_policies
from tabletune.experiments.settings import SETTINGS

HAND_NGRAM = [[1, 32, 5], [33, 128, 3], [129, 512, 1]]


def cases(lab: Lab, out: Path) -> list[tuple[str, str, str, tuple[float, ...] | None]]:
    """(setting, static policy, controller policy, prior override or None)."""
    hand = out / "table2_hand_ngram_table.json"
    fileio.write_json(hand, {"num_speculative_tokens": 5, "num_speculative_tokens_per_batch_size": HAND_NGRAM})
    mismatched = lab.measured_rates(SETTINGS["eagle-code"])
    return [
        ("eagle", "documented-div4", "controller:start=documented-div4", mismatched),
        ("eagle", "documented", "controller:start=documented", None),
        ("ngram-code-edit", f"table:{hand}", f"controller:start={hand}", None),
    ]


def table2(lab: Lab, out: Path, loads: Sequence[int], seeds: Sequence[int]) -> Section:
    body, all_rows, summary = [], [], {}
    for setting, static, ctrl, prior in cases(lab, out):
        fixed = fixed_policies(lab, setting)
        points = lab.grid(setting, fixed, loads, seeds)
        points += lab.grid(setting, [static, ctrl], loads, seeds, prior=prior)
        rows = shares(points, fixed)
        all_rows += [_relabel(r, out) for r in rows]
        by = {(s.policy, s.load): s for s in rows}
        gains = [by[(ctrl, n)].throughput_tok_s / by[(static, n)].throughput_tok_s - 1 for n in loads]
        static_loss, _ = worst_loss(rows, setting, static)
        ctrl_loss, _ = worst_loss(rows, setting, ctrl)
        label = static if not static.startswith("table:") else "hand-written n-gram table"
        key = f"{setting}/{label}" + (" (mismatched prior)" if prior else "")
        summary[key] = {"mean_gain": sum(gains) / len(gains), "max_gain": max(gains),
                        "static_worst_loss": static_loss, "controller_worst_loss": ctrl_loss}
        body.append([setting, label + (" + mismatched prior" if prior else ""), pct(sum(gains) / len(gains)),
                     pct(max(gains)), pct(static_loss), pct(ctrl_loss)])
    files = [write_csv(out / "table2.csv", all_rows), "table2_hand_ngram_table.json"]
    md = (inputs_markdown(lab, ["eagle", "eagle-code", "ngram-code-edit"]) + "\n\n"
          "Controller = `tabletune.controller.Controller` (the vLLM plugin's class) starting from the table; "
          "the mismatched prior is `eagle-code`'s calibration rates.\n\n"
          + md_table(["setting", "starting table", "mean gain over loads", "max gain", "static worst loss",
                      "controller worst loss"], body))
    return Section("table2", "Table 2: controller gains from mistuned tables", md, files, summary)


def _relabel(row, out: Path):
    """CSV rows name the hand-written table file relative to the output folder."""
    from dataclasses import replace

    return replace(row, policy=row.policy.replace(f"{out}/", ""))

