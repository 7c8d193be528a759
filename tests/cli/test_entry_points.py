"""Every subcommand is registered once, and every way of starting the CLI reaches it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tabletune.cli import COMMANDS, main

NAMES = ["acceptance", "control", "drafter", "experiment", "report", "show", "simulate", "status", "table", "tune"]
ROOT = Path(__file__).resolve().parents[2]


def test_every_subcommand_is_registered_once():
    assert sorted(main.commands) == NAMES
    assert sorted(c.name for c in COMMANDS) == NAMES


@pytest.mark.parametrize("module", ["tabletune", "tabletune.cli"])
def test_python_dash_m_runs_the_cli(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: tabletune [OPTIONS] COMMAND [ARGS]...")
    listed = [line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == NAMES


def test_console_script_points_at_the_group():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["tabletune"].partition(":")
    proc = subprocess.run([sys.executable, "-c", f"import {module} as m; m.{attr}(['tune', '--help'])"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--verbose" in proc.stdout and "--k-max" in proc.stdout
