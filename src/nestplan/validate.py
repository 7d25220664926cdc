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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nestplan.cluster import Cluster, load_cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import named as named_schedule
from nestplan.errors import ConfigError, PlannerError, brief, printable
from nestplan.inputs import load_object
from nestplan.job import Job, make_job
from nestplan.model.config import parse_config
from nestplan.model.spec import ModelSpec
from nestplan.settings import Fp8Recipe, OptimizerState, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule

MAX_RUNS = 100_000  # rows of one runs file
MAX_DEGREE = 2**20  # any parallel degree, GPU count or batch (the cluster bound)
DEFAULT_FP8_RECIPE = Fp8Recipe.DELAYED  # Transformer Engine's recipe when none is given (DelayedScaling)
_DEGREES = ("gpus", "tp", "pp", "vp", "cp", "ep", "dp", "mbs", "global_batch", "seq_len")


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


def _field(row: Mapping[str, Any], key: str, label: str) -> Any:
    if key not in row:
        raise ConfigError(f"{label}: missing field '{key}'", field=key)
    return row[key]


def _int(row: Mapping[str, Any], key: str, label: str) -> int:
    value = _field(row, key, label)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DEGREE:
        raise ConfigError(
            f"{label}: '{key}' must be an integer in 1..{MAX_DEGREE:,}, got {brief(value)}",
            field=key,
            value=brief(value),
            limit=f"1..{MAX_DEGREE}",
        )
    return value


def _flag(row: Mapping[str, Any], key: str, label: str, default: bool | None = None) -> bool:
    value = row.get(key, default) if default is not None else _field(row, key, label)
    if not isinstance(value, bool):
        raise ConfigError(
            f"{label}: '{key}' must be true or false, got {brief(value)}",
            field=key,
            value=brief(value),
            limit=[True, False],
        )
    return value


def _choice(row: Mapping[str, Any], key: str, label: str, allowed: Sequence[str], default: str | None = None) -> str:
    value = row.get(key, default) if default is not None else _field(row, key, label)
    if value not in allowed:
        raise ConfigError(
            f"{label}: '{key}' must be one of {', '.join(allowed)}, got {brief(value)}",
            field=key,
            value=brief(value),
            limit=list(allowed),
        )
    return value


def _measured_step(row: Mapping[str, Any], label: str) -> float:
    published = _field(row, "published", label)
    if not isinstance(published, Mapping) or published.get("metric") != "step_time_s":
        raise ConfigError(
            f"{label}: 'published' must give metric 'step_time_s' and its value",
            field="published",
            limit="{metric: step_time_s, value: seconds}",
        )
    value = published.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1e7:
        raise ConfigError(
            f"{label}: published step time must be a number of seconds in (0, 1e7), got {brief(value)}",
            field="published.value",
            value=brief(value),
            limit="(0, 1e7)",
        )
    return float(value)


def _dims(row: Mapping[str, Any], label: str, n: Mapping[str, int]) -> ParallelDims:
    layers = row.get("layers_per_stage")
    if layers is not None and (
        not isinstance(layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
    ):
        raise ConfigError(
            f"{label}: 'layers_per_stage' must be null or a list of integers",
            field="layers_per_stage",
            value=brief(layers),
        )
    zero = row.get("zero", 0)
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise ConfigError(
            f"{label}: 'zero' must be 0, 1, 2 or 3, got {brief(zero)}",
            field="zero",
            value=brief(zero),
            limit=[0, 1, 2, 3],
        )
    return ParallelDims(
        tp=n["tp"],
        pp=n["pp"],
        dp=n["dp"],
        cp=n["cp"],
        ep=n["ep"],
        sp=_flag(row, "sp", label),
        zero=zero,
        recompute=Recompute(_choice(row, "recompute", label, [r.value for r in Recompute])),
        micro_batch_size=n["mbs"],
        virtual_stages=n["vp"],
        schedule=named_schedule(Schedule.ONE_F_ONE_B, n["vp"]),  # Megatron-LM runs interleaved 1F1B with vp > 1
        layers_per_stage=tuple(layers) if layers is not None else None,
    )


def _job(row: Mapping[str, Any], label: str, model: ModelSpec, n: Mapping[str, int]) -> Job:
    precision = _choice(row, "precision", label, ("bf16", "fp16", "fp8"))
    recipe = _choice(row, "fp8_recipe", label, [r.value for r in Fp8Recipe], DEFAULT_FP8_RECIPE.value)
    return make_job(
        model,
        n["global_batch"],
        n["seq_len"],
        dtype="fp16" if precision == "fp16" else "bf16",
        settings=RunSettings(
            grad_dtype=_choice(row, "grad_reduce_dtype", label, ("fp32", "bf16"), "fp32"),
            flash_attention=_flag(row, "flash", label, True),
            tp_comm_overlap=_flag(row, "tp_comm_overlap", label, False),
            fp8_recipe=Fp8Recipe(recipe) if precision == "fp8" else None,
            fp8_params=_flag(row, "fp8_params", label, False),
            optimizer_state=_choice(
                row, "optimizer_state", label, [k.value for k in OptimizerState], OptimizerState.FP32.value
            ),
            moe_capacity_factor=row.get("moe_capacity_factor"),
        ),
    )


def run_from_row(row: Mapping[str, Any], label: str) -> Run:
    """One row as a Run; a ConfigError naming the row and the field otherwise."""
    config = _field(row, "model_config", label)
    if not isinstance(config, Mapping):
        raise ConfigError(f"{label}: 'model_config' must be a config.json object", field="model_config")
    name = row.get("model_name", label)
    model = parse_config(dict(config), printable(name) if isinstance(name, str) else label)
    n = {key: _int(row, key, label) for key in _DEGREES}
    dims = _dims(row, label, n)
    if dims.devices != n["gpus"]:
        raise ConfigError(
            f"{label}: tp x cp x ep x pp x dp = {dims.devices} but 'gpus' is {n['gpus']}",
            field="gpus",
            value=n["gpus"],
            limit=dims.devices,
        )
    cluster_name = _field(row, "cluster", label)
    if not isinstance(cluster_name, str):
        raise ConfigError(f"{label}: 'cluster' must be a catalog name or a path", field="cluster")
    order = tuple(part.strip() for part in str(row.get("axis_order", "tp,cp,ep,pp,dp")).split(","))
    return Run(
        label,
        model,
        load_cluster(cluster_name, n["gpus"]),
        dims,
        order,
        _job(row, label, model, n),
        _choice(row, "precision", label, ("bf16", "fp16", "fp8")),
        _measured_step(row, label),
    )


def evaluate_row(label: str, row: Mapping[str, Any] | ConfigError) -> RowResult:
    """A row's prediction, or the one-line reason it has none."""
    try:
        if isinstance(row, ConfigError):
            raise row
        run = run_from_row(row, label)
        pred = evaluate_plan(run.model, run.cluster, run.dims, run.job, run.axis_order)
    except PlannerError as exc:  # a per-row report: this row is skipped, the file goes on
        return RowResult(label, None, problem=str(exc))
    return RowResult(
        label, run, pred.step_time_s, pred.fits, pred.peak_memory_bytes_per_device, pred.memory_capacity_bytes
    )


def validate(path: str | Path) -> list[RowResult]:
    """Every row of a runs file, evaluated (or its problem)."""
    return [evaluate_row(label, row) for label, row in read_runs(path)]


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
