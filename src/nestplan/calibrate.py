"""``nestplan calibrate RUNS.json``: fit a profile's factors (nestplan.profile) on measured runs.

The fit works on the logarithms of the factors and of the step times. Each row's predicted log step time
is linearised in the log factors once, around the published figures (a forward difference per factor),
and the fit solves the regularised least-squares problem

    minimise  sum_rows ((log predicted - log measured) / noise)^2  +  sum_factors (log factor / prior)^2

within each factor's bounds, re-evaluating the rows at each new point (a chord iteration: the same
slopes, new residuals). The prior term pulls each factor toward 1, the published figure, so that a handful
of rows cannot move a factor further than they can explain; ``noise`` (ROW_NOISE) is the error a row may
keep that no factor explains (its measurement, and what the model leaves out). A factor the rows barely depend on is
uninformative: it stays at 1 and is reported; a file where none is informative is refused.

How well the profile predicts runs it has not seen is measured by leaving one model out: fit on every
other model's rows, predict that model's. Its median and max |error| are the profile's trust band.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from nestplan.cost.evaluator import evaluate_plan
from nestplan.errors import ConfigError
from nestplan.profile import FACTORS, Factor, Profile, apply_profile
from nestplan.settings import Framework
from nestplan.validate import Run

STEP = math.log(1.05)  # the forward difference of each log factor
ITERATIONS = 4  # chord iterations of each fit
MIN_SENSITIVITY = 0.05  # |d log step / d log factor| a row must reach to inform a factor
MIN_INFORMED_ROWS = 3  # rows that must reach it
MIN_ROWS = 4
ROW_NOISE = 0.05  # the |log error| a row keeps that no factor explains: the weight of the rows against the prior
MIN_MODELS = 2


@dataclass(frozen=True)
class FactorFit:
    """One factor: its value after the fit (1 where it was not fitted) and whether the rows inform it."""

    factor: Factor
    value: float
    informative: bool


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted profile, its factors, and each row's error before (published figures) and after the fit,
    and when its model was left out of the fit (the cross-validated error)."""

    profile: Profile
    fits: tuple[FactorFit, ...]
    ids: tuple[str, ...]
    models: tuple[str, ...]
    error_before: tuple[float, ...]
    error_after: tuple[float, ...]
    error_held_out: tuple[float, ...]


def _errors(runs: Sequence[Run], log_pred: np.ndarray) -> tuple[float, ...]:
    """Predicted throughput over measured, minus 1, per row (validate's convention)."""
    return tuple(float(run.measured_step_s / math.exp(p) - 1.0) for run, p in zip(runs, log_pred))


class _Rows:
    """The runs a fit predicts, at any factors."""

    def __init__(self, runs: Sequence[Run], accelerator: str, framework: Framework) -> None:
        self.runs, self.accelerator, self.framework = runs, accelerator, framework
        self.measured = np.log([run.measured_step_s for run in runs])

    def profile(self, names: Sequence[str], x: np.ndarray, **fields: object) -> Profile:
        factors = MappingProxyType({name: float(math.exp(v)) for name, v in zip(names, x)})
        stats = {"median_error": 0.0, "max_error": 0.0, "rows": 0, "models": 0} | fields
        return Profile("fit", self.accelerator, self.framework, factors, **stats)

    def predict(self, names: Sequence[str], x: np.ndarray) -> np.ndarray:
        """log predicted step time of every run at the log factors ``x``."""
        profile = self.profile(names, x)
        out = []
        for run in self.runs:
            cluster = apply_profile(run.cluster, profile)
            out.append(math.log(evaluate_plan(run.model, cluster, run.dims, run.job, run.axis_order).step_time_s))
        return np.array(out)


def _bounded_ridge(J: np.ndarray, r: np.ndarray, x0: np.ndarray, prior: np.ndarray, lo, hi) -> np.ndarray:
    """argmin ||r + J (x - x0)||^2 + ||x / prior||^2 within [lo, hi] (an active set: a coordinate that leaves
    its bounds is fixed there and the others solved again)."""
    fixed: dict[int, float] = {}
    x = x0
    for _ in range(len(x0) + 1):
        free = [k for k in range(len(x0)) if k not in fixed]
        base = x0.copy()
        for k, v in fixed.items():
            base[k] = v
        rhs_r = r + J @ (base - x0)  # residual with the fixed ones at their bounds, the free ones at x0
        A = J[:, free].T @ J[:, free] + np.diag(1.0 / prior[free] ** 2)
        # the free coordinates' step d from x0: (J^T J + P) d = -J^T residual - P x0, P = diag(1 / prior^2)
        b = -(J[:, free].T @ rhs_r) - x0[free] / prior[free] ** 2
        d = np.linalg.solve(A, b) if free else np.zeros(0)
        x = base.copy()
        x[free] = x0[free] + d
        out = [k for k in free if not lo[k] <= x[k] <= hi[k]]
        if not out:
            return x
        for k in out:
            fixed[k] = float(np.clip(x[k], lo[k], hi[k]))
    return np.clip(x, lo, hi)


def _fit(rows: _Rows, names, J, train: np.ndarray, progress: Callable[[], None] | None) -> np.ndarray:
    """The log factors fitted on the rows ``train`` selects (chord iterations from the published figures)."""
    chosen = [f for f in FACTORS if f.name in names]
    prior = np.array([math.log(1 + f.prior) for f in chosen])
    lo = np.log([f.low for f in chosen])
    hi = np.log([f.high for f in chosen])
    x = np.zeros(len(chosen))
    for _ in range(ITERATIONS):
        r = rows.predict(names, x) - rows.measured
        if progress:
            progress()
        x_new = _bounded_ridge(J[train] / ROW_NOISE, r[train] / ROW_NOISE, x, prior, lo, hi)
        if np.max(np.abs(x_new - x)) < 1e-4:
            return x_new
        x = x_new
    return x


