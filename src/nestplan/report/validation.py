"""`nestplan validate`'s table and JSON: every run's prediction against its measurement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nestplan.units import GiB
from nestplan.validate import RowResult, Summary, summarise

NO_VALUE = "-"


def _degrees(r: RowResult) -> str:
    d = r.run.dims
    text = f"tp{d.tp}{'+sp' if d.sp_active else ''} pp{d.pp}"
    text += f" v{d.virtual_stages}" if d.virtual_stages > 1 else ""
    text += "".join(f" {axis}{getattr(d, axis)}" for axis in ("cp", "ep") if getattr(d, axis) > 1)
    text += f" etp{d.etp}" if d.etp is not None else ""
    return text + f" dp{d.dp}"


def _fit(r: RowResult) -> str:
    verdict = "yes" if r.fits else "NO"
    return f"{verdict} ({r.peak_memory_bytes / GiB:.1f}/{r.capacity_bytes / GiB:.0f} GiB)"


def summaries(results: Sequence[RowResult]) -> list[Summary]:
    """All rows, then by precision, by model and by tensor-parallel degree."""
    return (
        summarise(results, lambda r: "all", "{}")
        + summarise(results, lambda r: r.run.precision, "{}")
        + summarise(results, lambda r: r.run.model.name, "{}")
        + summarise(results, lambda r: r.run.dims.tp, "tp {}")
    )


def render_validation(console: Console, results: Sequence[RowResult]) -> None:
    table = Table(title="measured runs against nestplan (error: predicted throughput / measured - 1)")
    for name, justify in (
        ("run", "left"),
        ("GPUs", "right"),
        ("plan", "left"),
        ("precision", "left"),
        ("measured tok/s/GPU", "right"),
        ("predicted", "right"),
        ("error", "right"),
        ("fits", "left"),
    ):
        table.add_column(name, justify=justify)
    for r in results:
        if r.run is None:
            continue
        table.add_row(
            escape(r.id),
            str(r.run.dims.devices),
            _degrees(r),
            r.run.precision,
            f"{r.measured_tokens_per_s_per_gpu:,.0f}",
            f"{r.predicted_tokens_per_s_per_gpu:,.0f}",
            f"{100 * r.error:+.1f}%",
            _fit(r),
        )
    console.print(table)
    for r in results:
        if r.run is None:
            console.print(f"{r.id}: not evaluated: {r.problem}", markup=False)
    for s in summaries(results):
        console.print(
            f"{s.label}: {s.rows} runs, median |error| {100 * s.median_abs:.1f}%, max "
            f"{100 * s.max_abs:.1f}%, mean {100 * s.mean:+.1f}%",
            markup=False,
        )


def validation_dict(results: Sequence[RowResult]) -> dict[str, Any]:
    rows = []
    for r in results:
        if r.run is None:
            rows.append({"id": r.id, "evaluated": False, "problem": r.problem})
            continue
        rows.append(
            {
                "id": r.id,
                "evaluated": True,
                "gpus": r.run.dims.devices,
                "plan": _degrees(r),
                "precision": r.run.precision,
                "measured_step_s": r.run.measured_step_s,
                "predicted_step_s": r.predicted_step_s,
                "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu,
                "predicted_tokens_per_s_per_gpu": r.predicted_tokens_per_s_per_gpu,
                "error": r.error,
                "fits": r.fits,
                "peak_memory_bytes": r.peak_memory_bytes,
                "capacity_bytes": r.capacity_bytes,
            }
        )
    return {
        "rows": rows,
        "summaries": [
            {
                "group": s.label,
                "rows": s.rows,
                "median_abs_error": s.median_abs,
                "max_abs_error": s.max_abs,
                "mean_error": s.mean,
            }
            for s in summaries(results)
        ],
    }
