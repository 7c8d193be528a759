"""``python -m tabletune`` runs the CLI."""

from tabletune.cli import main

main()