def select_runs(runs: Sequence[Run], accelerator: str | None, framework: Framework | None) -> list[Run]:
    """The runs of one (accelerator, framework): those named, or the file's only pair; refused otherwise."""
    pairs = sorted({(r.cluster.accelerator.name, r.job.settings.framework.value) for r in runs})
    chosen = [
        r
        for r in runs
        if (accelerator is None or r.cluster.accelerator.name == accelerator)
        and (framework is None or r.job.settings.framework is framework)
    ]
    left = sorted({(r.cluster.accelerator.name, r.job.settings.framework.value) for r in chosen})
    if not runs:
        raise ConfigError(
            "none of the runs file's rows could be evaluated (nestplan validate says why, row by row)",
            field="rows",
            value=0,
            limit=f">= {MIN_ROWS} rows that evaluate",
        )
    if len(left) != 1:
        listed = "; ".join(f"{a} {f}" for a, f in pairs) or "none"
        raise ConfigError(
            f"calibrate fits one accelerator and framework at a time; the runs give {listed}: "
            "choose with --accelerator and --framework",
            field="accelerator",
            value=accelerator,
            limit=[a for a, _ in pairs],
        )
    return chosen


def calibrate(
    runs: Sequence[Run],
    *,
    accelerator: str | None = None,
    framework: Framework | None = None,
    factors: Sequence[str] | None = None,
    progress: Callable[[], None] | None = None,
) -> CalibrationResult:
    """Fit the factors ``factors`` (default: every factor the rows inform) for one (accelerator, framework)."""
    chosen = select_runs(runs, accelerator, framework)
    models = tuple(r.model.name for r in chosen)
    if len(chosen) < MIN_ROWS or len(set(models)) < MIN_MODELS:
        raise ConfigError(
            f"calibrate needs at least {MIN_ROWS} runs of at least {MIN_MODELS} models (one is left out to "
            f"measure the fit); the file gives {len(chosen)} runs of {len(set(models))}",
            field="rows",
            value=len(chosen),
            limit=MIN_ROWS,
        )
    acc, fw = chosen[0].cluster.accelerator.name, chosen[0].job.settings.framework
    rows = _Rows(chosen, acc, fw)
    names = [f.name for f in FACTORS if factors is None or f.name in factors]
    J, base = _jacobian(rows, names, progress)
    informed = _informative(J)
    asked = [n for n, ok in zip(names, informed) if ok]
    if factors is not None and len(asked) < len(names):
        weak = [n for n, ok in zip(names, informed) if not ok]
        raise ConfigError(
            f"the runs do not inform factor {weak[0]}: no {MIN_INFORMED_ROWS} rows' step times move by "
            f"{MIN_SENSITIVITY:.0%} of a change in it",
            field="factors",
            value=weak[0],
            limit=[n for n, ok in zip(names, informed) if ok],
        )
    if not asked:
        raise ConfigError(
            f"the {len(chosen)} runs inform no factor (each moves fewer than {MIN_INFORMED_ROWS} rows' step times)",
            field="rows",
            value=len(chosen),
        )
    J = J[:, informed]
    everything = np.ones(len(chosen), dtype=bool)
    x = _fit(rows, asked, J, everything, progress)
    after = rows.predict(asked, x)
    held = _held_out(rows, asked, J, models, progress)
    return _result(rows, asked, x, names, informed, base, after, held, models)


def _jacobian(rows: _Rows, names: Sequence[str], progress) -> tuple[np.ndarray, np.ndarray]:
    """d log step / d log factor of every row (forward differences), and the rows at the published figures."""
    zero = np.zeros(len(names))
    base = rows.predict(names, zero)
    columns = []
    for k in range(len(names)):
        x = zero.copy()
        x[k] = STEP
        columns.append((rows.predict(names, x) - base) / STEP)
        if progress:
            progress()
    return np.array(columns).T, base


def _informative(J: np.ndarray) -> list[bool]:
    return [int(np.sum(np.abs(J[:, k]) >= MIN_SENSITIVITY)) >= MIN_INFORMED_ROWS for k in range(J.shape[1])]


def _held_out(rows: _Rows, names, J, models: Sequence[str], progress) -> np.ndarray:
    """Each row's log predicted step when the fit leaves its model out."""
    out = np.zeros(len(models))
    labels = np.array(models)
    for model in sorted(set(models)):
        train = labels != model
        x = _fit(rows, names, J, train, progress)
        out[~train] = rows.predict(names, x)[~train]
    return out


def _result(rows: _Rows, asked, x, names, informed, base, after, held, models) -> CalibrationResult:
    fitted = dict(zip(asked, (float(math.exp(v)) for v in x)))
    held_errors = _errors(rows.runs, held)
    magnitudes = [abs(e) for e in held_errors]
    profile = replace(
        rows.profile(asked, x),
        name=f"{rows.accelerator}.{rows.framework.value}",
        median_error=statistics.median(magnitudes),
        max_error=max(magnitudes),
        rows=len(rows.runs),
        models=len(set(models)),
    )
    fits = tuple(
        FactorFit(f, fitted.get(f.name, 1.0), ok) for f in FACTORS for n, ok in zip(names, informed) if n == f.name
    )
    return CalibrationResult(
        profile=profile,
        fits=fits,
        ids=tuple(r.id for r in rows.runs),
        models=tuple(models),
        error_before=_errors(rows.runs, base),
        error_after=_errors(rows.runs, after),
        error_held_out=held_errors,
    )


def evaluable(results) -> list[Run]:
    """The runs of validate's results that were read and evaluated (a row that failed is left out)."""
    return [r.run for r in results if r.run is not None and r.predicted_step_s is not None]
