"""Plots of one plan: its pipeline timeline, its memory per stage, its placement on the network.

The data behind each figure comes from the evaluator's own objects (the Prediction's stages,
the schedule simulation, the Placement's rank grid), so a figure shows what was costed:
the timeline is the evaluator's schedule recorded operation by operation, followed by the
step end (exposed gradient sync, tied-embedding sync, optimizer step), and its length is the
predicted step time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nestplan import outputs
from nestplan.cost.memory import MEMORY_TERMS
from nestplan.cost.prediction import Prediction
from nestplan.cost.schedules.operations import FORWARD, FULL_BACKWARD, INPUT_GRAD, OVERLAPPED, WEIGHT_GRAD
from nestplan.cost.schedules.periodic import OPERATIONS_PER_CHUNK_SPLIT, Timeline, check_recorded, simulate
from nestplan.cost.schedules.walk import SplitTimes, simulate_operations
from nestplan.errors import printable
from nestplan.network.topology import Topology
from nestplan.strategy.dims import AXES
from nestplan.strategy.placement import rank_grid
from nestplan.units import GiB

# operation kinds (cost/schedules/operations.py; FORWARD and INPUT_GRAD are cost/schedules/periodic.py's FORWARD and BACKWARD)
OPERATION_STYLES = (
    (FORWARD, "Blues", "forward"),
    (INPUT_GRAD, "Oranges", "backward"),
    (WEIGHT_GRAD, "Greens", "W (weight gradients)"),
    (FULL_BACKWARD, "Reds", "B+W"),
    (OVERLAPPED, "Purples", "F&BW overlapped"),
)
MAX_LABELLED_OPS = 400  # microbatch numbers are written in the bars up to this many operations
MAX_NODE_ROWS = 32  # the placement figure folds the nodes into columns of this many
# The placement figure draws a cell per device up to this many; beyond, a cell per block of whole nodes,
# at most this many blocks (a 2^20-device cluster asked for a ~10 GB canvas): with MAX_ROW_CELLS a row and
# MAX_NODE_ROWS rows a column, the canvas stays under ~2,700 x 1,100 pixels at 110 dpi.
MAX_PLACEMENT_CELLS = 1024
MAX_ROW_CELLS = 32  # cells in one row of the placement figure when a cell is a block of nodes
# a panel's width at most, inches: at 110 dpi the figure stays ~1,650 px wide, its text legible where the HTML
# report fits it to the page's 80em
MAX_PANEL_WIDTH_IN = 6.5
MAX_ROW_DEVICES = 16  # a node wider (a 72-GPU NVL72 rack) is drawn a cell per host: a row of 72 cells is unreadable


@dataclass(frozen=True)
class StepTimeline:
    """One step as the evaluator costs it: the pipeline operations, then the step end."""

    pipeline: Timeline
    step_end_s: float  # exposed dp sync + tied embeddings + optimizer, after the pipeline

    @property
    def total_s(self) -> float:
        return self.pipeline.makespan_s + self.step_end_s


def step_timeline(pred: Prediction) -> StepTimeline:
    """Record the plan's pipeline schedule, every forward and backward of every stage."""
    dims = pred.plan
    step_end = pred.breakdown_s["dp_sync"] + pred.breakdown_s["optimizer"]
    if dims.schedule.splits_backward:
        check_recorded(len(pred.stages), pred.num_microbatches, dims.virtual_stages, OPERATIONS_PER_CHUNK_SPLIT)
        return StepTimeline(
            simulate_operations(dims.schedule, _split_times(pred), pred.num_microbatches).timeline(), step_end
        )
    if pred.stages[0].chunk_forward_s:  # an uneven interleaved layout: per (stage, chunk) times
        forward = np.array([s.chunk_forward_s for s in pred.stages])
        backward = np.array([s.chunk_backward_s for s in pred.stages])
    else:
        forward, backward = [s.forward_s for s in pred.stages], [s.backward_s for s in pred.stages]
    _, timeline = simulate(forward, backward, pred.num_microbatches, dims.schedule, dims.virtual_stages, record=True)
    return StepTimeline(timeline, step_end)


def _split_times(pred: Prediction) -> SplitTimes:
    """The evaluator's per-chunk times of a schedule that splits the backward, back as arrays."""

    def table(field: str) -> np.ndarray:
        return np.array([getattr(s, field) for s in pred.stages])

    return SplitTimes.of_backward(
        *(
            table(f)
            for f in (
                "chunk_forward_s",
                "chunk_backward_s",
                "chunk_weight_grad_s",
                "chunk_forward_comm_s",
                "chunk_backward_comm_s",
            )
        )
    )


