"""The ``tabletune`` command line: one module per subcommand, every one registered here.

Each subcommand is a thin function: it turns flags into a config and calls the library.

Exit codes:

* 0: done;
* 2: bad input, an ``InputError`` (a file, a field and its value) or a bad flag:
  one line on stderr, no traceback, and no output file (outputs are written
  to a temporary file and renamed, ``tabletune.fileio``);
* 1: anything else. That is a bug, and Python prints its traceback.
"""

from __future__ import annotations

import click

from tabletune.cli.acceptance import acceptance_cmd
from tabletune.cli.control import control_cmd
from tabletune.cli.drafter import drafter_cmd
from tabletune.cli.experiment import experiment_cmd
from tabletune.cli.report import report_cmd
from tabletune.cli.show import show_cmd
from tabletune.cli.simulate import simulate_cmd
from tabletune.cli.status import status_cmd
from tabletune.cli.table import table_cmd
from tabletune.cli.tune import tune_cmd
from tabletune.errors import InputError

COMMANDS = (table_cmd, show_cmd, tune_cmd, acceptance_cmd, control_cmd, simulate_cmd, experiment_cmd,
            drafter_cmd, report_cmd, status_cmd)


def error_line(exc: InputError | click.UsageError) -> str:
    """The one stderr line for bad input."""
    if isinstance(exc, click.UsageError):
        where = exc.ctx.command_path if exc.ctx else "tabletune"
        text = f"{exc.format_message()} (see '{where} --help')"
    else:
        text = str(exc)
    return "tabletune: error: " + " ".join(text.split())


class TabletuneGroup(click.Group):
    """Bad input exits 2 with one line; every other exception propagates (traceback, exit 1)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (InputError, click.UsageError) as exc:
            click.echo(error_line(exc), err=True)
            ctx.exit(2)


@click.group(cls=TabletuneGroup, commands=COMMANDS)
@click.version_option(package_name="tabletune")
def main() -> None:
    """TableTune: measured draft-length tables for speculative decoding."""
