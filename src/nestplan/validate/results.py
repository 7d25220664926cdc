"""Each run's prediction against its measurement, the error statistics, and the tolerance verdict.

A row that cannot be read or evaluated is one line naming it and the field; the others are still
evaluated. Under a tolerance, a row misses it when its step time error, or its memory error where
the row measured memory, is beyond it, when it is predicted not to fit although it ran, or when it
was not evaluated at all (a runs file whose rows cannot be checked does not pass).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.errors import ConfigError, PlannerError
from nestplan.profile import NO_PROFILE, Profile, ProfileChoice, calibrated_cluster, read_profile
from nestplan.validate.published import Measured
from nestplan.validate.rows import Run, Sources, read_runs, run_from_row

TOLERANCE_RANGE_PCT = (0.0, 1000.0)  # --tolerance in percent: above 0, at most 1000 (an error of 10x)


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
    predicted_memory_bytes: float | None = None  # the figure the measured memory is compared with

    def to_dict(self) -> dict[str, Any]:
        """The run's degrees and its prediction against its measurement as plain JSON values; a run not
        evaluated gives its id and its problem."""
        if self.run is None:
            return {"id": self.id, "evaluated": False, "problem": self.problem}
        dims, measured = self.run.dims, self.run.measured
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
            "measured_step_s": measured.step_s,
            "predicted_step_s": self.predicted_step_s,
            "measured_tokens_per_s_per_gpu": self.measured_tokens_per_s_per_gpu,
            "predicted_tokens_per_s_per_gpu": self.predicted_tokens_per_s_per_gpu,
            "error": self.error,
            "fits": self.fits,
            "peak_memory_bytes": self.peak_memory_bytes,
            "capacity_bytes": self.capacity_bytes,
            "memory_metric": measured.memory_metric,
            "measured_memory_bytes": measured.memory_bytes,
            "predicted_memory_bytes": self.predicted_memory_bytes,
            "memory_error": self.memory_error,
        }

    @property
    def error(self) -> float | None:
        """Predicted throughput over measured, minus 1: positive means predicted too fast."""
        if self.run is None or self.predicted_step_s is None:
            return None
        return self.run.measured_step_s / self.predicted_step_s - 1.0

    @property
    def memory_error(self) -> float | None:
        """Predicted memory per device over measured, minus 1 (positive: more predicted than measured);
        None where the row measured no memory."""
        if self.run is None or self.predicted_memory_bytes is None or self.run.measured.memory_bytes is None:
            return None
        return self.predicted_memory_bytes / self.run.measured.memory_bytes - 1.0

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


def comparable_memory(pred: Prediction, measured: Measured) -> float | None:
    """The predicted peak per device the measured memory is compared with (published.MEMORY_METRICS): with
    the accelerator's reserve for 'device', without it for 'allocated'; None where none was measured."""
    if measured.memory_metric is None:
        return None
    peak = pred.peak_memory_bytes_per_device
    return peak - pred.memory_breakdown_bytes["reserved"] if measured.memory_metric == "allocated" else peak


def evaluate_row(
    label: str, row: Any, sources: Sources | None = None, profile: ProfileChoice = NO_PROFILE
) -> RowResult:
    """A row's prediction, or the one-line reason it has none (``row``: a row object or its ConfigError);
    ``profile`` calibrates the rows of its accelerator and framework (nestplan.profile.calibrated_cluster),
    the others keep the published figures."""
    try:
        if isinstance(row, ConfigError):
            raise row
        run = run_from_row(row, label, sources)
        if _profile_applies(profile, run):
            run = replace(run, cluster=calibrated_cluster(run.cluster, run.job.settings.framework, profile))
        pred = evaluate_plan(run.model, run.cluster, run.dims, run.job, run.axis_order)
    except PlannerError as exc:  # a per-row report: this row is skipped, the file goes on
        return RowResult(label, None, problem=str(exc))
    return RowResult(
        label,
        run,
        pred.step_time_s,
        pred.fits,
        pred.peak_memory_bytes_per_device,
        pred.memory_capacity_bytes,
        predicted_memory_bytes=comparable_memory(pred, run.measured),
    )


def _profile_applies(profile: ProfileChoice, run: Run) -> bool:
    """Whether ``profile`` is for the run's accelerator and framework (None: the catalog's, for every run)."""
    if profile is None:
        return True
    if not isinstance(profile, Profile):
        return False
    return profile.accelerator == run.cluster.accelerator.name and profile.serves(run.job.settings.framework)


def validate(path: str | Path, profile: ProfileChoice = NO_PROFILE) -> list[RowResult]:
    """Every row of a runs file, evaluated (or its problem); its files found relative to its folder;
    ``profile`` (``"none"`` by default: the published figures) as ``evaluate_row`` applies it."""
    if isinstance(profile, (str, Path)) and str(profile).strip().lower() != NO_PROFILE:
        profile = read_profile(profile)
    sources = Sources(Path(path).parent)
    return [evaluate_row(label, row, sources, profile) for label, row in read_runs(path)]


@dataclass(frozen=True)
class Summary:
    """|error| statistics of the rows evaluated in one group (a precision, a model, a tp degree)."""

    label: str
    rows: int
    median_abs: float
    max_abs: float
    mean: float


def summarise(results: Sequence[RowResult], key, label: str = "{}", memory: bool = False) -> list[Summary]:
    """|error| statistics of the evaluated rows grouped by ``key(result)`` (sorted by the key): of the step
    time, or with ``memory`` of the memory (the rows that measured it)."""
    groups: dict[Any, list[float]] = {}
    for r in results:
        error = r.memory_error if memory else r.error
        if error is not None:
            groups.setdefault(key(r), []).append(error)
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


@dataclass(frozen=True)
class Miss:
    """A row that misses the tolerance, and why."""

    id: str
    reason: str


def check_tolerance(tolerance_pct: float) -> float:
    """``tolerance_pct`` itself, refused in one line outside TOLERANCE_RANGE_PCT (above 0, at most 1000)."""
    low, high = TOLERANCE_RANGE_PCT
    if (
        isinstance(tolerance_pct, bool)
        or not isinstance(tolerance_pct, (int, float))
        or not low < tolerance_pct <= high
    ):
        raise ConfigError(
            f"--tolerance must be a percentage in ({low:g}, {high:g}], got {tolerance_pct!r}",
            field="tolerance",
            value=tolerance_pct,
            limit=f"({low:g}, {high:g}]",
            unit="%",
        )
    return float(tolerance_pct)


def _reasons(r: RowResult, limit: float) -> list[str]:
    if r.run is None:
        return ["not evaluated"]
    found = [f"step time error {100 * r.error:+.1f}%"] if abs(r.error) > limit else []
    if r.memory_error is not None and abs(r.memory_error) > limit:
        found.append(f"memory error {100 * r.memory_error:+.1f}%")
    return found + ([] if r.fits else ["predicted not to fit"])


def misses(results: Sequence[RowResult], tolerance_pct: float) -> list[Miss]:
    """The rows that miss a tolerance of ``tolerance_pct`` percent (the module docstring's rule)."""
    limit = check_tolerance(tolerance_pct) / 100
    return [Miss(r.id, ", ".join(reasons)) for r in results if (reasons := _reasons(r, limit))]
