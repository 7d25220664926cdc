"""Shared pytest configuration: says what the default run left out (pyproject.toml selects
``-m 'not slow'``), so that the deselected count is not a mystery."""

from __future__ import annotations

DEFAULT_SELECTION = "not slow"


def pytest_terminal_summary(terminalreporter, config) -> None:
    deselected = len(terminalreporter.stats.get("deselected", []))
    if deselected and config.getoption("markexpr") == DEFAULT_SELECTION and not config.getoption("keyword"):
        tests = "test" if deselected == 1 else "tests"
        terminalreporter.write_line(
            f"{deselected} slow {tests} deselected by default; "
            "`python3 -m pytest -m slow` runs them, `-m ''` runs everything"
        )
