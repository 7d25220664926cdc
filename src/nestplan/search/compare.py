"""nestplan against the baselines over device counts and microbatch sizes (NEST section 5)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Sequence

from nestplan.cluster import Cluster
from nestplan.errors import ConfigError, InfeasibleError
from nestplan.cost.prediction import Prediction
from nestplan.cost.run import RunLength, predicted_run
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.search.baselines import BASELINES
from nestplan.search.planner import plan_job
from nestplan.search.space import SearchSpace
from nestplan.strategy.describe import describe
from nestplan.units import GiB, MiB

if TYPE_CHECKING:
    import pandas


# The NEST paper's comparison (section 5): each model's sequence length, the device counts of each cluster
PAPER_MODELS = {"bert-large": 512, "llama2-7b": 4096, "llama3-70b": 4096, "gpt3-175b": 2048, "mixtral-8x7b": 4096}
PAPER_GRID = (("tpuv4-fattree", (64, 128, 256, 512, 1024)), ("h100-spine-leaf", (128, 256, 512, 1024)))
PAPER_MBS_SWEEP = (("bert-large", "llama2-7b", "llama3-70b"), "tpuv4-fattree", (256,), (1, 2, 4, 8))  # Figure 6
PAPER_ZERO_ABLATION = (("llama3-70b", 24 * GiB), ("bert-large", 120 * MiB))  # Table 7: device memory, bytes

PaperCase = tuple[str, str, tuple[int, ...], tuple[int, ...], int, float | None]


def paper_grid() -> list[PaperCase]:
    """The NEST paper's comparison, Figure 5's grid, Figure 6's microbatch sweep and Table 7's small devices:
    (model, cluster, device counts, microbatch sizes, sequence length, device memory in bytes or None), the
    fields of ``api.CompareCase``."""
    cases: list[PaperCase] = [(m, c, ns, (1,), seq, None) for c, ns in PAPER_GRID for m, seq in PAPER_MODELS.items()]
    models, cluster, devices, sweep_mbs = PAPER_MBS_SWEEP
    cases += [(m, cluster, devices, sweep_mbs, PAPER_MODELS[m], None) for m in models]
    cases += [(m, "tpuv4-fattree", (1024,), (1,), PAPER_MODELS[m], float(hbm)) for m, hbm in PAPER_ZERO_ABLATION]
    return cases


@dataclass(frozen=True)
class CompareRow:
    """One (case, planner): a row of the comparison CSV before normalisation."""

    model: str
    cluster: str
    devices: int
    micro_batch_size: int
    planner: str
    feasible: bool
    tokens_per_s: float
    solve_time_s: float
    plan: str
    # the plan's whole run (cost/run.py) where a length is given and the planner found a plan
    days: float | None = None
    gpu_hours: float | None = None
    energy_MWh: float | None = None
    cost_usd: float | None = None
    goodput: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RUN_FIELDS = ("days", "gpu_hours", "energy_MWh", "cost_usd", "goodput")


def run_cells(pred: Prediction | None, job: Job, cluster: Cluster, length: RunLength | None) -> dict[str, Any]:
    """A row's run fields: the plan's run (``RUN_FIELDS``), none without a plan or a length."""
    if pred is None or length is None:
        return {}
    run = predicted_run(pred, job, cluster, length)
    return {
        "days": run.days,
        "gpu_hours": run.gpu_hours,
        "energy_MWh": run.energy_MWh,
        "cost_usd": run.cost_usd,
        "goodput": run.reliability.goodput,
    }


def plan_cell(pred: Prediction | None) -> str:
    """A comparison row's plan: its short description, ``-`` where the planner found none."""
    return "-" if pred is None else describe(pred.plan)


