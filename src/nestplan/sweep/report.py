"""Summary of a sweep's result store: table, CSV and plots.

The table's cells are plain text (names and swept values are shown as written, never read
as rich markup).

Plots (matplotlib): throughput per device against devices, one line per cluster variant and
one panel per model; and, for every model and every pair of swept network parameters, a heat
map of the best plan's throughput per device at the largest device count.
"""

from __future__ import annotations

import csv
import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from nestplan import outputs
from nestplan.errors import ConfigError, printable
from nestplan.report.cells import csv_cell
from nestplan.report.plots import plain_text
from nestplan.strategy.describe import describe
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.sweep.store import COLUMNS, Store

if TYPE_CHECKING:
    import pandas

RUN_FIELDS = ("days", "gpu_hours", "energy_MWh", "cost_usd", "goodput")  # a case's run, where the spec gives one
CSV_FIELDS = tuple(column for column in COLUMNS if column not in ("key", "cluster", "details", "finished_at"))
CSV_FIELDS += RUN_FIELDS


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    path = Path(out_dir) / "results.sqlite"
    if not path.is_file():
        raise ConfigError(
            f"no sweep results in '{printable(str(out_dir))}' (results.sqlite not found)",
            field="dir",
            value=printable(str(out_dir)),
            limit="a sweep output folder",
        )
    store = Store(path)
    try:
        return store.rows()
    finally:
        store.close()


TABLE_COLUMNS = ("model", "cluster variant", "devices", "status", "tok/s/device", "MFU", "plan")
RUN_COLUMNS = ("days", "GPU-hours", "MWh", "cost", "goodput")  # with runs: after the plan
RIGHT_ALIGNED = ("devices", "tok/s/device", "MFU", *RUN_COLUMNS)


def run_of(row: dict[str, Any]) -> dict[str, Any]:
    """A row's run figures by RUN_FIELDS (None each where the case has no run or the figure no input)."""
    run = (row.get("details") or {}).get("run")
    if run is None:
        return dict.fromkeys(RUN_FIELDS)
    return {k: run["reliability"]["goodput"] if k == "goodput" else run.get(k) for k in RUN_FIELDS}


def _run_cells(row: dict[str, Any]) -> tuple[str, ...]:
    run = run_of(row)
    days, hours, mwh, cost, good = (run[k] for k in RUN_FIELDS)
    return (
        "-" if days is None else f"{days:,.1f}",
        "-" if hours is None else f"{hours:,.0f}",
        "-" if mwh is None else f"{mwh:,.0f}",
        "-" if cost is None else f"${cost:,.0f}",
        "-" if good is None else f"{good:.1%}",
    )


def report_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """The report's table, one row per case (with the run's figures where any case has a run); every cell
    and the title are plain text."""
    table = Table(title=Text(printable(title)))
    runs = any(run_of(r)["days"] is not None for r in rows)
    for col in TABLE_COLUMNS + (RUN_COLUMNS if runs else ()):
        table.add_column(col, justify="right" if col in RIGHT_ALIGNED else "left")
    for r in rows:
        ok = r["status"] == "ok"
        cells = (
            r["model"],
            variant(r),
            str(r["devices"]),
            r["status"],
            f"{r['tokens_per_s_per_device']:,.0f}" if ok else "-",
            f"{r['mfu']:.1%}" if ok else "-",
            plan_text(r["plan"]),
        ) + (_run_cells(r) if runs else ())
        table.add_row(*(Text(printable(cell)) for cell in cells))
    return table


def variant(row: dict[str, Any]) -> str:
    """A cluster variant's name: label, accelerator, level overrides in brackets, device memory, and the
    framework where a case ran on another than Megatron-LM (kept in its details)."""
    swept = ", ".join(f"{k}={v:g}" for k, v in sorted(row["overrides"].items()))
    framework = (row.get("details") or {}).get("framework")
    return (
        row["label"]
        + (f" {row['accelerator']}" if row["accelerator"] else "")
        + (f" [{swept}]" if swept else "")
        + (f" {row['hbm_GiB']:g} GiB" if row["hbm_GiB"] else "")
        + (f" on {framework}" if framework else "")
    )


def plan_text(plan: dict[str, Any] | None) -> str:
    """A stored plan (the plan JSON's parallel section) in the short form of every report; ``-`` for none."""
    return "-" if not plan else describe(stored_dims(plan))


