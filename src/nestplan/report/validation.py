"""`nestplan validate`'s table and JSON: every run's prediction against its measurement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nestplan.units import GiB
from nestplan.validate import Miss, RowResult, Summary, summarise

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


def _memory(r: RowResult) -> tuple[str, str, str]:
    """Measured and predicted memory per device (GiB, what the measurement counts) and the memory error."""
    if r.memory_error is None:
        return NO_VALUE, NO_VALUE, NO_VALUE
    measured = r.run.measured
    return (
        f"{measured.memory_bytes / GiB:.1f} {measured.memory_metric}",
        f"{r.predicted_memory_bytes / GiB:.1f}",
        f"{100 * r.memory_error:+.1f}%",
    )


def summaries(results: Sequence[RowResult]) -> list[Summary]:
    """All rows, then by precision, by model and by tensor-parallel degree; then the memory error of the
    rows that measured memory."""
    return (
        summarise(results, lambda r: "all", "{}")
        + summarise(results, lambda r: r.run.precision, "{}")
        + summarise(results, lambda r: r.run.model.name, "{}")
        + summarise(results, lambda r: r.run.dims.tp, "tp {}")
        + summarise(results, lambda r: "all", "memory, {}", memory=True)
    )


def _table(results: Sequence[RowResult]) -> Table:
    memory = any(r.memory_error is not None for r in results)
    table = Table(title="measured runs against nestplan (error: predicted throughput / measured - 1)")
    columns = [("run", "left"), ("GPUs", "right"), ("plan", "left"), ("precision", "left")]
    columns += [("measured tok/s/GPU", "right"), ("predicted", "right"), ("error", "right"), ("fits", "left")]
    if memory:
        columns += [("measured GiB", "right"), ("predicted GiB", "right"), ("memory error", "right")]
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for r in results:
        if r.run is None:
            continue
        cells = [escape(r.id), str(r.run.dims.devices), _degrees(r), r.run.precision]
        cells += [f"{r.measured_tokens_per_s_per_gpu:,.0f}", f"{r.predicted_tokens_per_s_per_gpu:,.0f}"]
        cells += [f"{100 * r.error:+.1f}%", _fit(r)]
        table.add_row(*cells, *(_memory(r) if memory else ()))
    return table


def render_validation(
    console: Console, results: Sequence[RowResult], tolerance_pct: float | None = None, missed: Sequence[Miss] = ()
) -> None:
    """The table of evaluated rows, one line per row not evaluated, the error statistics, and under a
    tolerance the rows that miss it."""
    console.print(_table(results))
    evaluated = sum(r.run is not None for r in results)
    console.print(f"{evaluated} of {len(results)} rows evaluated", markup=False)
    for r in results:
        if r.run is None:
            console.print(f"{r.id}: not evaluated: {r.problem}", markup=False)
    for s in summaries(results):
        console.print(
            f"{s.label}: {s.rows} runs, median |error| {100 * s.median_abs:.1f}%, max "
            f"{100 * s.max_abs:.1f}%, mean {100 * s.mean:+.1f}%",
            markup=False,
        )
    if tolerance_pct is None:
        return
    if not missed:
        console.print(f"tolerance {tolerance_pct:g}%: all {len(results)} rows within it", markup=False)
        return
    console.print(f"tolerance {tolerance_pct:g}%: {len(missed)} of {len(results)} rows miss it", markup=False)
    for miss in missed:
        console.print(f"  {miss.id}: {miss.reason}", markup=False)


def validation_dict(
    results: Sequence[RowResult], tolerance_pct: float | None = None, missed: Sequence[Miss] = ()
) -> dict[str, Any]:
    """Every row (RowResult.to_dict, with its plan in one line), the summaries and, under a tolerance,
    the rows that miss it."""
    out: dict[str, Any] = {
        "rows": [r.to_dict() | ({"plan": _degrees(r)} if r.run is not None else {}) for r in results],
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
    if tolerance_pct is not None:
        out["tolerance"] = {
            "percent": tolerance_pct,
            "passed": not missed,
            "missed": [{"id": m.id, "reason": m.reason} for m in missed],
        }
    return out
