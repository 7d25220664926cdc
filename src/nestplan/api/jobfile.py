"""The job file (``plan --job job.toml``, ``evaluate --job job.toml``): what is trained, on what, by which
framework, and the search's limits, in one TOML or JSON file read by ``nestplan.inputs`` (unknown keys
refused by name). docs/formats.md describes it; every field stands for the option of the same name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nestplan.api.planning import MAX_TOP
from nestplan.catalog import is_file
from nestplan.errors import printable
from nestplan.inputs import Fields, load_object
from nestplan.job import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LEN, Optimizer
from nestplan.network.topology import MAX_DEVICES
from nestplan.search.space import MAX_MEMORY_MARGIN
from nestplan.settings import SETTING_NAMES, setting_table
from nestplan.strategy.enums import Schedule

TOP_KEYS = ("model", "cluster", "devices", "global_batch_size", "seq_len", "dtype", "optimizer", "settings", "search")
SEARCH_KEYS = ("schedules", "memory_margin", "top")


@dataclass(frozen=True)
class JobFile:
    """A job file as read: each field None where the file leaves it to the options or their defaults.
    ``settings``: run settings by name (``framework`` among them), each checked by the field table;
    ``model`` and ``cluster``: a catalog name, or a file's path relative to the job file's folder."""

    path: Path
    contents: dict[str, Any]
    model: str | None = None
    cluster: str | None = None
    devices: int | None = None
    global_batch_size: int | None = None
    seq_len: int | None = None
    dtype: str | None = None
    optimizer: Optimizer | None = None
    settings: dict[str, Any] | None = None
    schedules: tuple[Schedule, ...] | None = None
    memory_margin: float | None = None
    top: int | None = None

    def named(self) -> dict[str, Any]:
        """The job this answers, as ``--json`` output names it: the file's path and its contents."""
        return {"path": str(self.path), "contents": self.contents}


def read_job(path: str | Path) -> JobFile:
    """The job file at ``path`` (TOML by its suffix, else JSON), every field checked."""
    p = Path(path)
    data = load_object(p, "job file")
    fields = Fields(data, f"job file '{printable(str(p))}'")
    fields.refuse_unknown(TOP_KEYS)
    search = fields.table("search", {})
    search.refuse_unknown(SEARCH_KEYS)
    return JobFile(
        path=p,
        contents=data,
        model=_entry(fields, "model", p.parent),
        cluster=_entry(fields, "cluster", p.parent),
        devices=_given(fields, "devices", lambda key: fields.integer(key, MAX_DEVICES)),
        global_batch_size=_given(fields, "global_batch_size", lambda key: fields.integer(key, MAX_GLOBAL_BATCH_SIZE)),
        seq_len=_given(fields, "seq_len", lambda key: fields.integer(key, MAX_SEQ_LEN)),
        dtype=_given(fields, "dtype", fields.string),
        optimizer=_optimizer(fields),
        settings=_settings(fields.table("settings", {})),
        schedules=_schedules(search),
        memory_margin=_given(search, "memory_margin", lambda key: search.number(key, 0.0, MAX_MEMORY_MARGIN)),
        top=_given(search, "top", lambda key: search.integer(key, MAX_TOP, minimum=0)),
    )


def _given(fields: Fields, key: str, read: Callable[[str], Any]) -> Any:
    """The field ``key`` as ``read`` checks it, None where the file leaves it out."""
    return read(key) if fields.has(key) else None


def _optimizer(fields: Fields) -> Optimizer | None:
    return _given(fields, "optimizer", lambda key: Optimizer(fields.choice(key, [o.value for o in Optimizer])))


def _entry(fields: Fields, key: str, folder: Path) -> str | None:
    """A model's or a cluster's name as given, or the path of a file it names relative to the job file."""
    name = _given(fields, key, fields.string)
    if name is None:
        return None
    relative = folder / name
    return str(relative) if is_file(relative) else name


def _settings(table: Fields) -> dict[str, Any] | None:
    """The run settings by name, each as the field table checks it (an unknown name refused by name)."""
    table.refuse_unknown(SETTING_NAMES)
    checked = {entry.name: entry.check(table.raw(entry.name)) for entry in setting_table() if table.has(entry.name)}
    return checked or None


def _schedules(search: Fields) -> tuple[Schedule, ...] | None:
    if not search.has("schedules"):
        return None
    listed = search.listed("schedules", len(Schedule), minimum=1)
    allowed = [s.value for s in Schedule]
    return tuple(Schedule(listed.choice(index, allowed)) for index in listed.data)
