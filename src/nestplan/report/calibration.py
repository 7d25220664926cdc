"""``nestplan calibrate``'s output: each factor before and after, and the errors before, after and when
each model is left out of the fit."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from nestplan.calibrate import CalibrationResult


def _stats(errors: tuple[float, ...]) -> tuple[float, float]:
    magnitudes = [abs(e) for e in errors]
    return statistics.median(magnitudes), max(magnitudes)


def calibration_dict(result: CalibrationResult) -> dict[str, Any]:
    """The fit as plain JSON values."""
    p = result.profile
    summaries = {
        name: dict(zip(("median_abs_error", "max_abs_error"), _stats(errors)))
        for name, errors in (
            ("published_figures", result.error_before),
            ("calibrated", result.error_after),
            ("leave_one_model_out", result.error_held_out),
        )
    }
    return {
        "accelerator": p.accelerator,
        "framework": p.framework.value,
        "factors": [
            {"name": f.factor.name, "before": 1.0, "after": f.value, "informative": f.informative} for f in result.fits
        ],
        "errors": summaries,
        "rows": [
            {"id": i, "model": m, "published_figures": b, "calibrated": a, "leave_one_model_out": h}
            for i, m, b, a, h in zip(
                result.ids, result.models, result.error_before, result.error_after, result.error_held_out
            )
        ],
    }


def render_calibration(console: Console, result: CalibrationResult) -> None:
    p = result.profile
    table = Table(title=f"calibration of {p.accelerator} under {p.framework.value} ({p.rows} runs, {p.models} models)")
    for col in ("factor", "before", "after", "what it scales"):
        table.add_column(col, justify="left" if col in ("factor", "what it scales") else "right")
    for f in result.fits:
        after = f"{f.value:.3f}" if f.informative else "1 (uninformative)"
        table.add_row(f.factor.name, "1", after, f.factor.help)
    console.print(table)
    for label, errors in (
        ("published figures", result.error_before),
        ("calibrated", result.error_after),
        ("leave one model out", result.error_held_out),
    ):
        median, largest = _stats(errors)
        console.print(f"{label}: median |error| {median:.1%}, max {largest:.1%}")


def cross_validation_dict(fits) -> list[dict[str, Any]]:
    """``api.cross_validate``'s fits as plain JSON values."""
    out = []
    for acc, fw, fit in fits:
        if isinstance(fit, str):
            out.append({"accelerator": acc, "framework": fw, "problem": fit})
            continue
        entry = calibration_dict(fit)
        out.append({key: entry[key] for key in ("accelerator", "framework", "factors", "errors")})
    return out


def render_cross_validation(console: Console, fits) -> None:
    """One line per (accelerator, framework): the published figures' error, and the calibrated profile's
    when each model is left out of its fit."""
    for acc, fw, fit in fits:
        if isinstance(fit, str):
            console.print(f"calibrate {acc} {fw}: not fitted: {fit}", markup=False)
            continue
        before, held = _stats(fit.error_before), _stats(fit.error_held_out)
        factors = ", ".join(f"{f.factor.name} {f.value:.2f}" for f in fit.fits if f.informative)
        console.print(
            f"{acc} {fw}: published figures median |error| {before[0]:.1%}, max {before[1]:.1%}; calibrated, "
            f"leave one model out: median {held[0]:.1%}, max {held[1]:.1%} ({factors})",
            markup=False,
        )
