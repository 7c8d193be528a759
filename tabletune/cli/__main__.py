"""``python -m tabletune.cli`` runs the CLI."""

from tabletune.cli import main

if __name__ == "__main__":
    main(prog_name="tabletune")
