"""Readable output: one plan, its runner-ups, a comparison, the catalog (rich tables).

Names and titles that come from input files are printed as text, never as rich markup, and with
their control characters escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nestplan.cost.prediction import Prediction
from nestplan.errors import printable
from nestplan.export import schedule_caveat
from nestplan.model.layers import active_params, total_params
from nestplan.strategy.describe import describe
from nestplan.plan import Plan, PredictionSummary
from nestplan.profile import is_tie
from nestplan.units import GiB


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def _name(text: str) -> str:
    """A name from the input, safe inside rich markup: brackets escaped, control characters written out."""
    return escape(printable(str(text)))


def fit_verdict(prediction: PredictionSummary) -> str:
    """'fits in memory (...)' or 'does not fit: ... exceeds ... by ...; largest term: ...', one line."""
    peak, capacity = prediction.peak_memory_bytes_per_device, prediction.memory_capacity_bytes
    if prediction.fits:
        return (
            f"fits in memory ({_gib(peak)} of {_gib(capacity)} GiB per device, "
            f"{(capacity - peak) / capacity:.1%} headroom)"
        )
    worst = max(prediction.memory_breakdown_bytes.items(), key=lambda kv: kv[1])
    return (
        f"does not fit: {_gib(peak)} GiB per device exceeds {_gib(capacity)} GiB by "
        f"{_gib(prediction.memory_excess_bytes)} GiB; largest term: {worst[0]} ({_gib(worst[1])} GiB)"
    )


def render_plan(console: Console, plan: Plan) -> None:
    """Print the plan (its first line ending with the fit verdict), its stage table, the step-time
    and memory breakdowns and, for a plan that does not fit, the verdict again under the memory table."""
    d, job, p = plan.dims, plan.job, plan.predicted
    verdict = escape(fit_verdict(p)) if p.fits else f"[bold red]{escape(fit_verdict(p))}[/]"
    console.print(
        f"[bold]{_name(plan.model.name)}[/] on [bold]{_name(plan.cluster.name)}[/]: {plan.devices_used} of "
        f"{plan.cluster.devices} devices, global batch {job.global_batch_size}, "
        f"sequence {job.seq_len}, {job.dtype}; {verdict}"
    )
    total, active = total_params(plan.model), active_params(plan.model)
    console.print(
        f"model: {escape(printable(plan.model.family))}, {total / 1e9:.2f} B parameters"
        + (f", {active / 1e9:.2f} B active per token" if active < total else "")
    )
    exchange = ""
    if d.cp > 1:
        sizes = (
            f" {job.settings.cp_a2a_size} x {d.cp // job.settings.cp_a2a_size}" if job.settings.cp_a2a_size > 1 else ""
        )
        exchange = f" ({job.settings.cp_comm_type.value}{sizes})"
    folded = f" (etp {d.etp}: experts over {d.expert_parallel} ranks)" if d.etp is not None else ""
    console.print(
        f"plan: tp {d.tp}{' +sp' if d.sp_active else ''}, cp {d.cp}{exchange}, ep {d.ep}{folded}, "
        f"pp {d.pp}, dp {d.dp}, ZeRO {int(d.zero)}, recompute {d.recompute.value}, "
        f"microbatch {d.micro_batch_size} x {plan.num_microbatches}, schedule {d.schedule.value}"
        + (f" (v={d.virtual_stages})" if d.virtual_stages > 1 else "")
    )
    names = plan.level_names
    spans = ", ".join(f"{k} {_name(names[v])}" for k, v in p.levels_spanned.items() if d.degree(k) > 1)
    console.print(f"placement: axis order {'-'.join(plan.axis_order)} (fastest first); groups span: {spans}")
    console.print(
        f"step time [bold]{p.step_time_s:.4f} s[/], {p.tokens_per_s:,.0f} tokens/s, "
        f"{p.model_tflops_per_device:.1f} model TFLOP/s per device (MFU {p.mfu:.1%}), "
        f"{p.hardware_tflops_per_device:.1f} hardware TFLOP/s"
    )
    console.print(
        f"trust: {escape(str(plan.trust['note']))}; framework {job.settings.framework.value}"
        + escape(schedule_caveat(plan))
    )
    console.print(_stage_table(p))
    console.print(_step_table(p))
    console.print(_memory_table(p))
    if not p.fits:
        console.print(verdict)


def _stage_table(p: PredictionSummary) -> Table:
    """One row per stage: its layers (E+ with the embedding, +H with the head), times and memory."""
    table = Table(title="stages (per microbatch, per device)")
    for col in ("stage", "layers", "devices", "fwd ms", "bwd ms", "cycle ms", "memory GiB"):
        table.add_column(col, justify="right")
    for i, s in enumerate(p.stages):
        extra = ("E+" if s.has_embedding else "") + f"{s.first_layer}-{s.last_layer}" + ("+H" if s.has_head else "")
        table.add_row(
            str(i), extra, str(s.devices), _ms(s.forward_s), _ms(s.backward_s), _ms(s.cycle_s), _gib(s.memory_bytes)
        )
    return table


def _step_table(p: PredictionSummary) -> Table:
    """The step time's nonzero terms, in seconds and as shares of the step."""
    bd = Table(title="step time breakdown")
    bd.add_column("term")
    bd.add_column("seconds", justify="right")
    bd.add_column("share", justify="right")
    for key, val in p.breakdown_s.items():
        if val > 0:
            bd.add_row(key, f"{val:.4f}", f"{val / p.step_time_s:.1%}")
    return bd


