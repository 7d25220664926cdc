"""The ``nestplan`` command line: a thin typer shell over :mod:`nestplan.api`.

Exit codes: 0 done; 1 a check failed (`validate --tolerance`: a run missed it); 2 bad input, one
line on stderr naming the option or field, the value and what is allowed; 3 the job fits nowhere,
one line. Integer options take plain decimal digits
within the bounds of cli/parse.py. Output paths are checked before any work, and a file nestplan
writes itself appears whole or not at all. Text from the input is printed with its control
characters escaped, and on a pipe rich output never wraps.
"""

from __future__ import annotations

import importlib
import sys

import typer

from nestplan import __version__
from nestplan.cli import calibrate, plan_commands, tools  # noqa: F401  (the commands register with the app)
from nestplan.cli.app import app
from nestplan.cli.output import os_reason, say
from nestplan.errors import PlannerError


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"nestplan {__version__}\n")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="print nestplan's version and exit"
    ),
) -> None:
    """Network- and memory-aware planner for distributed LLM training."""


# -- entry point ----------------------------------------------------------------------------------
def _click_exceptions() -> list:
    """The click exception modules in use: typer >= 0.20 vendors click as ``typer._click``."""
    modules = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    assert modules, "typer needs click, vendored or installed"
    return modules


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning every user error into one line on stderr."""
    command = typer.main.get_command(app)
    mods = _click_exceptions()
    usage_errors = tuple(m.ClickException for m in mods)
    help_requests = tuple(m.NoArgsIsHelpError for m in mods if hasattr(m, "NoArgsIsHelpError"))
    exits = tuple({m.Exit for m in mods if hasattr(m, "Exit")} | {typer.Exit})
    aborts = tuple({m.Abort for m in mods if hasattr(m, "Abort")} | {typer.Abort})
    try:
        command.main(args=argv, prog_name="nestplan", standalone_mode=False)
    except PlannerError as exc:
        say(f"nestplan: error: {exc}")
        sys.exit(exc.exit_code)
    except help_requests as exc:  # no command: the help on stdout, the error on stderr
        sys.stdout.write(exc.format_message().rstrip("\n") + "\n")
        say("nestplan: error: no command given; choose one of the commands listed above")
        sys.exit(2)
    except usage_errors as exc:
        say(f"nestplan: error: {exc.format_message().strip()}")
        sys.exit(2)
    except exits as exc:
        sys.exit(exc.exit_code)
    except aborts:
        sys.exit(130)
    except OSError as exc:  # a file the commands did not foresee failing (their outputs are checked)
        say(f"nestplan: error: {os_reason(exc)}")
        sys.exit(2)
