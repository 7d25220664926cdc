"""Resolving a call's inputs: a model and a cluster by name or as objects, a job with its run settings,
the search space a framework can run, the default batch and dtype, and dp in Megatron-LM's convention."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nestplan.cluster import Cluster, load_cluster
from nestplan.job import Job, Optimizer, default_fp8_recipe, make_job, preferred_dtype
from nestplan.model import ModelSpec, load_model
from nestplan.errors import ConfigError
from nestplan.export import EXPORT_FRAMEWORKS, FRAMEWORK_EXPORTS
from nestplan.settings import CpCommType, Fp8Recipe, Framework, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule
from nestplan.strategy.legality import check_against_accelerator, widest_a2a_group

if TYPE_CHECKING:  # imported where used: the CLI starts without the search, the exports and the sweep
    from nestplan.search.space import SearchSpace


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def resolve_cluster(cluster: str | Cluster, devices: int | None = None, gpus_per_domain: int | None = None) -> Cluster:
    """The cluster by name, path or as given; ``gpus_per_domain`` replaces its GPUs used per unit of the
    innermost level (``Cluster.gpus_per_domain``), then ``devices`` takes that many (``Cluster.truncate``)."""
    whole = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    if gpus_per_domain is not None:
        whole = replace(whole, gpus_per_domain=gpus_per_domain)
    return whole if devices is None else whole.truncate(devices)


def framework_settings(
    cluster: Cluster, *, fp8: bool = False, fp8_recipe: Fp8Recipe | None = None, **settings: Any
) -> dict[str, Any]:
    """Run settings by name (``settings.RunSettings``'s fields) as given, and an FP8 recipe when ``fp8``
    or ``fp8_recipe`` asks for one, by default the accelerator's (``job.default_fp8_recipe``)."""
    acc = cluster.accelerator
    if fp8_recipe is None and fp8:
        fp8_recipe = default_fp8_recipe(acc.peak_flops, acc.mx_block_scaling)
    return {"fp8_recipe": fp8_recipe, **settings}


def job_for(
    model: ModelSpec,
    cluster: Cluster,
    global_batch_size: int,
    seq_len: int | None,
    *,
    dtype: str | None = None,
    optimizer: Optimizer = Optimizer.ADAM,
    fp8: bool = False,
    dims: ParallelDims | None = None,
    **settings: Any,
) -> Job:
    """A Job for ``model`` on ``cluster``: ``dtype`` by default the accelerator's (``default_dtype``),
    its run settings by name in ``settings`` (each checked; an unknown name refused), the FP8 recipe
    as ``framework_settings`` resolves it, refused where the accelerator cannot run them
    (``strategy.legality.accelerator_conflict``). With the plan's ``dims``, a2a+p2p without its group size
    takes the widest inside an NVLink domain (``strategy.legality.widest_a2a_group``)."""
    hierarchical = dims is not None and settings.get("cp_comm_type") in (CpCommType.A2A_P2P, CpCommType.A2A_P2P.value)
    if hierarchical and settings.get("cp_a2a_size") is None:
        group = widest_a2a_group(model, dims.cp, dims.tp, cluster.topology.levels[0].size)
        settings = settings | ({"cp_a2a_size": group} if group is not None else {})
    run = RunSettings.from_mapping(framework_settings(cluster, fp8=fp8, **settings))
    check_against_accelerator(run, cluster.accelerator)
    return make_job(
        model, global_batch_size, seq_len, dtype=dtype or default_dtype(cluster), optimizer=optimizer, settings=run
    )


def default_dtype(cluster: Cluster) -> str:
    """bf16 where the cluster's accelerator has it, else fp16 (V100)."""
    return preferred_dtype(cluster.accelerator.peak_flops)


def megatron_dp(plan: ParallelDims, devices: int | None) -> ParallelDims | None:
    """``plan`` with its dp read in Megatron-LM's convention (dp counting the ep expert ranks) and
    converted to nestplan's (dp / ep), when only that reading fills ``devices``; None otherwise."""
    if devices is None or plan.ep == 1 or plan.devices == devices or plan.dp % plan.ep:
        return None
    if plan.tp * plan.cp * plan.pp * plan.dp != devices:
        return None
    return replace(plan, dp=plan.dp // plan.ep)


DEFAULT_GLOBAL_BATCH = 4096  # the NEST paper's evaluation (section 5.1)


def export_framework(export: str, given: object = None) -> Framework:
    """The framework ``export`` runs, which its plan is costed for; a ``--framework`` given that differs
    is refused (the export would launch other software than the one costed)."""
    from nestplan.export import check_framework

    runs = EXPORT_FRAMEWORKS[check_framework(export)]
    if given is not None and Framework(given) is not runs:
        raise ConfigError(
            f"--framework {Framework(given).value} but --export {export} runs {runs.value}: a plan is costed for "
            "the software its export launches",
            field="framework",
            value=Framework(given).value,
            limit=runs.value,
        )
    return runs


def check_exportable(model: str | ModelSpec, framework: str) -> None:
    """Raise the one-line ConfigError ``framework``'s export would give for a model it cannot build,
    so that ``plan --export`` refuses before it searches."""
    from nestplan.export import check_framework, check_model

    check_model(check_framework(framework), resolve_model(model))


def search_space(
    *,
    schedules: Sequence[Schedule] | None = None,
    cp_comm_types: Sequence[CpCommType] | None = None,
    export: str | None = None,
    memory_margin: float | None = None,
    expert_tp: Sequence[int | None] | None = None,
    moe_comm_overlap: bool = True,
    model: ModelSpec | None = None,
    framework: Framework | None = None,
) -> SearchSpace:
    """The full search space, its pipeline schedules narrowed to ``schedules``, its context-parallel
    exchanges to ``cp_comm_types`` and its expert tensor parallelism to ``expert_tp`` (None: all; an
    entry None is etp = tp), each also to those the ``export`` framework runs as costed, and the MoE
    all-to-all overlap tried where ``moe_comm_overlap`` and the framework allow (for ``model``, which an
    ``export`` needs); without an export, to what ``framework`` runs: as its export would, or for plain FSDP
    data parallelism alone (search/space.py ``FSDP_SPACE``); Megatron-LM, the default framework, is not
    narrowed (every schedule and exchange nestplan costs; ``export="megatron"`` narrows to what it runs). 1F1B, the schedule
    the search ranks splits under, is always in. ``memory_margin``: the fraction of device
    memory plans leave free (None: search/space.py DEFAULT_MEMORY_MARGIN)."""
    from nestplan.export import (
        check_framework,
        framework_cp_comm,
        framework_expert_tp,
        framework_moe_overlap,
        framework_schedules,
        framework_search_limits,
    )
    from nestplan.search.space import DEFAULT_MEMORY_MARGIN, FSDP_SPACE, SearchSpace

    # Megatron-LM, the default, searches everything nestplan costs (its export narrows: --export megatron)
    narrowed = export is None and framework not in (None, Framework.MEGATRON)
    runs_as = FRAMEWORK_EXPORTS.get(framework) if narrowed else None
    if runs_as is not None and model is not None:
        export = runs_as
    chosen = tuple(schedules) if schedules is not None else tuple(Schedule)
    kinds = tuple(cp_comm_types) if cp_comm_types is not None else tuple(CpCommType)
    etps = tuple(expert_tp) if expert_tp is not None else SearchSpace().etp
    limits: dict[str, object] = {}
    if export is not None:
        key = check_framework(export)
        chosen = tuple(s for s in chosen if s in framework_schedules(key))
        kinds = tuple(k for k in kinds if k in framework_cp_comm(key)) or framework_cp_comm(key)
        runs = framework_expert_tp(key)
        if runs is not None:
            etps = tuple(e for e in etps if e in runs) or runs
        assert model is not None, "an export's search space depends on the model"
        moe_comm_overlap = moe_comm_overlap and framework_moe_overlap(key, model)
        limits = framework_search_limits(key)
    space = SearchSpace(
        schedules=(Schedule.ONE_F_ONE_B,) + tuple(s for s in chosen if s is not Schedule.ONE_F_ONE_B),
        cp_comm_types=kinds,
        etp=etps,
        moe_comm_overlap=moe_comm_overlap,
        memory_margin=DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin,
        **limits,
    )
    return replace(space, **FSDP_SPACE) if framework is Framework.FSDP else space
