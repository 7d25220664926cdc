"""Measured runs against nestplan's predictions (`nestplan validate RUNS.json`).

A runs file (docs/formats.md, "Runs file") lists training runs as they ran: the model as a
Hugging Face config.json, the catalog cluster, the parallel configuration, the framework
settings and the measured step time. Each row is evaluated as it ran and compared with its
measurement; a row that cannot be read or evaluated is reported in one line and the others
still are. This is how a user learns how far to trust nestplan on their own cluster.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nestplan.cluster import Cluster, load_cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import named as named_schedule
from nestplan.errors import ConfigError, PlannerError, brief, printable
from nestplan.inputs import Fields, load_object
from nestplan.job import Job, make_job
from nestplan.model.config import parse_config
from nestplan.model.spec import ModelSpec
from nestplan.profile import NO_PROFILE, SHARED_KERNELS, Profile, ProfileChoice, calibrated_cluster, read_profile
from nestplan.settings import Fp8Recipe, RunSettings, Setting, plain_value, setting_table
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule

MAX_RUNS = 100_000  # rows of one runs file
MAX_DEGREE = 2**20  # any parallel degree, GPU count or batch (the cluster bound)
DEFAULT_FP8_RECIPE = Fp8Recipe.DELAYED  # Transformer Engine's recipe when none is given (DelayedScaling)
_DEGREES = ("gpus", "tp", "pp", "vp", "cp", "ep", "dp", "mbs", "global_batch", "seq_len")
_PRECISIONS = ("bf16", "fp16", "fp8")
_FILE_KEYS = ("rows", "source", "held_out", "notes")
# the legacy column names of the published runs files (../shared/reference/measured), stated once: a row
# gives a run setting under its own name (the field table's) or under its alias
SETTING_ALIASES = {"grad_dtype": "grad_reduce_dtype", "flash_attention": "flash"}
SETTING_COLUMNS = (*(entry.name for entry in setting_table()), *SETTING_ALIASES.values())
_RUN_COLUMNS = ("id", "model_name", "model_config", "cluster", *_DEGREES, "sp", "recompute", "zero")
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
    measured_step_s: float


@dataclass(frozen=True)
class RowResult:
    """A run's prediction against its measurement, or why it could not be evaluated."""

    id: str
    run: Run | None
    predicted_step_s: float | None = None
    fits: bool | None = None
    peak_memory_bytes: float | None = None
    capacity_bytes: float | None = None
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The run's degrees and its prediction against its measurement as plain JSON values; a run not
        evaluated gives its id and its problem."""
        if self.run is None:
            return {"id": self.id, "evaluated": False, "problem": self.problem}
        dims = self.run.dims
        return {
            "id": self.id,
            "evaluated": True,
            "model": self.run.model.name,
            "cluster": self.run.cluster.name,
            "gpus": dims.devices,
            "tp": dims.tp,
            "sp": dims.sp_active,
            "pp": dims.pp,
            "vp": dims.virtual_stages,
            "cp": dims.cp,
            "ep": dims.ep,
            "dp": dims.dp,
            "precision": self.run.precision,
            "measured_step_s": self.run.measured_step_s,
            "predicted_step_s": self.predicted_step_s,
            "measured_tokens_per_s_per_gpu": self.measured_tokens_per_s_per_gpu,
            "predicted_tokens_per_s_per_gpu": self.predicted_tokens_per_s_per_gpu,
            "error": self.error,
            "fits": self.fits,
            "peak_memory_bytes": self.peak_memory_bytes,
            "capacity_bytes": self.capacity_bytes,
        }

    @property
    def error(self) -> float | None:
        """Predicted throughput over measured, minus 1: positive means predicted too fast."""
        if self.run is None or self.predicted_step_s is None:
            return None
        return self.run.measured_step_s / self.predicted_step_s - 1.0

    @property
    def measured_tokens_per_s_per_gpu(self) -> float | None:
        return None if self.run is None else _tokens_per_gpu(self.run, self.run.measured_step_s)

    @property
    def predicted_tokens_per_s_per_gpu(self) -> float | None:
        if self.run is None or self.predicted_step_s is None:
            return None
        return _tokens_per_gpu(self.run, self.predicted_step_s)


def _tokens_per_gpu(run: Run, step_s: float) -> float:
    return run.job.tokens_per_step / step_s / run.dims.devices


@dataclass(frozen=True)
class Summary:
    """|error| statistics of the rows evaluated in one group (a precision, a model, a tp degree)."""

    label: str
    rows: int
    median_abs: float
    max_abs: float
    mean: float


def read_runs(path: str | Path) -> list[tuple[str, Mapping[str, Any] | ConfigError]]:
    """(row id, row object) per row of a runs file; a row that is not an object is its error."""
    data = load_object(path, "runs file", "json")
    rows = data.get("rows") if isinstance(data, Mapping) else None
    if not isinstance(rows, list):
        raise ConfigError(
            f"runs file '{printable(str(path))}' needs a list 'rows'",
            field="rows",
            value=type(rows).__name__,
            limit="a list of run objects",
        )
    Fields(data, f"runs file '{printable(str(path))}'").refuse_unknown(_FILE_KEYS)
    if len(rows) > MAX_RUNS:
        raise ConfigError(
            f"runs file '{printable(str(path))}' has {len(rows):,} rows; at most {MAX_RUNS:,}",
            field="rows",
            value=len(rows),
            limit=MAX_RUNS,
        )
    out: list[tuple[str, Mapping[str, Any] | ConfigError]] = []
    for i, row in enumerate(rows):
        name = row.get("id") if isinstance(row, Mapping) else None
        label = printable(name) if isinstance(name, str) and name else f"row {i + 1}"
        out.append(
            (
                label,
                row
                if isinstance(row, Mapping)
                else ConfigError(f"{label}: a run must be an object, got {type(row).__name__}", field="rows"),
            )
        )
    return out


def _measured_step(f: Fields) -> float:
    published = f.table("published")  # metric and value read; its other keys document the measurement
    if published.raw("metric", None) != "step_time_s":
        raise f.error(
            "'published' must give metric 'step_time_s' and its value",
            "published",
            limit="{metric: step_time_s, value: seconds}",
        )
    value = published.raw("value", None)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1e7:
        raise f.error(
            f"published step time must be a number of seconds in (0, 1e7), got {brief(value)}",
            "published.value",
            brief(value),
            "(0, 1e7)",
        )
    return float(value)


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
    """The run settings of the row: every setting of the field table under its name or its alias; the FP8
    recipe only for an fp8 run (delayed when none is given)."""
    values = {entry.name: _setting(f, entry, _column(f, entry.name)) for entry in setting_table()}
    recipe = values["fp8_recipe"] or DEFAULT_FP8_RECIPE.value
    return RunSettings.from_mapping(values | {"fp8_recipe": recipe if precision == "fp8" else None})


def run_from_row(row: Mapping[str, Any], label: str) -> Run:
    """One row as a Run; a ConfigError naming the row and the field otherwise (an unknown column by name)."""
    f = Fields(row, label)
    f.refuse_unknown(ROW_COLUMNS)
    config = f.raw("model_config")
    if not isinstance(config, Mapping):
        raise f.error("'model_config' must be a config.json object", "model_config")
    name = row.get("model_name", label)
    model = parse_config(dict(config), printable(name) if isinstance(name, str) else label)
    n = {key: f.integer(key, MAX_DEGREE) for key in _DEGREES}
    dims = _dims(f, n)
    if dims.devices != n["gpus"]:
        raise f.error(
            f"tp x cp x ep x pp x dp = {dims.devices} but 'gpus' is {n['gpus']}", "gpus", n["gpus"], dims.devices
        )
    cluster_name = f.raw("cluster")
    if not isinstance(cluster_name, str):
        raise f.error("'cluster' must be a catalog name or a path", "cluster")
    order = tuple(part.strip() for part in str(row.get("axis_order", "tp,cp,ep,pp,dp")).split(","))
    cluster = load_cluster(cluster_name, n["gpus"])
    precision = f.choice("precision", _PRECISIONS)
    dtype = "fp16" if precision == "fp16" else "bf16"
    job = make_job(model, n["global_batch"], n["seq_len"], dtype=dtype, settings=_settings(f, precision))
    return Run(label, model, cluster, dims, order, job, precision, _measured_step(f))


def evaluate_row(label: str, row: Mapping[str, Any] | ConfigError, profile: ProfileChoice = NO_PROFILE) -> RowResult:
    """A row's prediction, or the one-line reason it has none; ``profile`` calibrates the rows of its
    accelerator and framework (nestplan.profile.calibrated_cluster), the others keep the published figures."""
    try:
        if isinstance(row, ConfigError):
            raise row
        run = run_from_row(row, label)
        if _profile_applies(profile, run):
            run = replace(run, cluster=calibrated_cluster(run.cluster, run.job.settings.framework, profile))
        pred = evaluate_plan(run.model, run.cluster, run.dims, run.job, run.axis_order)
    except PlannerError as exc:  # a per-row report: this row is skipped, the file goes on
        return RowResult(label, None, problem=str(exc))
    return RowResult(
        label, run, pred.step_time_s, pred.fits, pred.peak_memory_bytes_per_device, pred.memory_capacity_bytes
    )


def _profile_applies(profile: ProfileChoice, run: Run) -> bool:
    """Whether ``profile`` is for the run's accelerator and framework (None: the catalog's, for every run)."""
    if profile is None:
        return True
    if not isinstance(profile, (str, Path, Profile)) or str(profile).strip().lower() == NO_PROFILE:
        return False
    chosen = profile if isinstance(profile, Profile) else read_profile(profile)
    shares = SHARED_KERNELS.get(run.job.settings.framework) is chosen.framework
    framework_ok = chosen.framework is run.job.settings.framework or shares
    return chosen.accelerator == run.cluster.accelerator.name and framework_ok


def validate(path: str | Path, profile: ProfileChoice = NO_PROFILE) -> list[RowResult]:
    """Every row of a runs file, evaluated (or its problem); ``profile`` as ``evaluate_row`` applies it."""
    if isinstance(profile, (str, Path)) and str(profile).strip().lower() != NO_PROFILE:
        profile = read_profile(profile)
    return [evaluate_row(label, row, profile) for label, row in read_runs(path)]


def summarise(results: Sequence[RowResult], key, label: str = "{}") -> list[Summary]:
    """|error| statistics of the evaluated rows grouped by ``key(result)`` (sorted by the key)."""
    groups: dict[Any, list[float]] = {}
    for r in results:
        if r.error is not None:
            groups.setdefault(key(r), []).append(r.error)
    return [
        Summary(
            label.format(k),
            len(errs),
            statistics.median(abs(e) for e in errs),
            max(abs(e) for e in errs),
            statistics.fmean(errs),
        )
        for k, errs in sorted(groups.items(), key=lambda item: str(item[0]))
    ]
