"""Shared pytest configuration: says what the default run left out (pyproject.toml selects
``-m 'not slow'``), so that the deselected count is not a mystery; and makes every hypothesis test
draw the same examples on every run (the ``fixed`` profile: CI passes or fails on the code, never on
the draw). ``--hypothesis-profile=explore`` draws new ones each run (``--hypothesis-seed=N`` replays
one); pyproject.toml pins hypothesis, whose releases draw differently."""

from __future__ import annotations

from hypothesis import settings

DEFAULT_SELECTION = "not slow"
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("fixed")


def pytest_terminal_summary(terminalreporter, config) -> None:
    deselected = len(terminalreporter.stats.get("deselected", []))
    if deselected and config.getoption("markexpr") == DEFAULT_SELECTION and not config.getoption("keyword"):
        tests = "test" if deselected == 1 else "tests"
        terminalreporter.write_line(
            f"{deselected} slow {tests} deselected by default; "
            "`python3 -m pytest -m slow` runs them, `-m ''` runs everything"
        )
