"""``--job job.toml`` on plan and evaluate: the job file's fields (api.jobfile) where the options were not
given on the command line; an option given as well overrides the file, and a note on stderr says so."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from nestplan.api.jobfile import JobFile, read_job
from nestplan.cli.output import say
from nestplan.errors import ConfigError


JOB = typer.Option(
    None, "--job", help="a job file (TOML or JSON, docs/formats.md): the job's options; options given override it"
)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option of parameter ``name`` was given on the command line (typer's click or click's own enum)."""
    return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"


def _flag(ctx: typer.Context, name: str) -> str:
    return next(p.opts[0] for p in ctx.command.params if p.name == name)


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(getattr(v, "value", v)) for v in value)
    return str(getattr(value, "value", value))


def with_job(
    ctx: typer.Context, path: Path | None, options: dict[str, Any], settings: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], JobFile | None]:
    """``options`` (by parameter name) and ``settings`` (run settings given, by name) with the job file's
    fields filled in where the command line gave none; the job file read (None without --job)."""
    if path is None:
        return options, dict(settings), None
    job = read_job(path)
    merged = dict(options)
    for name in options:
        held = getattr(job, name, None)
        if held is None:
            continue
        if _given(ctx, name):
            given = f"{_flag(ctx, name)} {_shown(options[name])}"
            say(f"nestplan: note: {given} overrides the job file's {name} {_shown(held)}")
        else:
            merged[name] = held
    chosen = dict(job.settings or {})
    for name, value in settings.items():
        if name in chosen and chosen[name] != value:
            flag = name.replace("_", "-")
            given = (
                (f"--{flag}" if value else f"--no-{flag}") if isinstance(value, bool) else f"--{flag} {_shown(value)}"
            )
            say(f"nestplan: note: {given} overrides the job file's {name} {_shown(chosen[name])}")
        chosen[name] = value
    return merged, chosen, job


def require(values: Mapping[str, Any], ctx: typer.Context, instead: str) -> None:
    """Refuse, naming them, the options (by parameter name) neither the command line nor the job file gave."""
    missing = [_flag(ctx, name) for name, value in values.items() if value is None]
    if missing:
        raise ConfigError(f"{ctx.command.name} needs {', '.join(missing)} (or {instead})", field=missing[0].lstrip("-"))
