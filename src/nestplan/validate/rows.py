"""The runs file's reader: its rows, each checked column by column into a Run (docs/formats.md, "Runs file").

Every key is known or refused by name: the file's top-level keys, a row's columns and its ``published``
object's keys. A row names its model inline (``model_config``), by catalog name or by file (``model``),
and its cluster by catalog name or by file; files are relative to the runs file's folder, so a runs file
gives the same results from wherever it is run. Each file is read once per runs file. The work is
bounded before any row is evaluated: at most MAX_RUNS rows and MAX_CHUNKS pipeline chunks in all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nestplan.catalog import entry_path, is_dir, is_file, user_path
from nestplan.cluster import Cluster, load_cluster
from nestplan.cost.schedules import named as named_schedule
from nestplan.errors import ConfigError, printable
from nestplan.inputs import Fields, load_object
from nestplan.job import Job, make_job
from nestplan.model.config import parse_config
from nestplan.model.spec import ModelSpec
from nestplan.settings import Fp8Recipe, RunSettings, Setting, plain_value, setting_table
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.validate.published import Measured, read_published

# the work one call evaluates, refused up front beyond these (measured on one core: a row evaluates in 15-20 ms
# plus about 0.45 ms per pipeline chunk it simulates, pp x vp, at 1,024 layers, 16,384 GPUs and 2^20 sequences
# per step; a row's model, read from its own config, holds up to ~140 kB): a file at both bounds, 4,096 rows of
# 32 chunks with a distinct 1,024-layer model each, evaluated in 2 min 11 s and 0.72 GB, never hours
MAX_RUNS = 4096  # rows of one runs file (the published files have 22-88)
MAX_CHUNKS = 2**17  # pipeline chunks (pp x vp) summed over the rows
MAX_DEGREE = 2**20  # any parallel degree, GPU count or batch (the cluster bound)
DEFAULT_FP8_RECIPE = Fp8Recipe.DELAYED  # Transformer Engine's recipe when none is given (DelayedScaling)
_DEGREES = ("gpus", "tp", "pp", "vp", "cp", "ep", "dp", "mbs", "global_batch", "seq_len")
_PRECISIONS = ("bf16", "fp16", "fp8")
_FILE_KEYS = ("rows", "source", "held_out", "notes")
_MODEL_SUFFIX = ".json"
_CLUSTER_SUFFIXES = (".toml", ".json")
# the legacy column names of the published runs files (../shared/reference/measured), stated once: a row
# gives a run setting under its own name (the field table's) or under its alias
SETTING_ALIASES = {"grad_dtype": "grad_reduce_dtype", "flash_attention": "flash"}
SETTING_COLUMNS = (*(entry.name for entry in setting_table()), *SETTING_ALIASES.values())
_RUN_COLUMNS = ("id", "model_name", "model", "model_config", "cluster", *_DEGREES, "sp", "recompute", "zero")
_PLAN_COLUMNS = ("precision", "layers_per_stage", "axis_order", "published")
_NOTE_COLUMNS = ("notes", "mapping", "model_as_run", "derated_hardware")  # documentation, not read
ROW_COLUMNS = (*_RUN_COLUMNS, *_PLAN_COLUMNS, *SETTING_COLUMNS, *_NOTE_COLUMNS)


@dataclass(frozen=True)
class Run:
    """One measured run, read and checked."""

    id: str
    model: ModelSpec
    cluster: Cluster
    dims: ParallelDims
    axis_order: tuple[str, ...]
    job: Job
    precision: str
    measured: Measured

    @property
    def measured_step_s(self) -> float:
        return self.measured.step_s


def _looks_like_path(text: str, suffixes: tuple[str, ...]) -> bool:
    return text.lower().endswith(suffixes) or "/" in text or "\\" in text


@dataclass(frozen=True)
class Sources:
    """Where a runs file's rows find their model and cluster files: relative to ``folder`` (the runs
    file's); each file is read once and its model or cluster shared by the rows that name it."""

    folder: Path
    _models: dict[tuple[Path, str], ModelSpec] = field(default_factory=dict)
    _clusters: dict[tuple[Path, int], Cluster] = field(default_factory=dict)

    def path(self, text: str, what: str) -> Path:
        """``text`` (a row's path) relative to the folder, refused in one line when no file is there."""
        path = self.folder / user_path(text)
        if not is_file(path):
            raise ConfigError(
                f"{what} '{printable(text)}' not found (read relative to the runs file: '{printable(str(path))}')",
                field=what.split()[0],
                value=printable(text),
                limit="an existing file",
            )
        return path

    def model_file(self, text: str) -> Path:
        """The config.json ``model`` names: a catalog entry, or a file or a folder holding config.json."""
        if not _looks_like_path(text, (_MODEL_SUFFIX,)):
            return entry_path("model", text)
        folder = self.folder / user_path(text)
        return self.path(str(Path(text) / "config.json") if is_dir(folder) else text, "model file")

    def model(self, text: str, name: str) -> ModelSpec:
        """The model ``model`` names, called ``name``."""
        path = self.model_file(text)
        if (path, name) not in self._models:
            self._models[path, name] = parse_config(load_object(path, "model config file", "json"), name)
        return self._models[path, name]

    def cluster(self, text: str, gpus: int) -> Cluster:
        """The first ``gpus`` devices of the catalog cluster or cluster file ``text``."""
        path = self.path(text, "cluster file") if _looks_like_path(text, _CLUSTER_SUFFIXES) else None
        path = path or entry_path("cluster", text)
        if (path, gpus) not in self._clusters:
            self._clusters[path, gpus] = load_cluster(str(path), gpus)
        return self._clusters[path, gpus]


