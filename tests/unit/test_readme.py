"""The README starts with the two commands, and .ci/run runs exactly those."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip() and not line.startswith("#")]


def test_readme_opens_with_two_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert "nestplan " in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_commands() -> None:
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in _readme_commands():
        assert command in ci, command
