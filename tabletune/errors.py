"""The one error type for bad user input.

Every message names the file, the field and the offending value, so the CLI can
print it on one line and exit 2 with no traceback. Raise it where user input is
parsed or loaded (a flag, a file, a JSON field). Any other exception, a plain
ValueError or KeyError included, is a bug: the CLI lets it show its traceback
and exits 1 (``tabletune.cli``).
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: a file, a field inside it, and the value that is wrong."""

    def __init__(self, source: str, field: str, value: object, problem: str) -> None:
        self.source = source
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{source}: field '{field}' = {value!r}: {problem}")
