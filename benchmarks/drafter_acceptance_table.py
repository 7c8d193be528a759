"""The held-out acceptance table of the trained EAGLE head (``profiles/acceptance/eagle_*.json``), as markdown.

E[accepted | k] = sum_{i <= k} prod_{j <= i} a_j drafted tokens accepted per step (no bonus token);
tokens per step = 1 + E[accepted | k].

    python benchmarks/drafter_acceptance_table.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "profiles" / "acceptance"


def expected_accepted(rates: list[float], k: int) -> float:
    total, run = 0.0, 1.0
    for a in rates[:k]:
        run *= a
        total += run
    return total


def main() -> None:
    print("| workload | T | prompts | drafts | a_1 | a_2 | a_3 | a_4 | a_5 | a_6 | a_7 | E[accepted], k=4 | "
          "tokens/step, k=4 |")
    print("|---|---|---:|---:|" + "---:|" * 9)
    for w in ("code", "chat"):
        for t in (0, 1):
            path = ROOT / f"eagle_{w}_T{t}.json"
            if not path.exists():
                continue
            e = json.loads(path.read_text())["entries"][0]
            detail = json.loads(path.with_name(path.name.replace(".json", ".detail.json")).read_text())
            rates = [r if r is not None else math.nan for r in e["rates"]]
            acc4 = expected_accepted(rates, 4)
            print(f"| {w} | {t} | {detail['num_prompts']} | {e['num_drafts']} | "
                  + " | ".join(f"{r:.3f}" for r in rates[:7]) + f" | {acc4:.2f} | {1 + acc4:.2f} |")


if __name__ == "__main__":
    main()
