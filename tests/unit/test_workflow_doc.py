"""docs/workflow.md matches the command line as it is: every ``nestplan`` command its bash blocks show names a
command that exists and only options that command takes (what each does was run by hand: issue 27, item 6)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from nestplan.cli import app

WORKFLOW = Path(__file__).resolve().parents[2] / "docs" / "workflow.md"


def _examples() -> list[str]:
    """Every ``nestplan ...`` command of the page's bash blocks: continuation lines joined, comments and what
    follows a pipe, a redirection or ``&&`` dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", WORKFLOW.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|", line.split(" #")[0]):
                part = part.split(">")[0].strip()
                if part.startswith("nestplan "):
                    commands.append(part)
    return commands


EXAMPLES = _examples()


def _command(words: list[str]):
    """The click command the words name (``sweep report`` included) and the words after its name."""
    command = typer.main.get_command(app)
    while hasattr(command, "commands") and words and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


def test_the_page_shows_the_commands() -> None:
    assert len(EXAMPLES) >= 40
    shown = {shlex.split(e)[1] for e in EXAMPLES}
    assert shown >= {"plan", "evaluate", "export", "validate", "calibrate", "compare", "sweep", "trace", "list"}


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_option_shown_exists(example: str) -> None:
    command, words = _command(shlex.split(example)[1:])
    assert not hasattr(command, "commands"), f"{example}: no such command"
    options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    shown = {word.split("=")[0] for word in words if word.startswith("--")}
    assert shown <= options, f"{example}: {sorted(shown - options)} not options of {command.name}"
