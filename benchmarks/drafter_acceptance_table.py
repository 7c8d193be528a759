"""The held-out acceptance table of the trained EAGLE head from its committed profiles
(``profiles/acceptance/eagle_*.json``), as markdown: the table ``tabletune drafter eval`` prints
(``tabletune.drafter.evaluate``), with a_1 .. a_7.

    python benchmarks/drafter_acceptance_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tabletune.acceptance import AcceptanceProfile
from tabletune.drafter.evaluate import format_table, held_out_row
from tabletune.integrations.hf.measure import detail_path

ROOT = Path(__file__).resolve().parents[1] / "profiles" / "acceptance"


def main() -> None:
    rows = []
    for w in ("code", "chat"):
        for t in (0, 1):
            path = ROOT / f"eagle_{w}_T{t}.json"
            if path.exists():
                detail = json.loads(detail_path(path).read_text())
                rows.append(held_out_row(AcceptanceProfile.load(path).entries[0], w, t, detail["num_prompts"], k=4))
    print(format_table(rows, num_rates=7))


if __name__ == "__main__":
    main()