def _nestplan(model: ModelSpec, cluster: Cluster, job: Job, mbs: int) -> tuple[Prediction | None, Job, float]:
    start = time.perf_counter()
    try:
        result = plan_job(model, cluster, job, SearchSpace(micro_batch_sizes=(mbs,)), top=0)
        best, job = result.best, result.job
    except InfeasibleError:
        best = None
    return best, job, time.perf_counter() - start


def compare_case(
    model: ModelSpec,
    cluster: Cluster,
    job: Job,
    mbs: int,
    baselines: Sequence[str],
    length: RunLength | None = None,
) -> list[CompareRow]:
    """nestplan and each baseline on one (cluster size, microbatch size), with each plan's run of
    ``length`` where given."""
    n = cluster.devices
    rows = []
    best, planned_job, secs = _nestplan(model, cluster, job, mbs)
    rows.append(
        CompareRow(
            model.name,
            cluster.name,
            n,
            mbs,
            "nestplan",
            best is not None,
            best.tokens_per_s if best else 0.0,
            secs,
            plan_cell(best),
            **run_cells(best, planned_job, cluster, length),
        )
    )
    for name in baselines:
        r = BASELINES[name](model, cluster, job, n, mbs)
        rows.append(
            CompareRow(
                model.name,
                cluster.name,
                n,
                mbs,
                name,
                r.feasible,
                r.tokens_per_s,
                r.solve_time_s,
                plan_cell(r.prediction),
                **run_cells(r.prediction, job, cluster, length),
            )
        )
    return rows


def normalise(rows: list[CompareRow]) -> list[float]:
    """Throughput over manual's at the smallest scale (the paper's convention); over nestplan's
    there when manual finds nothing."""
    first = min(rows, key=lambda r: (r.devices, r.micro_batch_size))
    base_rows = [r for r in rows if (r.devices, r.micro_batch_size) == (first.devices, first.micro_batch_size)]
    ref = next((r.tokens_per_s for r in base_rows if r.planner == "manual" and r.feasible), 0.0)
    ref = ref or next(r.tokens_per_s for r in base_rows if r.planner == "nestplan")
    return [r.tokens_per_s / ref if (ref and r.feasible) else 0.0 for r in rows]


def check_baselines(names: Sequence[str]) -> list[str]:
    out = [n.strip().lower() for n in names if n.strip()]
    bad = [n for n in out if n not in BASELINES]
    if bad:
        raise ConfigError(
            f"unknown baseline '{bad[0]}'; choose from {', '.join(BASELINES)}",
            field="baselines",
            value=bad[0],
            limit=list(BASELINES),
        )
    return out


def run_compare(
    model: ModelSpec,
    load_cluster: Callable[[int], Cluster],
    job: Job,
    devices: Sequence[int],
    micro_batch_sizes: Sequence[int],
    baselines: Sequence[str],
    progress: Callable[[str], None] | None = None,
    length: RunLength | None = None,
) -> list[CompareRow]:
    rows: list[CompareRow] = []
    for n in devices:
        cluster = load_cluster(n)
        for mbs in micro_batch_sizes:
            if progress:
                progress(f"{model.name} on {n} devices, microbatch {mbs}")
            rows.extend(compare_case(model, cluster, job, mbs, baselines, length))
    return rows


def to_dataframe(rows: Sequence[CompareRow]) -> pandas.DataFrame:
    """Compare rows as a pandas DataFrame, a column per CompareRow field (needs pandas)."""
    return dataframe([row.to_dict() for row in rows], [f.name for f in fields(CompareRow)])


def dataframe(records: Sequence[dict[str, Any]], columns: Sequence[str]) -> pandas.DataFrame:
    """``records`` as a pandas DataFrame with ``columns`` (there even when no record is); one
    ConfigError naming what to install where pandas is not."""
    try:
        import pandas
    except ImportError:
        raise ConfigError(
            "to_dataframe needs pandas: pip install pandas", field="to_dataframe", limit="pandas installed"
        ) from None
    return pandas.DataFrame.from_records(list(records), columns=list(columns))
