"""The exact evaluator: step time, its breakdown and memory per device of one plan."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Sequence

from nestplan.cost import comm
from nestplan.cost.memory import ShardGroups, in_flight_microbatches, model_state_bytes, stage_memory
from nestplan.cost.pipeline import pipeline_time
from nestplan.cost.prediction import BREAKDOWN_TERMS, Prediction, StageCost
from nestplan.cost.stepend import SyncContext, step_end, tied_embedding_sync
from nestplan.cost.terms import GraphTerms, graph_terms, shard_of
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.strategy.dims import ParallelDims, check_against_model
from nestplan.strategy.enums import Recompute
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER, place

if TYPE_CHECKING:
    from nestplan.cluster import Cluster


def _add(total: dict[str, float], part) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value


def _stage_compute(model, terms: GraphTerms, pp: int, first: int, last: int, stage: int
                   ) -> tuple[dict, float, float, L.ParamCount, float]:
    """Per-microbatch components and forward part (no pipeline transfers), activation bytes,
    params, transient bytes."""
    comp: dict[str, float] = {k: 0.0 for k in BREAKDOWN_TERMS}
    acts, fwd, params, transient = 0.0, 0.0, L.ParamCount(), 0.0
    nodes = [terms.blocks[model.is_moe_layer(i)] for i in range(first, last + 1)]
    if stage == 0:
        nodes.append(terms.embedding)
    if stage == pp - 1:
        nodes.append(terms.head)
        if pp > 1:
            params = params + terms.tied_head_copy
    for node in nodes:
        _add(comp, node.components)
        acts += node.activations
        fwd += node.forward
        params = params + node.params
        transient = max(transient, node.transient)
    return comp, fwd, acts, params, transient


def _model_flops(model: ModelSpec, job: Job, recompute: Recompute) -> tuple[float, float]:
    """(model, hardware) FLOPs of one step: 3x forward (Narayanan et al. SC'21 eq. 3), plus recomputation."""
    seq = job.seq_len
    fwd = sum(L.block_model_flops(model, i, seq, seq) for i in range(model.num_layers))
    fwd += L.head_model_flops(model, seq)
    model_flops = 3.0 * fwd * job.global_batch_size
    if recompute is Recompute.FULL:
        extra = fwd - L.head_model_flops(model, seq)
    elif recompute is Recompute.SELECTIVE:
        extra = model.num_layers * 4.0 * seq * seq * model.q_channels
    else:
        extra = 0.0
    return model_flops, model_flops + extra * job.global_batch_size


def evaluate_plan(model: ModelSpec, cluster: Cluster, dims: ParallelDims, job: Job,
                  axis_order: Sequence[str] = DEFAULT_AXIS_ORDER) -> Prediction:
    """Predict one plan. A plan that does not fit is still evaluated; ``Prediction.fits`` says so."""
    check_against_model(dims, model, job.seq_len)
    if dims.devices > cluster.devices:
        raise ConfigError(f"the plan needs {dims.devices} devices but cluster '{cluster.name}' has {cluster.devices}",
                          field="devices", value=dims.devices, limit=cluster.devices)
    m = dims.num_microbatches(job.global_batch_size)
    placement = place(dims, cluster.topology, axis_order)
    terms = graph_terms(model, cluster, dims, job, placement.groups)
    return _assemble(model, cluster, dims, job, placement, terms, m)


def _boundary_times(model, cluster, dims, job, placement) -> list[float]:
    shard = shard_of(dims, job)
    return [comm.boundary_time(cluster.topology, model, shard, lv) for lv in placement.pp_boundary_levels]


def _assemble(model, cluster, dims, job, placement, terms: GraphTerms, m) -> Prediction:
    bounds = _boundary_times(model, cluster, dims, job, placement)
    wrap = max(bounds, default=0.0)   # interleaved chunks also pass from the last stage back to the first
    v = dims.virtual_stages
    shard_groups = ShardGroups(dense=placement.groups["cp+ep+dp"].size, expert=placement.groups["cp+dp"].size)
    stages: list[StageCost] = []
    first = 0
    pieces, forward = [], []
    for i, n_layers in enumerate(dims.stage_layers(model.num_layers)):
        last = first + n_layers - 1
        comp, fwd, acts, params, transient = _stage_compute(model, terms, dims.pp, first, last, i)
        prev = bounds[i - 1] if i > 0 else (wrap if v > 1 else 0.0)
        nxt = bounds[i] if i < dims.pp - 1 else (wrap if v > 1 else 0.0)
        comp["pp_comm"] = v * (prev + nxt)
        pieces.append((first, last, comp, acts, params, transient))
        forward.append(fwd + v * nxt)   # a stage sends its outputs forward, its input gradients back
        first = last + 1
    cycles = [sum(p[2].values()) for p in pieces]
    pipe_s, bubble_s, slowest = pipeline_time(forward, [c - f for c, f in zip(cycles, forward)], m,
                                              dims.schedule, v)
    ctx = SyncContext(cluster.topology, cluster.accelerator, job, dims.zero,
                      placement.groups["cp+ep+dp"], placement.groups["cp+dp"])
    backward = [p[2]["backward_compute"] + p[2]["recompute"] for p in pieces]
    end = step_end(ctx, [p[4] for p in pieces], [p[2]["forward_compute"] for p in pieces], backward, bounds)
    for i, (first, last, comp, acts, params, transient) in enumerate(pieces):
        states = model_state_bytes(params, shard_groups, dims.zero, job.dtype_bytes, job.grad_bytes,
                                   job.optimizer_state_bytes)
        in_flight = in_flight_microbatches(dims.schedule, i, dims.pp, m, v)
        memory = stage_memory(states, acts, in_flight, transient, cluster.accelerator.reserved_bytes)
        stages.append(StageCost(
            index=i, first_layer=first, last_layer=last, has_embedding=i == 0, has_head=i == dims.pp - 1,
            devices=dims.stage_devices, forward_s=forward[i], backward_s=cycles[i] - forward[i], cycle_s=cycles[i],
            components_s=MappingProxyType(dict(comp)), memory_bytes=MappingProxyType(memory)))
    tied = tied_embedding_sync(model, cluster.topology, dims.tp, job, placement.pp_boundary_levels)
    breakdown = {k: m * v_ for k, v_ in pieces[slowest][2].items()}
    breakdown["pipeline_bubble"] = bubble_s
    breakdown["dp_sync"] = end.exposed_s + tied
    breakdown["optimizer"] = end.optimizer_s
    step = pipe_s + end.exposed_s + tied + end.optimizer_s
    assert abs(sum(breakdown.values()) - step) <= 1e-9 * step
    model_flops, hw_flops = _model_flops(model, job, dims.recompute)
    pred = Prediction(
        step_time_s=step, breakdown_s=MappingProxyType(breakdown), tokens_per_s=job.tokens_per_step / step,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops, devices_used=dims.devices,
        peak_flops_per_device=cluster.accelerator.peak(job.dtype),
        memory_capacity_bytes=cluster.accelerator.hbm_bytes, num_microbatches=m,
        stages=tuple(stages), bottleneck_stage=slowest, plan=dims, placement=placement)
    return pred
