"""nestplan against baseline planners: ``CompareCase``, ``Comparison``, ``compare`` and the paper's cases."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from nestplan.api.display import short
from nestplan.api.resolve import DEFAULT_GLOBAL_BATCH, job_for, resolve_cluster, resolve_model
from nestplan.profile import ProfileChoice, calibrated_cluster
from nestplan.settings import Framework
from nestplan.cluster import Cluster
from nestplan.cost.run import RunLength
from nestplan.model import ModelSpec
from nestplan.units import GiB, MiB

if TYPE_CHECKING:  # imported where used: the CLI starts without the search, the exports and the sweep
    import pandas

    from nestplan.search.compare import CompareRow


@dataclass(frozen=True)
class CompareCase:
    """One model on one cluster of a comparison, planned at each device count and microbatch size.

    model, cluster: names (or paths), or the objects themselves (the cluster is cut to each count).
    hbm_bytes: device memory to plan with instead of the accelerator's, without a framework
        reserve (the paper's hypothetical small devices); None keeps the accelerator as it is.
    framework, profile: the software that runs every plan, and the calibration of the cluster.
    """

    model: str | ModelSpec
    cluster: str | Cluster
    devices: tuple[int, ...]
    micro_batch_sizes: tuple[int, ...] = (1,)
    seq_len: int | None = None
    hbm_bytes: float | None = None
    framework: Framework = Framework.MEGATRON  # the software every plan runs on (its kernels and presets)
    profile: ProfileChoice = None  # calibration (nestplan.profile.calibrated_cluster; None: the catalog's)


@dataclass(frozen=True)
class Comparison:
    """The rows of one CompareCase (``search.compare.CompareRow``) and their normalised throughput."""

    title: str
    rows: list[CompareRow]
    normalised: list[float]

    @property
    def tag(self) -> str:
        """The title as a file name stem."""
        return self.title.replace(" on ", "_").replace(" ", "_").replace(",", "")

    def to_dict(self) -> dict[str, Any]:
        """The title and the rows, each with its normalised throughput."""
        return {
            "title": self.title,
            "rows": [{**row.to_dict(), "normalised": n} for row, n in zip(self.rows, self.normalised)],
        }

    def to_dataframe(self) -> pandas.DataFrame:
        """The rows as a pandas DataFrame, a column per CompareRow field and ``normalised`` (needs pandas)."""
        from nestplan.search.compare import to_dataframe

        frame = to_dataframe(self.rows)
        frame["normalised"] = self.normalised
        return frame

    def __repr__(self) -> str:
        planners = ", ".join(dict.fromkeys(row.planner for row in self.rows))
        return f"Comparison({short(self.title, 64)}: {len(self.rows)} rows, {short(planners, 48)})"


def paper_cases() -> list[CompareCase]:
    """The NEST paper's comparison (``search.compare.paper_grid``): Figure 5's grid, Figure 6's microbatch
    sweep, Table 7's small devices."""
    from nestplan.search.compare import paper_grid

    return [CompareCase(*case) for case in paper_grid()]


def compare(
    cases: Sequence[CompareCase],
    baselines: Sequence[str] = ("manual", "phaze", "mcmc", "alpa"),
    global_batch_size: int = DEFAULT_GLOBAL_BATCH,
    length: RunLength | None = None,
) -> list[Comparison]:
    """nestplan against baseline planners on each case, independent cases in parallel processes
    (one per core); each baseline runs once however often it is named. With ``length`` every row
    that has a plan has its run as well (on the case's cluster's facility)."""
    from nestplan.search.compare import check_baselines

    names = list(dict.fromkeys(check_baselines(baselines)))
    jobs = [(case, names, global_batch_size, length) for case in cases]
    if len(jobs) == 1:
        return [_compare_case(jobs[0])]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        return list(pool.map(_compare_case, jobs))


def _compare_case(args: tuple[CompareCase, list[str], int, RunLength | None]) -> Comparison:
    """One case of :func:`compare` (a top-level function, so that it runs in a worker process)."""
    from nestplan.search.compare import normalise, run_compare

    case, names, global_batch_size, length = args
    spec = resolve_model(case.model)
    whole = calibrated_cluster(resolve_cluster(case.cluster), case.framework, case.profile)
    job = job_for(spec, whole, global_batch_size, case.seq_len, framework=case.framework)

    def load(n: int) -> Cluster:
        cl = whole.truncate(n)
        if case.hbm_bytes is None:
            return cl
        return replace(cl, accelerator=replace(cl.accelerator, hbm_bytes=case.hbm_bytes, reserved_bytes=0.0))

    rows = run_compare(spec, load, job, case.devices, case.micro_batch_sizes, names, length=length)
    title = f"{spec.name} on {whole.name}"
    if case.hbm_bytes is not None:
        gib = case.hbm_bytes / GiB
        title += f" with {gib:g} GiB devices" if gib >= 1 else f" with {case.hbm_bytes / MiB:g} MiB devices"
    elif len(case.micro_batch_sizes) > 1:
        title += f" mbs {','.join(map(str, case.micro_batch_sizes))}"
    return Comparison(title, rows, normalise(rows))