def _memory_table(p: PredictionSummary) -> Table:
    """The fullest stage's memory terms and their total, against the device's capacity."""
    mem = Table(title=f"memory of the fullest stage (capacity {_gib(p.memory_capacity_bytes)} GiB)")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    for key, val in p.memory_breakdown_bytes.items():
        mem.add_row(key, _gib(val))
    mem.add_row("[bold]total[/]", _gib(p.peak_memory_bytes_per_device))
    return mem


def why_lost(best: Prediction, other: Prediction) -> str:
    """The step-time term that grew most against the best plan."""
    if other.step_time_s <= best.step_time_s * (1 + 1e-9):
        return "tie: same predicted time"
    deltas = {k: other.breakdown_s[k] - best.breakdown_s.get(k, 0.0) for k in other.breakdown_s}
    term = max(deltas, key=deltas.get)
    return f"{term} +{deltas[term]:.3f} s"


def render_runners_up(
    console: Console, best: Prediction, others: tuple[Prediction, ...], band: Mapping[str, object] | None = None
) -> None:
    """The runner-ups against the best; one within the best's trust band (``band``) is marked a tie."""
    if not others:
        return
    table = Table(title="runner-up plans")
    for col in ("plan", "step s", "vs best", "why it lost", "memory GiB"):
        table.add_column(col, justify="right" if col != "plan" else "left")
    for pred in others:
        tie = band is not None and is_tie(pred.step_time_s, best.step_time_s, band)
        table.add_row(
            describe(pred.plan, pred.placement.axis_order, long=True),
            f"{pred.step_time_s:.3f}",
            f"+{pred.step_time_s / best.step_time_s - 1:.1%}" + (" (tie)" if tie else ""),
            why_lost(best, pred),
            _gib(pred.peak_memory_bytes_per_device),
        )
    console.print(table)


def render_schedules(console: Console, best: Prediction, alternatives: Sequence[Any]) -> None:
    """The best plan's degrees under every pipeline schedule (api.PlanReport.schedule_alternatives)."""
    if best.plan.pp < 2:
        return
    table = Table(title="pipeline schedules at these degrees")
    for col in ("schedule", "step s", "memory GiB", "verdict"):
        table.add_column(col, justify="left" if col in ("schedule", "verdict") else "right")
    for alt in alternatives:
        p = alt.prediction
        name = alt.schedule.value + (f" v{alt.virtual_stages}" if alt.virtual_stages > 1 else "")
        table.add_row(
            name,
            f"{p.step_time_s:.3f}" if p else "-",
            _gib(p.peak_memory_bytes_per_device) if p else "-",
            Text(printable(alt.verdict(best))),
        )
    console.print(table)