def read_runs(path: str | Path) -> list[tuple[str, Mapping[str, Any] | ConfigError]]:
    """(row id, row object) per row of a runs file; a row that is not an object, or whose id repeats an
    earlier row's, is its error. The file's keys and the work it asks for (MAX_RUNS, MAX_CHUNKS) are
    checked first."""
    data = load_object(path, "runs file", "json")
    origin = f"runs file '{printable(str(path))}'"
    f = Fields(data, origin)
    f.refuse_unknown(_FILE_KEYS)
    rows = f.items("rows", MAX_RUNS, minimum=1)
    _check_work(rows, origin)
    out: list[tuple[str, Mapping[str, Any] | ConfigError]] = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        name = row.get("id") if isinstance(row, Mapping) else None
        label = printable(name) if isinstance(name, str) and name else f"row {i + 1}"
        problem = None
        if not isinstance(row, Mapping):
            problem = ConfigError(f"{label}: a run must be an object, got {type(row).__name__}", field="rows")
        elif label in seen:
            problem = ConfigError(f"{label}: id repeats row {seen[label]}'s", field="id", value=label)
        seen.setdefault(label, i + 1)
        out.append((label, problem or row))
    return out


def _chunks(row: Any) -> int:
    """The pipeline chunks (pp x vp) ``row`` asks to simulate; 1 where it gives no valid degrees (it is
    refused when evaluated)."""
    degrees = [row.get(key) if isinstance(row, Mapping) else None for key in ("pp", "vp")]
    valid = all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_DEGREE for d in degrees)
    return degrees[0] * degrees[1] if valid else 1


def _check_work(rows: list[Any], origin: str) -> None:
    chunks = sum(_chunks(row) for row in rows)
    if chunks > MAX_CHUNKS:
        raise ConfigError(
            f"{origin}: its rows simulate {chunks:,} pipeline chunks (pp x vp summed over the rows); at most "
            f"{MAX_CHUNKS:,} in one runs file: split it",
            field="rows",
            value=chunks,
            limit=MAX_CHUNKS,
            unit="pipeline chunks",
        )


def _dims(f: Fields, n: Mapping[str, int]) -> ParallelDims:
    layers = f.listed("layers_per_stage", MAX_DEGREE, None) if f.has("layers_per_stage") else None
    return ParallelDims(
        tp=n["tp"],
        pp=n["pp"],
        dp=n["dp"],
        cp=n["cp"],
        ep=n["ep"],
        sp=f.flag("sp"),
        zero=f.integer("zero", 3, 0, minimum=0),
        recompute=Recompute(f.choice("recompute", [r.value for r in Recompute])),
        micro_batch_size=n["mbs"],
        virtual_stages=n["vp"],
        schedule=named_schedule(Schedule.ONE_F_ONE_B, n["vp"]),  # Megatron-LM runs interleaved 1F1B with vp > 1
        layers_per_stage=None if layers is None else tuple(layers.integer(k, MAX_DEGREE, 0) for k in layers.data),
    )


