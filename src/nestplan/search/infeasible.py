"""Explaining a job that fits nowhere: the leanest plan's memory and what would make it fit."""

from __future__ import annotations

import math

from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.errors import InfeasibleError
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.strategy.placement import REPLICA_MAJOR
from nestplan.search.space import SearchSpace, even_split, sub_configs
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, ZeroStage
from nestplan.units import GiB


def leanest(model: ModelSpec, cluster: Cluster, job: Job, devices: int, space: SearchSpace) -> Prediction | None:
    """The plan of the space with the least memory per device: widest stages, deepest pipeline,
    full recomputation, the highest ZeRO stage, microbatch 1."""
    topo = cluster.topology
    units = tuple(topo.unit_devices(i) for i in range(topo.num_levels))
    lean = None
    for cfg, order in sub_configs(space, model, job, topo.levels[0].size, devices, units):
        if cfg.micro_batch_size != min(space.micro_batch_sizes) or order != REPLICA_MAJOR:
            continue
        pp = min(model.num_layers, devices // cfg.stage_devices)
        dims = ParallelDims(
            tp=cfg.tp,
            pp=pp,
            dp=1,
            cp=cfg.cp,
            ep=cfg.ep,
            sp=cfg.sp,
            zero=max(space.zero),
            recompute=Recompute.FULL if Recompute.FULL in space.recompute else max(space.recompute),
            micro_batch_size=cfg.micro_batch_size,
            layers_per_stage=even_split(model.num_layers, pp),
        )
        pred = evaluate_plan(model, cluster, dims, job, order)  # legal: sub_configs yields legal values only
        if lean is None or pred.peak_memory_bytes_per_device < lean.peak_memory_bytes_per_device:
            lean = pred
    return lean


def infeasible_error(model: ModelSpec, cluster: Cluster, job: Job, devices: int, space: SearchSpace) -> InfeasibleError:
    lean = leanest(model, cluster, job, devices, space)
    if lean is None:
        return InfeasibleError(
            f"no legal plan for {model.name} on {devices} devices of {cluster.name}", field="devices", value=devices
        )
    mem = dict(lean.memory_breakdown_bytes)
    cap = space.capacity_bytes(lean.memory_capacity_bytes)
    excess = max(0.0, lean.peak_memory_bytes_per_device - cap)
    kept = (
        f" (the {space.memory_margin:.0%} margin kept free of {lean.memory_capacity_bytes / GiB:.2f} GiB)"
        if space.memory_margin
        else ""
    )
    largest = max(mem, key=mem.get)
    d = lean.plan
    scalable = sum(mem[k] for k in ("weights", "gradients", "optimizer"))
    fixed = mem["reserved"] + mem["transient"] + mem["activations"]
    need = math.ceil(devices * scalable / max(cap - fixed, 1.0)) if cap > fixed else None
    fixes = []
    if need is not None:
        fixes.append(f"about {need} devices (model state shrinks with more devices)")
    else:
        fixes.append(
            "activations and buffers alone exceed the device: a shorter sequence "
            f"(now {job.seq_len}) or more context parallelism"
        )
    if d.zero < ZeroStage.PARAMETERS:
        fixes.append("a higher ZeRO stage")
    if d.recompute is not Recompute.FULL:
        fixes.append("full recomputation")
    fixes.append("an accelerator with more memory")
    gib = {k: f"{v / GiB:.2f}" for k, v in mem.items()}
    message = (
        f"no plan fits: the leanest (tp {d.tp}, cp {d.cp}, ep {d.ep}, pp {d.pp}, dp {d.dp}, ZeRO {int(d.zero)}, "
        f"recompute {d.recompute.value}, microbatch {d.micro_batch_size}) needs "
        f"{lean.peak_memory_bytes_per_device / GiB:.2f} GiB per device, {excess / GiB:.2f} GiB "
        f"over the {cap / GiB:.2f} GiB of {cluster.accelerator.name}{kept}; largest term: {largest} {gib[largest]} GiB; "
        f"breakdown (GiB): "
        + ", ".join(f"{k} {v}" for k, v in gib.items())
        + "; would fit with: "
        + "; or ".join(fixes)
    )
    return InfeasibleError(
        message,
        field="memory",
        value=lean.peak_memory_bytes_per_device,
        limit=cap,
        unit="B",
        details={"memory_breakdown_bytes": mem, "largest_term": largest, "excess_bytes": excess, "fixes": fixes},
    )