def render_compare(console: Console, title: str, rows: Sequence[Any], normalised: Sequence[float]) -> None:
    """One comparison: a row per (devices, microbatch size, planner), and its plan's run where rows have one."""
    table = Table(title=Text(printable(title)))
    runs = any(r.days is not None for r in rows)
    run_columns = ("days", "GPU-hours", "MWh", "cost", "goodput") if runs else ()
    for col in ("devices", "mbs", "planner", "tokens/s", "normalised", "solve s", *run_columns, "plan"):
        table.add_column(col, justify="left" if col in ("planner", "plan") else "right")
    for r, x in zip(rows, normalised):
        table.add_row(
            str(r.devices),
            str(r.micro_batch_size),
            r.planner,
            f"{r.tokens_per_s:,.0f}" if r.feasible else "-",
            f"{x:.2f}" if r.feasible else "-",
            f"{r.solve_time_s:.2f}",
            *(compare_run_cells(r) if runs else ()),
            Text(r.plan),
        )
    console.print(table)


def compare_run_cells(row: Any) -> tuple[str, ...]:
    """A comparison row's run: days, GPU-hours, MWh, cost and goodput (``-`` where not known)."""
    cells = (
        (row.days, "{:,.1f}"),
        (row.gpu_hours, "{:,.0f}"),
        (row.energy_MWh, "{:,.0f}"),
        (row.cost_usd, "${:,.0f}"),
        (row.goodput, "{:.1%}"),
    )
    return tuple("-" if value is None else shape.format(value) for value, shape in cells)


SOURCE_COLUMN_WIDTH = 60  # the catalog's source column at most, cut with an ellipsis (``--json`` has it whole)


def render_catalog(console: Console, kind: str, entries: Sequence[dict]) -> None:
    """The catalog's models, accelerators or clusters (``api.catalog_entries``) as a table; the
    source column takes the width the others leave (none on a very narrow terminal)."""
    columns, cells = _CATALOG_TABLES[kind]
    rows = [cells(entry) for entry in entries]
    widths = [max([len(col), *(len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    source_width = min(SOURCE_COLUMN_WIDTH, console.width - sum(widths) - 3 * (len(columns) + 1) - 1)
    table = Table(title=f"{len(entries)} {kind}")
    for col, width in zip(columns, widths):
        table.add_column(
            col,
            justify="left" if col in ("name", "family", "accelerator", "levels") else "right",
            width=width,
            no_wrap=True,
        )
    if source_width >= len("source"):
        table.add_column("source", width=source_width, no_wrap=True, overflow="ellipsis")
        rows = [[*row, Text(printable(entry["source"]))] for row, entry in zip(rows, entries)]
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _model_cells(m: dict) -> list[str]:
    return [
        m["name"],
        m["family"],
        str(m["layers"]),
        f"{m['hidden_size']:,}",
        f"{m['parameters_B']:,.1f}",
        str(m["experts"]) if m["experts"] else "-",
        f"{m['max_position_embeddings']:,}",
    ]


def _accelerator_cells(a: dict) -> list[str]:
    peaks = a["peak_TFLOPS"]
    return [
        a["name"],
        *(f"{peaks[d]:,.0f}" if d in peaks else "-" for d in ("bf16", "fp16", "fp8")),
        f"{a['hbm_GiB']:.0f}",
        f"{a['hbm_bandwidth_TBps']:.2f}",
    ]


def _cluster_cells(c: dict) -> list[str]:
    return [
        c["name"],
        c["accelerator"],
        f"{c['devices']:,}",
        " x ".join(f"{lv['name']} {lv['size']}" for lv in c["levels"]),
    ]


_CATALOG_TABLES = {
    "models": (("name", "family", "layers", "hidden", "params B", "experts", "positions"), _model_cells),
    "accelerators": (
        ("name", "bf16 TFLOP/s", "fp16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "HBM TB/s"),
        _accelerator_cells,
    ),
    "clusters": (("name", "accelerator", "devices", "levels"), _cluster_cells),
}