def _setting(f: Fields, entry: Setting, column: str) -> Any:
    """The run setting ``entry`` from the column ``column``, read by its kind; its default when absent."""
    if entry.optional and not f.has(column):
        return None
    if entry.kind is bool:
        return f.flag(column, entry.default)
    if entry.kind is int or entry.kind is float:
        low, high = entry.bounds or (1, MAX_DEGREE)
        if entry.kind is int:
            return f.integer(column, int(high), entry.default, minimum=int(low))
        return f.number(column, low, high, entry.default)
    return f.choice(column, entry.choices, plain_value(entry.default))


def _column(f: Fields, name: str) -> str:
    """The column that gives the run setting ``name``: its alias where the row uses it, else its name."""
    alias = SETTING_ALIASES.get(name)
    if alias is None or not f.has(alias):
        return name
    if f.has(name):
        raise f.error(f"give '{name}' or its alias '{alias}', not both", name, limit=[name, alias])
    return alias


def _settings(f: Fields, precision: str) -> RunSettings:
    """The run settings of the row: every setting of the field table it gives under its name or its alias, the
    others at its framework's presets (``RunSettings.from_mapping``); the FP8 recipe only for an fp8 run
    (delayed when none is given)."""
    columns = {entry.name: (entry, _column(f, entry.name)) for entry in setting_table()}
    values = {name: _setting(f, entry, column) for name, (entry, column) in columns.items() if f.has(column)}
    recipe = values.get("fp8_recipe") or DEFAULT_FP8_RECIPE.value
    return RunSettings.from_mapping(values | {"fp8_recipe": recipe if precision == "fp8" else None})


def _model(f: Fields, label: str, sources: Sources) -> ModelSpec:
    """The row's model: ``model_config`` inline, or the catalog name or file ``model``; named ``model_name``
    where given, else the ``model`` column as written (inline: the row's id)."""
    given = [key for key in ("model", "model_config") if f.has(key)]
    if len(given) != 1:
        found = " and ".join(given) or "neither"
        raise f.error(f"give one of 'model' (catalog name or path) or 'model_config'; found {found}", "model")
    name = f.string("model_name") if f.has("model_name") else None
    if given == ["model"]:
        text = f.string("model")
        return sources.model(text, name or text)
    config = f.raw("model_config")
    if not isinstance(config, Mapping):
        raise f.error("'model_config' must be a config.json object", "model_config")
    return parse_config(dict(config), name or label)


def run_from_row(row: Mapping[str, Any], label: str, sources: Sources | None = None) -> Run:
    """One row as a Run, its files found through ``sources`` (default: relative to the current folder); a
    ConfigError naming the row and the field otherwise (an unknown column by name)."""
    sources = sources or Sources(Path("."))
    f = Fields(row, label)
    f.refuse_unknown(ROW_COLUMNS)
    model = _model(f, label, sources)
    n = {key: f.integer(key, MAX_DEGREE) for key in _DEGREES}
    dims = _dims(f, n)
    if dims.devices != n["gpus"]:
        raise f.error(
            f"tp x cp x ep x pp x dp = {dims.devices} but 'gpus' is {n['gpus']}", "gpus", n["gpus"], dims.devices
        )
    cluster = sources.cluster(f.string("cluster"), n["gpus"])
    order = tuple(part.strip() for part in f.string("axis_order", "tp,cp,ep,pp,dp").split(","))
    precision = f.choice("precision", _PRECISIONS)
    dtype = "fp16" if precision == "fp16" else "bf16"
    job = make_job(model, n["global_batch"], n["seq_len"], dtype=dtype, settings=_settings(f, precision))
    measured = read_published(f, job.tokens_per_step, n["gpus"])
    return Run(label, model, cluster, dims, order, job, precision, measured)
