"""Tables, CSV and plots of a comparison (nestplan vs baselines)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from nestplan.report.cells import csv_cell
from nestplan.report.plots import plain_text
from nestplan.search.compare import RUN_FIELDS, CompareRow

CSV_FIELDS = (
    "model",
    "cluster",
    "devices",
    "micro_batch_size",
    "planner",
    "feasible",
    "tokens_per_s",
    "normalized",
    "solve_time_s",
    *RUN_FIELDS,  # empty without a run
)


def write_csv(path: Path, rows: Sequence[CompareRow], normalized: Sequence[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for r, x in zip(rows, normalized):
            row = [
                r.model,
                r.cluster,
                r.devices,
                r.micro_batch_size,
                r.planner,
                int(r.feasible),
                f"{r.tokens_per_s:.6g}",
                f"{x:.6g}",
                f"{r.solve_time_s:.4g}",
                *("" if getattr(r, k) is None else f"{getattr(r, k):.6g}" for k in RUN_FIELDS),
            ]
            w.writerow([csv_cell(cell) for cell in row])


@plain_text()
def plot(path: Path, rows: Sequence[CompareRow], normalized: Sequence[float], title: str) -> None:
    """Grouped bars of normalised throughput per device count (the paper's Figure 5), and a
    line plot of tokens/s against devices, one line per planner; infeasible cases get no bar
    and a dash label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    planners = list(dict.fromkeys(r.planner for r in rows))
    cases = list(dict.fromkeys((r.devices, r.micro_batch_size) for r in rows))
    value = {(r.planner, r.devices, r.micro_batch_size): (x, r) for r, x in zip(rows, normalized)}
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(planners)
    for i, name in enumerate(planners):
        xs = [c + i * width for c in range(len(cases))]
        ys = [value[(name, d, m)][0] for d, m in cases]
        bars.bar(xs, ys, width, label=name)
        for x, y in zip(xs, ys):
            if y == 0:
                bars.text(x, 0.02, "-", ha="center", va="bottom")
    bars.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))])
    bars.set_xticklabels([f"{d}" + (f"\nmbs {m}" if len({m for _, m in cases}) > 1 else "") for d, m in cases])
    bars.set_xlabel("devices")
    bars.set_ylabel("throughput / manual at the smallest scale")
    bars.legend(fontsize=8)
    for name in planners:
        pts = sorted((r.devices, r.tokens_per_s) for r in rows if r.planner == name and r.feasible)
        if pts:
            lines.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    lines.set_xscale("log", base=2)
    lines.set_xlabel("devices")
    lines.set_ylabel("tokens / s")
    lines.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
