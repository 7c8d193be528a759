"""The paper's figures and tables as functions: each runs its points, writes CSV + PNG, returns a Section.

* fig1: throughput as a share of the best fixed k at each load, every fixed k and the tuned table (8B EAGLE-style).
* table1: worst loss of the tuned table against the best fixed k over loads, per drafter setting.
* fig3: TableTune (table, + controller) vs TurboSpec-style, Nightjar-style, SGLang-style (+ per-request policies).
* table2: controller gains when it starts from a mistuned table (experiments/mistuned.py).
* fig4b: workload switch code -> chat (experiments/switch.py).
* moe: vLLM's documented table against the tuned table on the MoE profile.

All are simulated from measured inputs (``experiments/settings.py``); each section states its
inputs and their fingerprints (``experiments/provenance.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tabletune.experiments.analysis import (Section, bootstrap_ci, md_table, pct, seed_shares, share_matrix_md,
                                            share_plot, shares, worst_loss, write_csv)
from tabletune.experiments.provenance import figure_note, inputs_markdown
from tabletune.experiments.runner import Lab, fixed_policies
from tabletune.experiments.settings import SETTINGS, TABLE1
from tabletune.policies import PER_REQUEST_POLICIES, resolve
from tabletune.errors import InputError

COMPARED = ("tabletune", "controller", "turbospec", "nightjar", "sglang")
#: Fig 3's claim: the tuned table's worst loss is below these policies' in every setting.
RIVALS = ("turbospec", "nightjar")


def available_per_request() -> list[str]:
    """Per-request policies whose modules exist (issue 5b); the others are skipped, and said so."""
    out = []
    for name in PER_REQUEST_POLICIES:
        try:
            resolve(name)
        except InputError:
            continue
        out.append(name)
    return out


def fig1(lab: Lab, out: Path, loads: Sequence[int], seeds: Sequence[int], setting: str = "eagle") -> Section:
    fixed = fixed_policies(lab, setting)
    policies = [*fixed, "tabletune"]
    rows = shares(lab.grid(setting, policies, loads, seeds), fixed)
    files = [write_csv(out / "fig1.csv", rows),
             share_plot(out / "fig1.png", rows, policies, f"Fig 1: share of the best fixed k, {setting} (simulated)",
                        note=figure_note(lab, [setting]))]
    loss, at = worst_loss(rows, setting, "tabletune")
    below = [s.load for s in rows if s.policy == "tabletune" and s.mean < 0.97]
    md = (inputs_markdown(lab, [setting]) + "\n\n"
          f"Mean share of the best fixed k over {len(seeds)} seeds (min-max in brackets), in %.\n\n"
          + share_matrix_md(rows, policies, loads)
          + f"\n\nTuned table: worst loss {pct(loss)} (load {at}); loads below 97%: {below or 'none'}.")
    return Section("fig1", "Fig 1: fixed k vs the tuned table across loads", md, files,
                   {"tabletune_worst_loss": loss, "at_load": at})


def table1(lab: Lab, out: Path, loads: Sequence[int], seeds: Sequence[int],
           settings: Sequence[str] = TABLE1) -> Section:
    all_rows, body, summary = [], [], {}
    for setting in settings:
        fixed = fixed_policies(lab, setting)
        rows = shares(lab.grid(setting, [*fixed, "tabletune"], loads, seeds), fixed)
        all_rows += rows
        loss, at = worst_loss(rows, setting, "tabletune")
        single = min(fixed, key=lambda f: worst_loss(rows, setting, f)[0])
        single_loss, single_at = worst_loss(rows, setting, single)
        ok = all(s.mean >= 0.97 for s in rows if s.policy == "tabletune")
        summary[setting] = {"worst_loss": loss, "at_load": at, "ge_97_every_load": ok,
                            "best_single_fixed": single, "best_single_worst_loss": single_loss}
        body.append([setting, SETTINGS[setting].description, pct(loss), at, "yes" if ok else "no",
                     single, pct(single_loss), single_at])
    files = [write_csv(out / "table1.csv", all_rows)]
    files.append(share_plot(out / "table1.png", [_as(s, s.setting) for s in all_rows if s.policy == "tabletune"],
                            list(settings), "Table 1: tuned table / best fixed k per setting (simulated)",
                            note=figure_note(lab, settings)))
    n_ok = sum(v["ge_97_every_load"] for v in summary.values())
    md = (inputs_markdown(lab, settings) + "\n\n"
          + md_table(["setting", "inputs", "tuned table worst loss", "at load", ">=97% at every load",
                      "best single fixed k", "its worst loss", "at load"], body)
          + f"\n\nTuned table >= 97% of the best fixed k at every load in {n_ok} of {len(settings)} settings.")
    return Section("table1", "Table 1: worst loss against the best fixed k, per drafter", md, files, summary)


def _as(share, policy: str):
    from dataclasses import replace

    return replace(share, policy=policy)


def fig3(lab: Lab, out: Path, loads: Sequence[int], seeds: Sequence[int], settings: Sequence[str] = ("eagle",),
         per_request: bool = True) -> Section:
    extra = available_per_request() if per_request else []
    missing = [p for p in PER_REQUEST_POLICIES if p not in extra] if per_request else []
    policies = [*COMPARED, *extra]
    all_rows, body, versus, summary = [], [], [], {}
    for setting in settings:
        fixed = fixed_policies(lab, setting)
        points = lab.grid(setting, [*fixed, *policies], loads, seeds)
        rows = shares(points, fixed)
        all_rows += rows
        per_seed = seed_shares(points, fixed)
        for name in policies:
            loss, at = worst_loss(rows, setting, name)
            low, high = worst_loss_ci(per_seed, setting, name, loads, seeds)
            mean = sum(s.mean for s in rows if s.policy == name and s.setting == setting) / len(loads)
            summary[f"{setting}/{name}"] = {"worst_loss": loss, "at_load": at, "mean_share": mean,
                                            "worst_loss_ci": (low, high)}
            body.append([setting, name, pct(loss), f"{pct(low)} to {pct(high)}", at, pct(mean)])
        for rival in (r for r in RIVALS if r in policies and "tabletune" in policies):
            diff = summary[f"{setting}/tabletune"]["worst_loss"] - summary[f"{setting}/{rival}"]["worst_loss"]
            low, high = worst_loss_ci(per_seed, setting, "tabletune", loads, seeds, minus=rival)
            verdict = "lower" if high < 0 else "higher" if low > 0 else "not resolved"
            summary[f"{setting}/tabletune-{rival}"] = {"difference": diff, "ci": (low, high), "verdict": verdict}
            versus.append([setting, rival, f"{100 * diff:+.1f} pt", f"{100 * low:+.1f} to {100 * high:+.1f} pt",
                           verdict])
    files = [write_csv(out / "fig3.csv", all_rows)]
    first = [s for s in all_rows if s.setting == settings[0]]
    files.append(share_plot(out / "fig3.png", first, policies, f"Fig 3: draft-length policies, {settings[0]} (simulated)",
                            note=figure_note(lab, [settings[0]])))
    md = (inputs_markdown(lab, settings) + "\n\n"
          f"Every method chooses among the same lengths {lab.cost(SETTINGS[settings[0]]).ks}. "
          "Worst loss = max over loads of 1 - mean share of the best fixed k (each seed's best); 95% interval: "
          f"percentile bootstrap over the {len(seeds)} seeds (each seed one request sample, shared by every policy).\n\n"
          + md_table(["setting", "policy", "worst loss", "95% interval", "at load", "mean share"], body)
          + "\n\nThe tuned table's worst loss minus the rival's (negative: the table loses less), with the 95% "
          "interval of the paired seed bootstrap; \"not resolved\": the interval contains 0.\n\n"
          + md_table(["setting", "rival", "difference", "95% interval", "tuned table's worst loss is"], versus)
          + "\n\n" + share_matrix_md(first, policies, loads))
    if missing:
        md += f"\n\nNot run (module not available): {', '.join(missing)}."
    return Section("fig3", "Fig 3: TableTune vs TurboSpec-, Nightjar- and SGLang-style", md, files, summary)


def worst_loss_ci(per_seed: dict, setting: str, policy: str, loads: Sequence[int], seeds: Sequence[int],
                  minus: str | None = None) -> tuple[float, float]:
    """95% bootstrap interval of the policy's worst loss over loads (of its difference to ``minus``'s when given),
    resampling whole seeds so that every load and policy keeps its pairing."""
    import numpy as np

    def matrix(name: str) -> np.ndarray:  # [num_loads, num_seeds]
        return np.array([[per_seed[(setting, name, n)][s] for s in seeds] for n in loads])

    mine, other = matrix(policy), matrix(minus) if minus else None

    def stat(idx: np.ndarray) -> float:
        loss = 1.0 - mine[:, idx].mean(axis=1).min()
        return loss - (1.0 - other[:, idx].mean(axis=1).min()) if other is not None else loss

    return bootstrap_ci(stat, len(seeds))


def moe(lab: Lab, out: Path, loads: Sequence[int], seeds: Sequence[int], setting: str = "moe") -> Section:
    """The MoE target: vLLM's documented table against the tuned table (and the best fixed k)."""
    fixed = fixed_policies(lab, setting)
    policies = ["documented", "tabletune"]
    rows = shares(lab.grid(setting, [*fixed, *policies], loads, seeds), fixed)
    by = {(s.policy, s.load): s for s in rows}
    gains = [by[("tabletune", n)].throughput_tok_s / by[("documented", n)].throughput_tok_s - 1 for n in loads]
    summary = {name: {"worst_loss": worst_loss(rows, setting, name)[0]} for name in policies}
    summary["tuned_over_documented"] = {"mean": sum(gains) / len(gains), "max": max(gains), "min": min(gains)}
    files = [write_csv(out / "moe.csv", rows),
             share_plot(out / "moe.png", rows, [*fixed, *policies], f"MoE: documented vs tuned table, {setting} (simulated)",
                        note=figure_note(lab, [setting]))]
    body = [[name, pct(summary[name]["worst_loss"]), pct(sum(s.mean for s in rows if s.policy == name) / len(loads))]
            for name in policies]
    md = (inputs_markdown(lab, [setting]) + "\n\n"
          + md_table(["policy", "worst loss vs best fixed k", "mean share"], body)
          + f"\n\nTuned over documented: mean {pct(summary['tuned_over_documented']['mean'])}, max "
          f"{pct(max(gains))}, min {pct(min(gains))} over loads {list(loads)}.\n\n"
          + share_matrix_md(rows, policies, loads))
    return Section("moe", "MoE: vLLM's documented table against the tuned table", md, files, summary)
