"""The two error channels' first half: input and feasibility errors.

Every ``PlannerError`` carries the offending field, its value, the limit or the
allowed values, and a unit where one applies. The CLI prints ``str(err)`` as one
line and exits with ``err.exit_code`` (2 for bad input, 3 for infeasible jobs).
Programmer invariants use ``assert`` instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any


def printable(text: str) -> str:
    """``text`` with every character Python does not print as itself (``str.isprintable``: control characters,
    line separators, the invisible format characters a name can hide behind: bidirectional overrides and
    isolates, the "Trojan Source" characters of CVE-2021-42574, zero-width spaces and joiners, the byte-order
    mark; spaces other than the plain one; unassigned code points) written as its escape (``\\n``, ``\\x1b``,
    ``\\u202e``, ``\\u200b``), so that an error, a comment or a label stays one line, never drives the terminal and
    shows every character it holds. Every channel that shows input as text goes through it: error lines,
    tables, generated files' comments, the HTML report, plot titles."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def brief(value: Any, width: int = 60) -> str:
    """``repr(value)`` as an error line quotes it: control characters escaped, cut to ``width``
    characters (a 4,000-digit integer or a long list is not quoted whole)."""
    text = printable(repr(value))
    return text if len(text) <= width else text[: width - 3] + "..."


def did_you_mean(name: str, valid: Sequence[str]) -> str:
    """`` (did you mean 'x' or 'y'?)``: the valid names closest to ``name`` (at most three; difflib's ratio at
    least 0.6, case and surrounding spaces ignored), or ``""`` where none is close."""
    by_key = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(name.strip().lower(), list(by_key), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(by_key[c]) for c in close)}?)" if close else ""


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
    line (:func:`did_you_mean`); ``files``: a path to a
    file is accepted in the name's place."""

    def __init__(self, kind: str, name: str, valid: list[str], files: bool = True) -> None:
        mean = did_you_mean(name, valid)
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
