"""The two error channels' first half: input and feasibility errors.

Every ``PlannerError`` carries the offending field, its value, the limit or the
allowed values, and a unit where one applies. The CLI prints ``str(err)`` as one
line and exits with ``err.exit_code`` (2 for bad input, 3 for infeasible jobs).
Programmer invariants use ``assert`` instead.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``), so that an
    error or a label stays one line and never drives the terminal."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def brief(value: Any, width: int = 60) -> str:
    """``repr(value)`` as an error line quotes it: control characters escaped, cut to ``width``
    characters (a 4,000-digit integer or a long list is not quoted whole)."""
    text = printable(repr(value))
    return text if len(text) <= width else text[: width - 3] + "..."


class PlannerError(Exception):
    """Base class for errors a user can fix by changing the input."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: Any = None,
        limit: Any = None,
        unit: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value
        self.limit = limit
        self.unit = unit

    def __str__(self) -> str:
        return printable(self.message)


class ConfigError(PlannerError):
    """Malformed or inconsistent input: a file, a name, a flag or a plan."""


class UnknownNameError(ConfigError):
    """A catalog name that does not exist; ``limit`` lists the valid names. The closest of them lead the
    line ("did you mean"; difflib's ratio, case and surrounding spaces ignored); ``files``: a path to a
    file is accepted in the name's place."""

    def __init__(self, kind: str, name: str, valid: list[str], files: bool = True) -> None:
        by_key = {v.lower(): v for v in valid}
        close = difflib.get_close_matches(name.strip().lower(), list(by_key), n=3, cutoff=0.6)
        shown = [repr(by_key[c]) for c in close]
        mean = f" (did you mean {' or '.join(shown)}?)" if close else ""
        files_too = " (or a path to a file)" if files else ""
        super().__init__(
            f"unknown {kind} '{name}'{mean}; valid {kind}s: {', '.join(valid)}{files_too}",
            field=kind,
            value=name,
            limit=valid,
        )


class InfeasibleError(PlannerError):
    """No plan fits in device memory; ``details`` holds the best candidate's breakdown."""

    exit_code = 3

    def __init__(self, message: str, *, details: dict | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.details = details or {}
