"""Readable output of a whole run: one plan's run (days, GPU-hours, energy, cost, failures and
checkpoints) and a device range's table (the best plan at each size, the one chosen)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from nestplan.cost.run import RunEstimate
from nestplan.units import GB


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.0f}"


def energy(value: float | None) -> str:
    return "- (no board power)" if value is None else f"{value:,.1f} MWh"


def run_lines(run: RunEstimate) -> list[str]:
    """The run in a few lines: length, time, resources, failures and checkpoints."""
    r, c = run.reliability, run.reliability.checkpoint
    mtbi = "no failures" if r.mtbi_s is None else f"one every {r.mtbi_s / 3600:.2f} h"
    return [
        f"run: {run.steps:,} steps ({run.tokens:.4g} tokens) on {run.devices:,} devices + {run.spare_devices:,} "
        f"spare: {run.days:.2f} days, {run.gpu_hours:,.0f} GPU-hours, {energy(run.energy_MWh)}, cost "
        f"{money(run.cost_usd)}",
        f"  failures: {run.interruptions:,.1f} interruptions ({mtbi}), goodput {r.goodput:.1%} "
        f"(compute {run.compute_s / 86400:.2f} days)",
        f"  checkpoint: {c.written_bytes_per_rank / GB:.2f} GB written per rank of {c.held_bytes_per_rank / GB:.2f} "
        f"held, {c.job_bytes / GB:,.0f} GB in all; write {c.write_s:.1f} s ({c.blocking_s:.2f} s blocking), "
        f"every {r.interval_steps:,} steps ({r.interval_s / 60:.1f} min); restart {r.restart_s / 60:.1f} min "
        f"(read {c.read_s:.0f} s, waiting for a host {r.spare_wait_s:.0f} s)",
    ]


def render_run(console: Console, run: RunEstimate | None) -> None:
    if run is not None:
        for line in run_lines(run):
            console.print(line, markup=False, highlight=False)


def range_table(rows: Sequence[Any], chosen: int | None, objective: str) -> Table:
    """One row per device count: its best plan's step and run, the chosen one marked."""
    table = Table(title=f"devices: best plan at each size; objective {objective}")
    for header in ("devices", "plan", "step s", "days", "goodput", "GPU-hours", "MWh", "cost", "note"):
        table.add_column(header)
    for row in rows:
        run = row.run
        if run is None:
            table.add_row(f"{row.devices:,}", "-", "-", "-", "-", "-", "-", "-", row.note)
            continue
        mwh = "-" if run.energy_MWh is None else f"{run.energy_MWh:,.0f}"
        mark = "chosen" if row.devices == chosen else row.note
        table.add_row(
            f"{row.devices:,}",
            row.plan_text,
            f"{run.step_time_s:.3f}",
            f"{run.days:.2f}",
            f"{run.reliability.goodput:.1%}",
            f"{run.gpu_hours:,.0f}",
            mwh,
            money(run.cost_usd),
            mark,
        )
    return table


def render_range(console: Console, choice: Any) -> None:
    """The range's table and the CPU time the sizes took (those whose floor cannot win are not planned)."""
    console.print(range_table(choice.rows, choice.chosen.devices, str(choice.objective)))
    cpu = sum(row.cpu_s for row in choice.rows)
    skipped = sum(row.skipped for row in choice.rows)
    console.print(
        f"sizes: {len(choice.rows) - skipped} planned in {cpu:.2f} s of CPU, {skipped} skipped (their floor cannot win)",
        markup=False,
        highlight=False,
    )


def range_json(choice: Any) -> dict[str, Any]:
    """The range as plain JSON: the objective, the chosen count and every size's row."""
    from nestplan.plan.run import run_figures

    return {
        "objective": str(choice.objective),
        "chosen_devices": choice.chosen.devices,
        "sizes": [
            {
                "devices": row.devices,
                "plan": row.plan_text,
                "note": row.note,
                "cpu_s": row.cpu_s,
                "run": None if row.run is None else run_figures(row.run),
            }
            for row in choice.rows
        ],
    }