def device_map(pred: Prediction, devices: int) -> tuple[np.ndarray, np.ndarray]:
    """(stage, replica) of every device of the cluster, -1 where a device is idle. Rank r runs
    on device r: the rank grid of the Placement is the device order."""
    dims = pred.plan
    grid = rank_grid(dims, pred.placement.axis_order)
    index = np.indices(grid.shape)
    stage = np.full(devices, -1)
    replica = np.full(devices, -1)
    stage[grid.ravel()] = index[AXES.index("pp")].ravel()
    replica[grid.ravel()] = index[AXES.index("dp")].ravel()
    return stage, replica


@contextmanager
def plain_text() -> Iterator[None]:
    """Every figure drawn inside: its text drawn as written, never read as TeX or mathtext (a model named
    ``a$\\foo$b`` is a name: matplotlib would otherwise parse ``$...$`` and fail on the unknown ``\\foo``).
    Every nestplan figure is drawn inside it (plots of a plan, of a comparison, of a sweep)."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context({"text.usetex": False, "text.parse_math": False}):
        yield


def write_plan_plots(
    pred: Prediction, topology: Topology, out_dir: Path, title: str, host: int | None = None
) -> list[Path]:
    """Write timeline.png, memory.png and placement.png into out_dir, the three or none (nestplan.outputs.staged);
    returns their paths. The title is drawn as plain text, its invisible characters as escapes; ``host``: the
    cluster's devices per host (the placement's cells where a node is wide)."""
    title = printable(title)
    names = ("timeline.png", "memory.png", "placement.png")
    with plain_text(), outputs.staged(out_dir, "--plot") as stage:
        _timeline_figure(step_timeline(pred), pred, stage / names[0], title)
        _memory_figure(pred, stage / names[1], title)
        _placement_figure(pred, topology, stage / names[2], title, host)
    return [out_dir / name for name in names]


def _timeline_figure(step: StepTimeline, pred: Prediction, path: Path, title: str) -> None:
    """The whole step; when there are too many operations to see, also its start and its end
    (warm-up, cool-down and their bubbles) at a readable scale."""
    import matplotlib.pyplot as plt

    t = step.pipeline
    p = len(pred.stages)
    zoom = len(t.stage) > MAX_LABELLED_OPS
    height = 1.2 + 0.45 * min(p, 32)
    fig = plt.figure(figsize=(13, height * (2 if zoom else 1)))
    if zoom:
        grid = fig.add_gridspec(2, 2)
        axes = [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]
        v = pred.plan.virtual_stages
        window = min(step.total_s / 3, (p + 6) * max(s.cycle_s for s in pred.stages) / v)
        axes[1].set_xlim(0, window)
        axes[2].set_xlim(step.total_s - window, step.total_s * (1 + 1e-3))
        axes[1].set_title("start of the step (warm-up)", fontsize=8)
        axes[2].set_title("end of the step (cool-down, step end)", fontsize=8)
    else:
        axes = [fig.add_subplot(1, 1, 1)]
    axes[0].set_xlim(0, step.total_s * 1.01)
    for ax in axes:
        _draw_operations(ax, step, p, labels=ax is not axes[0] or not zoom)
    bubble = pred.breakdown_s["pipeline_bubble"]
    axes[0].set_title(
        f"{title}: {pred.plan.schedule.value}, {pred.num_microbatches} microbatches, step "
        f"{step.total_s:.3f} s (bubble {bubble:.3f} s on the bottleneck stage {pred.bottleneck_stage})",
        fontsize=9,
    )
    axes[0].legend(fontsize=7, loc="lower right", ncol=2)
    _save(fig, path)


def _draw_operations(ax, step: StepTimeline, p: int, labels: bool) -> None:
    import matplotlib.pyplot as plt

    t = step.pipeline
    v = max(int(t.chunk.max()) + 1, 1)
    lo, hi = ax.get_xlim()
    shown = (t.end_s > lo) & (t.start_s < hi)
    for kind, cmap, name in OPERATION_STYLES:
        if not (t.kind == kind).any():
            continue
        for c in range(v):
            colour = plt.get_cmap(cmap)(0.45 + 0.4 * c / max(v - 1, 1))
            for s in range(p):
                sel = shown & (t.kind == kind) & (t.chunk == c) & (t.stage == s)
                ax.broken_barh(
                    np.column_stack([t.start_s[sel], t.end_s[sel] - t.start_s[sel]]),
                    (s - 0.4, 0.8),
                    facecolors=colour,
                    edgecolor="white",
                    linewidth=0.3 if labels else 0.0,
                    label=(f"{name}" + (f" (chunk {c})" if v > 1 else "")) if s == 0 else None,
                )
    if labels and shown.sum() <= MAX_LABELLED_OPS:
        for s, a, e, j in zip(t.stage[shown], t.start_s[shown], t.end_s[shown], t.microbatch[shown]):
            ax.text((max(a, lo) + min(e, hi)) / 2, s, str(j), ha="center", va="center", fontsize=6)
    ax.barh(
        np.arange(p),
        step.step_end_s,
        left=t.makespan_s,
        height=0.8,
        color="0.55",
        label="step end: exposed dp sync, tied embeddings, optimizer",
    )
    ax.axvline(step.total_s, color="black", linewidth=0.8)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_ylabel("pipeline stage")
    ax.set_xlabel("time in the step (s)")


def _memory_figure(pred: Prediction, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    p = len(pred.stages)
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * p + 4), 4.5))
    xs = np.arange(p)
    bottom = np.zeros(p)
    for term in MEMORY_TERMS:
        gib = np.array([s.memory_bytes.get(term, 0.0) for s in pred.stages]) / GiB
        ax.bar(xs, gib, bottom=bottom, label=term, width=0.8)
        bottom += gib
    ax.axhline(pred.memory_capacity_bytes / GiB, color="red", linestyle="--", linewidth=1, label="device memory")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per device")
    ax.set_xticks(xs if p <= 32 else xs[:: max(p // 16, 1)])
    ax.set_title(
        f"{title}: memory per device by stage\n(ZeRO {pred.plan.zero.value}, recompute {pred.plan.recompute.value})",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper right")
    _save(fig, path)


def _placement_figure(pred: Prediction, topology: Topology, path: Path, title: str, host: int | None) -> None:
    import matplotlib
    import matplotlib.pyplot as plt

    stage, replica = device_map(pred, topology.devices)
    cells = _placement_cells(topology, host)
    rows_total = -(-topology.devices // (cells.block * cells.per_row))
    folds = -(-rows_total // MAX_NODE_ROWS)
    rows = min(rows_total, MAX_NODE_ROWS)
    panel_width = min(MAX_PANEL_WIDTH_IN, max(3.0, 0.35 * cells.per_row * folds))
    fig, axes = plt.subplots(1, 2, figsize=(2 + 2 * panel_width, 1.5 + 0.25 * rows))
    for ax, values, name in ((axes[0], stage, "pipeline stage"), (axes[1], replica, "data-parallel replica")):
        image = _fold(values[:: cells.block].astype(float), cells.per_row, rows, folds)
        count = int(values.max()) + 1
        drawn = ax.imshow(
            np.ma.masked_less(image, 0),
            cmap=_categories(matplotlib, count),
            vmin=-0.5,
            vmax=count - 0.5,
            aspect="auto",
            interpolation="nearest",
        )
        legend = fig.colorbar(drawn, ax=ax, fraction=0.04, pad=0.02)
        legend.locator = matplotlib.ticker.MaxNLocator(nbins=min(count, 10), integer=True)
        legend.update_ticks()
        legend.set_label(name, fontsize=8)
        _draw_levels(ax, topology, rows, cells.block * cells.per_row, folds, cells.per_row)
        ax.set_title(f"{name} of every {cells.what} (white: idle)", fontsize=9)
        ax.set_xlabel(f"{cells.what} in its {cells.row_name}" + (f" ({folds} columns of rows)" if folds > 1 else ""))
        ax.set_ylabel(cells.row_name)
        ax.set_xticks([])
    spans = pred.placement.levels_spanned()
    names = [lv.name for lv in topology.levels]
    groups = ", ".join(f"{a} {pred.plan.degree(a)} in {names[spans[a]]}" for a in AXES if pred.plan.degree(a) > 1)
    fig.suptitle(f"{title}: rank order {'-'.join(pred.placement.axis_order)} (fastest first)\n{groups}", fontsize=9)
    _save(fig, path)


@dataclass(frozen=True)
class _Cells:
    """How the placement figure draws devices: ``block`` devices per cell, ``per_row`` cells per row."""

    block: int
    per_row: int
    what: str  # what a cell is: a device, or a unit of a level (shown as its first device)
    row_name: str


def _placement_cells(topology: Topology, host: int | None = None) -> _Cells:
    """A cell per device, a row per node, up to MAX_PLACEMENT_CELLS devices; a node wider than MAX_ROW_DEVICES
    (a 72-GPU NVL72 rack) a row of a cell per host of ``host`` devices, or per the smallest block that divides
    it into at most MAX_ROW_CELLS; beyond MAX_PLACEMENT_CELLS devices, a cell per block of whole nodes (the
    fewest that keep the cells at most MAX_PLACEMENT_CELLS), MAX_ROW_CELLS cells a row."""
    level0 = topology.levels[0]
    if topology.devices <= MAX_PLACEMENT_CELLS and level0.size <= MAX_ROW_DEVICES:
        return _Cells(1, level0.size, "device", level0.name)
    if topology.devices <= MAX_PLACEMENT_CELLS:
        if host is not None and 1 < host < level0.size and level0.size % host == 0:
            return _Cells(host, level0.size // host, f"host of {host} devices (its first device)", level0.name)
        block = next(b for b in range(2, level0.size + 1) if level0.size % b == 0 and level0.size // b <= MAX_ROW_CELLS)
        return _Cells(block, level0.size // block, f"block of {block} devices (its first device)", level0.name)
    nodes = topology.devices // level0.size
    block = level0.size * -(-nodes // MAX_PLACEMENT_CELLS)
    per_row = min(-(-topology.devices // block), MAX_ROW_CELLS)
    return _Cells(block, per_row, f"block of {block:,} devices (its first device)", f"row of {per_row} blocks")


def _categories(matplotlib, n: int):
    """A colour per category (tab20 without its greys) when there are few, else a gradient; idle white."""
    if n <= 18:
        colours = [c for i, c in enumerate(matplotlib.colormaps["tab20"].colors) if i not in (14, 15)]
        return matplotlib.colors.ListedColormap(colours[:n]).with_extremes(bad="white")
    return matplotlib.colormaps["viridis"].with_extremes(bad="white")


def _fold(values: np.ndarray, per_node: int, rows: int, folds: int) -> np.ndarray:
    """Devices as an image: a row per node, nodes folded into `folds` side-by-side columns."""
    padded = np.full(rows * folds * per_node, -1.0)
    padded[: values.size] = values
    blocks = padded.reshape(folds, rows, per_node)
    return np.concatenate(list(blocks), axis=1)


def _draw_levels(ax, topology: Topology, rows: int, row_devices: int, folds: int, per_row: int) -> None:
    """Lines between the units of every level above a row (thicker for outer levels)."""
    for f in range(1, folds):
        ax.axvline(f * per_row - 0.5, color="black", linewidth=2.5)
    for level in range(1, topology.num_levels):
        nodes_per_unit = topology.unit_devices(level) // row_devices
        if nodes_per_unit < 1 or nodes_per_unit >= rows:
            continue
        for r in range(nodes_per_unit, rows, nodes_per_unit):
            ax.axhline(r - 0.5, color="black", linewidth=0.8 * level)


def write_range_plot(rows: Sequence[Any], chosen: int, path: Path, title: str) -> Path:
    """Days and cost (GPU-hours where no price is given) against devices, one point per size with a run
    (search/sizes.py SizeRow), the goodput written at each and the chosen size marked; its text plain."""
    with plain_text():
        _draw_range(rows, chosen, path, title)
    return path


def _draw_range(rows: Sequence[Any], chosen: int, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    runs = [(row.devices, row.run) for row in rows if row.run is not None]
    devices = [n for n, _ in runs]
    priced = all(run.cost_usd is not None for _, run in runs)
    spend = [run.cost_usd if priced else run.gpu_hours for _, run in runs]
    fig, days_ax = plt.subplots(figsize=(8, 4.5))
    days_ax.plot(devices, [run.days for _, run in runs], marker="o", color="tab:blue", label="days")
    for n, run in runs:
        days_ax.annotate(f"{run.reliability.goodput:.1%}", (n, run.days), textcoords="offset points", xytext=(0, 7))
    if chosen in devices:
        days_ax.axvline(chosen, color="grey", linestyle=":", label=f"chosen: {chosen:,}")
    days_ax.set_xscale("log", base=2)
    days_ax.set_xlabel("devices (goodput at each point)")
    days_ax.set_ylabel("wall-clock days")
    spend_ax = days_ax.twinx()
    spend_ax.plot(devices, spend, marker="s", color="tab:red", label="cost, USD" if priced else "GPU-hours")
    spend_ax.set_ylabel("cost, USD" if priced else "GPU-hours")
    handles = days_ax.get_legend_handles_labels()[0] + spend_ax.get_legend_handles_labels()[0]
    days_ax.legend(handles=handles, fontsize=8, loc="upper center")
    days_ax.set_title(f"{title}: the best plan's run at each size", fontsize=9)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    """Write the figure to ``path`` (in a private folder of nestplan.outputs, moved into place by it)."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)
