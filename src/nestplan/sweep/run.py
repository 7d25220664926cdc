"""Running a sweep: inputs built once, cases solved on local processes or a Ray cluster,
each result committed by the driver as it arrives.

The driver resolves every distinct model (ModelSpec) and cluster variant (Cluster, with its
accelerator and network) once and ships those objects to the workers: with Ray they are put
in the object store once and shared by reference. A case that fails (bad variant, nothing
fits, any exception) is recorded with its error and the sweep goes on; a worker process that
dies is replaced and its case retried (up to MAX_ATTEMPTS). A local worker exits by itself
within a second of its driver's death (even ``kill -9`` of the driver alone), so no worker is
left behind waiting for cases that will never come.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nestplan.cluster import Cluster, cluster_data, cluster_from_dict
from nestplan.cost.prediction import Prediction
from nestplan.cost.run import RunLength, predicted_run
from nestplan.errors import ConfigError, InfeasibleError, PlannerError
from nestplan.hardware.facility import with_overrides
from nestplan.job import Job, make_job, preferred_dtype
from nestplan.model import ModelSpec, load_model
from nestplan.plan.run import run_figures
from nestplan.report.plan_json import SearchStats, plan_to_dict
from nestplan.search.planner import plan_job
from nestplan.profile import calibrated_cluster
from nestplan.search.space import FSDP_SPACE, SearchSpace
from nestplan.settings import Framework, RunSettings
from nestplan.sweep.spec import Case, SweepSpec, expand
from nestplan.sweep.store import Store
from nestplan.units import GiB_to_bytes, bytes_to_GiB

MAX_ATTEMPTS = 3
PARENT_CHECK_S = 1.0  # how often a local worker checks that its driver is alive


@dataclass(frozen=True)
class SweepSummary:
    total: int
    skipped: int  # already in the store
    finished: int  # solved now (ok, infeasible or error)
    failed: int  # of those, status error
    elapsed_s: float
    store: Path


def build_cluster(case: Case) -> Cluster:
    """The case's cluster variant: the base's table with the level overrides, validated as a file is."""
    data = copy.deepcopy(cluster_data(case.cluster_base))
    levels = {lv.get("name"): lv for lv in data.get("levels", [])}
    for name, value in case.overrides:
        level, _, field = name.partition(".")
        if level not in levels:
            raise ConfigError(
                f"cluster '{case.cluster_base}' has no level '{level}' (override '{name}'); "
                f"levels: {', '.join(map(str, levels))}",
                field=name,
                value=level,
                limit=list(levels),
            )
        levels[level][field] = value
    data["name"] = case.cluster_label
    if case.accelerator is not None:
        data["accelerator"] = case.accelerator
    cluster = cluster_from_dict(data, origin=case.cluster_label)
    if case.hbm_GiB is not None:
        hbm, reserved = GiB_to_bytes(case.hbm_GiB), cluster.accelerator.reserved_bytes
        if hbm <= reserved:
            raise ConfigError(
                f"sweep spec: hbm_GiB {case.hbm_GiB:g} is not above the {reserved / GiB_to_bytes(1):g} GiB "
                f"{cluster.accelerator.name} reserves for the framework",
                field="hbm_GiB",
                value=case.hbm_GiB,
                limit=f"> {reserved / GiB_to_bytes(1):g}",
                unit="GiB",
            )
        cluster = replace(cluster, accelerator=replace(cluster.accelerator, hbm_bytes=hbm))
    prices = {k: v for k, v in case.run if k.startswith("price_")}
    return replace(cluster, facility=with_overrides(cluster.facility, prices)) if prices else cluster


def solve(inputs: dict[str, Any], model: ModelSpec, cluster: Cluster) -> dict[str, Any]:
    """Plan one case (runs in a worker). Never raises: failures become status and error."""
    start = time.perf_counter()
    try:
        cl = cluster.truncate(inputs["devices"]) if inputs["devices"] <= cluster.devices else None
        if cl is None:
            raise PlannerError(
                f"cluster variant has {cluster.devices} devices, fewer than the {inputs['devices']} asked"
            )
        framework = Framework(inputs.get("framework", Framework.MEGATRON))
        cl = calibrated_cluster(cl, framework)
        settings = RunSettings.from_mapping({"framework": framework.value})
        dtype = preferred_dtype(cl.accelerator.peak_flops)
        job = make_job(model, inputs["global_batch_size"], inputs["seq_len"], dtype=dtype, settings=settings)
        best, job, data = best_plan(model, cl, job)
        details = _details(data, inputs.get("keep", ()))
        if framework is not Framework.MEGATRON:  # the report names the software a case ran on
            details = (details or {}) | {"framework": framework.value}
        if "run" in inputs:
            length = RunLength(tokens=inputs["run"].get("tokens"), steps=inputs["run"].get("steps"))
            details = (details or {}) | {"run": run_figures(predicted_run(best, job, cl, length))}
        out = {
            "status": "ok",
            "tokens_per_s": best.tokens_per_s,
            "tokens_per_s_per_device": best.tokens_per_s / inputs["devices"],
            "step_time_s": best.step_time_s,
            "mfu": best.mfu,
            "peak_memory_GiB": bytes_to_GiB(best.peak_memory_bytes_per_device),
            "plan": data["parallel"],
            "error": None,
            "details": details,
        }
    except InfeasibleError as exc:
        out = {"status": "infeasible", "error": str(exc)}
    except PlannerError as exc:
        out = {"status": "error", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 (a sweep records every failure and goes on)
        out = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    out["solve_time_s"] = time.perf_counter() - start
    return out


def best_plan(model: ModelSpec, cluster: Cluster, job: Job) -> tuple[Prediction, Job, dict[str, Any]]:
    """The best plan of ``nestplan plan``'s search on all of ``cluster``, the job it was planned for and its
    plan JSON object; an InfeasibleError explaining the leanest plan's memory when nothing fits. Plain FSDP
    searches data parallelism alone (search/space.py FSDP_SPACE); the other frameworks the whole space."""
    space = replace(SearchSpace(), **FSDP_SPACE) if job.settings.framework is Framework.FSDP else SearchSpace()
    result = plan_job(model, cluster, job, space, top=0)
    stats = SearchStats(result.stats.solve_time_s, result.stats.candidates, result.stats.pruned_memory)
    return (
        result.best,
        result.job,
        plan_to_dict(
            result.best,
            model=model.name,
            cluster=cluster.name,
            devices_total=cluster.devices,
            job=result.job,
            level_names=[lv.name for lv in cluster.topology.levels],
            search=stats,
        ),
    )


def _details(data: dict[str, Any], keep: tuple[str, ...]) -> dict[str, Any] | None:
    """The parts of the plan JSON a spec asks to keep."""
    pick = {
        "breakdown": lambda: data["prediction"]["breakdown_s"],
        "memory": lambda: data["prediction"]["memory_breakdown_bytes"],
        "stages": lambda: data["stages"],
        "placement": lambda: data["placement"],
    }
    return {k: pick[k]() for k in keep} or None


def _inputs(cases: list[Case]) -> tuple[dict[str, ModelSpec], dict[tuple, Cluster]]:
    """Every distinct model and cluster variant, built once; a bad one is a bad spec (ConfigError)."""
    models: dict[str, ModelSpec] = {}
    clusters: dict[tuple, Cluster] = {}
    for c in cases:
        if c.model not in models:
            models[c.model] = load_model(c.model)
        if _cluster_key(c) not in clusters:
            try:
                clusters[_cluster_key(c)] = build_cluster(c)
            except PlannerError as exc:
                raise ConfigError(
                    f"sweep spec: cluster '{c.cluster_label}' with {dict(c.overrides)}: {exc}",
                    field="clusters",
                    value=dict(c.overrides),
                ) from None
    return models, clusters


def _cluster_key(c: Case) -> tuple:
    return (c.cluster_base, c.cluster_label, c.accelerator, c.overrides, c.hbm_GiB, c.run)


def run_sweep(
    spec: SweepSpec,
    out_dir: Path,
    workers: int = 2,
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepSummary:
    """Solve every case of the spec not yet in out_dir/results.sqlite."""
    start = time.perf_counter()
    cases = expand(spec)
    models, clusters = _inputs(cases)  # before anything is written: a bad spec leaves no trace
    store = Store(Path(out_dir) / "results.sqlite")
    counts = {"todo": 0, "finished": 0, "failed": 0}

    def record(inputs: dict, result: dict) -> None:
        if store.put(inputs, result):
            counts["finished"] += 1
            counts["failed"] += result["status"] == "error"
        if progress is not None:
            progress(counts["finished"], counts["todo"])

    try:
        store.check_writable()  # a read-only store fails before any case is solved
        done = store.keys()
        jobs = [
            (dict(c.inputs(), key=c.key, keep=spec.keep), models[c.model], clusters[_cluster_key(c)])
            for c in cases
            if c.key not in done
        ]
        counts["todo"] = len(jobs)
        if ray_address is not None:
            from nestplan.sweep.ray_executor import run_on_ray

            run_on_ray(jobs, ray_address, solve, record)
        else:
            _run_local(jobs, workers, record)
    finally:
        store.close()
    return SweepSummary(
        len(cases),
        len(cases) - counts["todo"],
        counts["finished"],
        counts["failed"],
        time.perf_counter() - start,
        store.path,
    )


def _run_local(jobs: list[tuple], workers: int, record: Callable[[dict, dict], None]) -> None:
    """Local processes; a pool broken by a dying worker is replaced and its cases retried."""
    if workers <= 1:
        for inputs, model, cluster in jobs:
            record(inputs, solve(inputs, model, cluster))
        return
    pending = {inputs["key"]: (inputs, model, cluster) for inputs, model, cluster in jobs}
    attempts = dict.fromkeys(pending, 0)
    while pending:
        pool = cf.ProcessPoolExecutor(max_workers=workers, initializer=exit_with_parent, initargs=(os.getpid(),))
        try:
            futures = {pool.submit(solve, *job): key for key, job in pending.items()}
            for fut in cf.as_completed(futures):
                key = futures[fut]
                record(pending[key][0], fut.result())
                del pending[key]
        except cf.process.BrokenProcessPool:
            for key in pending:
                attempts[key] += 1
            for key in [k for k, n in attempts.items() if k in pending and n >= MAX_ATTEMPTS]:
                record(pending.pop(key)[0], {"status": "error", "error": "worker process died", "solve_time_s": 0.0})
        finally:
            pool.shutdown(cancel_futures=True)  # a driver that stops (a full disk) waits only for running cases


def exit_with_parent(parent_pid: int) -> None:
    """Worker initializer: a daemon thread ends this process once its driver is gone (its parent changes)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="nestplan-exit-with-parent", daemon=True).start()
