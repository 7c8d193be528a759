"""Provenance: every digest the report prints is the input file's SHA-256, recomputed here with hashlib."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tabletune.experiments import provenance
from tabletune.experiments.runner import Lab
from tabletune.experiments.settings import SETTINGS

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:10]


def test_file_digest_is_the_files_sha256(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(b'{"k": 1}\n')
    b.write_bytes(b'{"k": 2}\n')
    assert provenance.file_digest(a) == hashlib.sha256(b'{"k": 1}\n').hexdigest()[:10] == sha(a)
    assert provenance.file_digest(a) != provenance.file_digest(b)


def test_fingerprints_and_footnotes_cite_the_inputs_digests():
    lab = Lab(PROFILES, duration_s=1.0, jobs=1)
    setting = SETTINGS["eagle"]
    steps, acceptance = PROFILES / setting.profile, PROFILES / setting.acceptance
    assert f"sha256 {sha(steps)}" in provenance.step_fingerprint(lab, "eagle")
    assert f"sha256 {sha(acceptance)}" in provenance.acceptance_fingerprint(lab, "eagle")
    note = provenance.figure_note(lab, ["eagle"])
    assert note.startswith(provenance.SIMULATED) and f"[{sha(steps)}]" in note and f"[{sha(acceptance)}]" in note