def stored_dims(plan: dict[str, Any]) -> ParallelDims:
    """The degrees of a stored plan; a field a row lacks (written before it existed) takes its default.
    One ConfigError where the values are no plan nestplan sweep writes."""
    tp = plan["tp"]
    try:
        return ParallelDims(
            tp=tp,
            pp=plan["pp"],
            dp=plan["dp"],
            cp=plan["cp"],
            ep=plan["ep"],
            sp=bool(plan["sp"]),
            zero=ZeroStage(plan["zero_stage"]),
            recompute=Recompute(plan.get("recompute", Recompute.NONE)),
            micro_batch_size=plan["micro_batch_size"],
            schedule=Schedule(plan.get("schedule", Schedule.ONE_F_ONE_B)),
            virtual_stages=plan.get("virtual_stages", 1),
            etp=plan.get("etp", tp),
        )
    except (ConfigError, ValueError) as exc:
        shown = printable(repr(plan))[:80]
        raise ConfigError(
            f"sweep report: stored plan {shown} is not what nestplan sweep writes ({printable(str(exc))})",
            field="plan",
            value=shown,
            limit="a row written by nestplan sweep",
        ) from None


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """An OSError while writing ``path`` (a read-only folder, a full disk) as one ConfigError naming it."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(
            f"sweep report: cannot write '{printable(str(path))}': {printable(exc.strerror or str(exc))}",
            field="out",
            value=printable(str(path)),
            limit="a writable folder",
        ) from None


def csv_record(row: dict[str, Any]) -> dict[str, Any]:
    """A store row as results.csv writes it: CSV_FIELDS, the cluster variant and the plan as text, the run's
    figures (empty without a run)."""
    run = run_of(row)
    return {
        f: variant(row)
        if f == "overrides"
        else plan_text(row["plan"])
        if f == "plan"
        else run[f]
        if f in run
        else row[f]
        for f in CSV_FIELDS
    }


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with _writing(path), outputs.replaced(path, "--out") as partial, open(partial, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for r in rows:
            w.writerow(csv_cell(cell) for cell in csv_record(r).values())


def to_dataframe(rows: Sequence[dict[str, Any]]) -> pandas.DataFrame:
    """A sweep's rows (``read_rows``, ``nestplan.api.sweep_report``) as a pandas DataFrame with the
    columns and cells of results.csv (needs pandas)."""
    from nestplan.search.compare import dataframe

    return dataframe([csv_record(r) for r in rows], CSV_FIELDS)


@plain_text()
def write_plots(rows: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    models = sorted({r["model"] for r in ok})
    if not models:
        return []
    paths = [out_dir / "throughput.png"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        lines = defaultdict(list)
        for r in ok:
            if r["model"] == model:
                lines[variant(r)].append((r["devices"], r["tokens_per_s_per_device"]))
        for name, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_ylabel("tokens / s / device")
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    with _writing(paths[0]), outputs.replaced(paths[0], "--out") as partial:
        fig.savefig(partial, dpi=110)
    plt.close(fig)
    paths += _heatmaps(ok, models, out_dir, plt)
    return paths


def _heatmaps(ok: list[dict], models: list[str], out_dir: Path, plt) -> list[Path]:
    """One heat map per (model, pair of swept parameters) at the largest device count."""
    paths = []
    swept = sorted({k for r in ok for k in r["overrides"] if len({json_key(x["overrides"].get(k)) for x in ok}) > 1})
    for model, (px, py) in itertools.product(models, itertools.combinations(swept, 2)):
        mine = [r for r in ok if r["model"] == model and px in r["overrides"] and py in r["overrides"]]
        if not mine:
            continue
        n = max(r["devices"] for r in mine)
        grid: dict[tuple, float] = {}
        for r in mine:
            if r["devices"] == n:
                k = (r["overrides"][px], r["overrides"][py])
                grid[k] = max(grid.get(k, 0.0), r["tokens_per_s_per_device"])
        xs, ys = sorted({k[0] for k in grid}), sorted({k[1] for k in grid})
        values = [[grid.get((x, y), float("nan")) for x in xs] for y in ys]
        fig, ax = plt.subplots(figsize=(1.5 + 0.9 * len(xs), 1.2 + 0.7 * len(ys)))
        im = ax.imshow(values, origin="lower", cmap="viridis", aspect="auto")
        for (i, y), (j, x) in itertools.product(enumerate(ys), enumerate(xs)):
            ax.text(j, i, f"{values[i][j]:.0f}", ha="center", va="center", fontsize=7, color="white")
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
        ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
        ax.set_xlabel(px)
        ax.set_ylabel(py)
        ax.set_title(f"{model}, {n} devices: tokens/s/device", fontsize=9)
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        path = out_dir / f"heatmap_{model}_{px}_{py}.png".replace("/", "_")
        with _writing(path), outputs.replaced(path, "--out") as partial:
            fig.savefig(partial, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def json_key(value: Any) -> str:
    return repr(value)
