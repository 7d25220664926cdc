"""The typer application the commands register with."""

from __future__ import annotations

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "[trace]" is an extra's name, not markup
    help="Network- and memory-aware planner for distributed LLM training.",
)
