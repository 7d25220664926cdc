"""``evaluate --plan PLAN.json --set KEY=VALUE,...``: the changes to a saved plan, each read by the
parser of the option it stands for (a degree as --tp reads it, a run setting as its field table checks it),
a key that names nothing refused by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import typer

from nestplan import api
from nestplan.cli.parse import MAX_MICRO_BATCH, MAX_VIRTUAL_STAGES, integer, parse_layers
from nestplan.errors import ConfigError, brief
from nestplan.network.topology import MAX_DEVICES
from nestplan.plan import Plan
from nestplan.settings import setting_table
from nestplan.strategy.enums import Recompute, Schedule

MAX_SET_TEXT = 4096  # characters of one --set
BOOLEANS = {"true": True, "false": False}


def _choice(key: str, kind: type) -> Callable[[str], object]:
    def parse(text: str) -> object:
        allowed = [member.value for member in kind]
        if text not in allowed:
            raise ConfigError(
                f"--set {key}={brief(text)}: not one of {', '.join(allowed)}", field=key, value=text, limit=allowed
            )
        return kind(text)

    return parse


def _boolean(key: str) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        if text.lower() not in BOOLEANS:
            raise ConfigError(
                f"--set {key}={brief(text)}: not true or false", field=key, value=text, limit=["true", "false"]
            )
        return BOOLEANS[text.lower()]

    return parse


# the plan's own fields, each with the parser of the evaluate option it stands for (cli/options.py)
PLAN_KEYS: dict[str, Callable[[str], object]] = {
    **{axis: integer(f"--{axis}", 1, MAX_DEVICES) for axis in ("tp", "pp", "dp", "cp", "ep", "etp")},
    "sp": _boolean("sp"),
    "zero": integer("--zero", 0, 3),
    "recompute": _choice("recompute", Recompute),
    "mbs": integer("--mbs", 1, MAX_MICRO_BATCH),
    "schedule": _choice("schedule", Schedule),
    "virtual_stages": integer("--virtual-stages", 1, MAX_VIRTUAL_STAGES),
    "layers_per_stage": parse_layers,
}


def _setting_value(key: str, text: str) -> object:
    """A run setting's text as its field holds it: a boolean, a number, a choice, or 'none' where None is a value."""
    entry = next(e for e in setting_table() if e.name == key)
    if entry.optional and text.lower() == "none":
        return None
    if entry.kind is bool:
        return _boolean(key)(text)
    if entry.kind is int or entry.kind is float:
        try:
            return entry.kind(text)
        except ValueError:
            return entry.check(text)  # the field's own error, naming what is allowed
    return text


def parse_changes(text: str) -> dict[str, object]:
    """``KEY=VALUE,...`` as {key: typed value}. A comma not followed by a key continues the value before
    it (``layers_per_stage=10,11,11,10``). The plan's fields (``PLAN_KEYS``) and every run setting by name."""
    if len(text) > MAX_SET_TEXT:
        raise ConfigError(f"--set is longer than {MAX_SET_TEXT} characters", field="set", limit=MAX_SET_TEXT)
    settings = {entry.name for entry in setting_table()}
    pairs: list[list[str]] = []
    for item in text.split(","):
        key, equals, value = item.partition("=")
        if equals:
            pairs.append([key.strip(), value.strip()])
        elif pairs and pairs[-1][0] == "layers_per_stage":
            pairs[-1][1] += "," + item.strip()
        else:
            raise ConfigError(f"--set takes KEY=VALUE pairs, got {brief(item)}", field="set", value=item)
    changes: dict[str, object] = {}
    for key, value in pairs:
        if key in changes:
            raise ConfigError(f"--set gives {brief(key)} twice", field=key, value=value)
        if key in PLAN_KEYS:
            changes[key] = PLAN_KEYS[key](value)
        elif key in settings:
            changes[key] = next(e for e in setting_table() if e.name == key).check(_setting_value(key, value))
        else:
            known = [*PLAN_KEYS, *sorted(settings)]
            raise ConfigError(
                f"--set: unknown key {brief(key)}; the keys are {', '.join(known)}", field="set", value=key, limit=known
            )
    return changes


# evaluate's options that describe the plan: with --plan the file does, and --set changes it
EVALUATE_PLAN_OPTIONS = (
    "model",
    "cluster",
    "devices",
    "gpus_per_domain",
    *PLAN_KEYS,
    "global_batch_size",
    "seq_len",
    "dtype",
    "optimizer",
    "fp8",
    "axis_order",
)


def flags_given(ctx: typer.Context, names: Sequence[str]) -> list[str]:
    """The options among ``names`` (parameter names) given on the command line, as flags."""
    options = {p.name: p.opts[0] for p in ctx.command.params if p.name in names}
    sources = {name: ctx.get_parameter_source(name) for name in options}  # typer's click or click's own enum
    return [flag for name, flag in options.items() if getattr(sources[name], "name", None) == "COMMANDLINE"]


def saved_plan(plan_file: Path | None, changes: str | None, given: Sequence[str]) -> tuple[Plan, dict[str, object]]:
    """The saved plan ``--plan`` names and the changes ``--set`` gives; refused: --set without --plan, and
    beside --plan an option that describes the plan (``given``), which --set changes instead."""
    if plan_file is None:
        raise ConfigError("--set changes a saved plan: give it with --plan PLAN.json", field="set", value=changes)
    if given:
        raise ConfigError(
            f"with --plan, the plan file describes the plan: change it with --set (e.g. tp=4,pp=8), not {given[0]}",
            field=given[0].lstrip("-"),
            value=given[0],
        )
    wanted = parse_changes(changes) if changes else {}
    return api.load_plan(plan_file), wanted
