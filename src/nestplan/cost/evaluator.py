"""The exact evaluator: step time, its breakdown and memory per device of one plan."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Sequence

from nestplan.cost import comm
from nestplan.cost.memory import ShardGroups, in_flight_microbatches, model_state_bytes, stage_memory
from nestplan.cost.pipeline import pipeline_time
from nestplan.cost.prediction import BREAKDOWN_TERMS, Prediction, StageCost
from nestplan.cost.terms import GraphTerms, graph_terms, shard_of
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.network import collectives as coll
from nestplan.strategy.dims import ParallelDims, check_against_model
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER, Placement, place

if TYPE_CHECKING:
    from nestplan.cluster import Cluster

# bytes an optimizer step moves per parameter (Adam: read master, m, v, grad; write master, m, v, weight)
OPTIMIZER_TRAFFIC_BYTES = {12: 4 * 4 + 3 * 4 + 2, 4: 2 * 4 + 4 + 2}


def _add(total: dict[str, float], part, times: float = 1.0) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value * times


def _stage_compute(model, terms: GraphTerms, pp: int, first: int, last: int, stage: int
                   ) -> tuple[dict, float, L.ParamCount, float]:
    """Per-microbatch components (no pipeline transfers), activation bytes, params, transient bytes."""
    comp: dict[str, float] = {k: 0.0 for k in BREAKDOWN_TERMS}
    acts, params, transient = 0.0, L.ParamCount(), 0.0
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
        params = params + node.params
        transient = max(transient, node.transient)
    return comp, acts, params, transient


def _tied_embedding_sync(model, cluster, dims, job, placement) -> float:
    """Megatron all-reduces the embedding and output-layer gradients between the first and last stage."""
    if not model.tied_embeddings or dims.pp == 1:
        return 0.0
    level = max(placement.pp_boundary_levels)
    fan = tuple(2 if i == level else 1 for i in range(cluster.topology.num_levels))
    return coll.all_reduce(cluster.topology, fan, model.vocab_size * model.hidden_size / dims.tp * job.grad_bytes)


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


def _stage_sync(cluster, dims, job, placement, params: L.ParamCount) -> float:
    """End-of-step data-parallel synchronisation of one stage (dense and expert gradients)."""
    topo, zero = cluster.topology, int(dims.zero)
    total = 0.0
    for key, count in (("cp+ep+dp", params.dense), ("cp+dp", params.expert)):
        group = placement.groups[key]
        total += comm.grad_sync_time(topo, group, count * job.grad_bytes, count * job.dtype_bytes, zero)
    return total


def _stage_gather(cluster, dims, job, placement, params: L.ParamCount) -> float:
    topo, zero = cluster.topology, int(dims.zero)
    return sum(comm.param_gather_time(topo, placement.groups[key], count * job.dtype_bytes, zero)
               for key, count in (("cp+ep+dp", params.dense), ("cp+dp", params.expert)))


def _assemble(model, cluster, dims, job, placement, terms: GraphTerms, m) -> Prediction:
    bounds = _boundary_times(model, cluster, dims, job, placement)
    wrap = max(bounds, default=0.0)   # interleaved chunks also pass from the last stage back to the first
    v = dims.virtual_stages
    shard_groups = ShardGroups(dense=placement.groups["cp+ep+dp"].size, expert=placement.groups["cp+dp"].size)
    stages: list[StageCost] = []
    first = 0
    pieces = []
    for i, n_layers in enumerate(dims.stage_layers(model.num_layers)):
        last = first + n_layers - 1
        comp, acts, params, transient = _stage_compute(model, terms, dims.pp, first, last, i)
        prev = bounds[i - 1] if i > 0 else (wrap if v > 1 else 0.0)
        nxt = bounds[i] if i < dims.pp - 1 else (wrap if v > 1 else 0.0)
        comp["pp_comm"] = v * (prev + nxt)
        pieces.append((first, last, comp, acts, params, transient))
        first = last + 1
    cycles = [sum(p[2].values()) for p in pieces]
    pipe_s, bubble_s, slowest = pipeline_time(cycles, m, v)
    drain = 0.0
    opt_bytes = OPTIMIZER_TRAFFIC_BYTES[job.optimizer_state_bytes]
    exposed_max, optimizer_s = 0.0, 0.0
    for i, (first, last, comp, acts, params, transient) in enumerate(pieces):
        states = model_state_bytes(params, shard_groups, dims.zero, job.dtype_bytes, job.grad_bytes,
                                   job.optimizer_state_bytes)
        in_flight = in_flight_microbatches(dims.schedule, i, dims.pp, m, v)
        memory = stage_memory(states, acts, in_flight, transient, cluster.accelerator.reserved_bytes)
        backward = comp["backward_compute"] + comp["recompute"]
        sync = _stage_sync(cluster, dims, job, placement, params)
        window = backward + drain   # buckets overlap the last backward, and the drain of earlier stages
        exposed = max(0.0, sync - window)
        exposed += max(0.0, _stage_gather(cluster, dims, job, placement, params) - comp["forward_compute"])
        exposed_max = max(exposed_max, exposed)
        drain += backward + (bounds[i] if i < len(bounds) else 0.0)
        sharded = params.total if dims.zero is ZeroStage.NONE else (
            params.dense / shard_groups.dense + params.expert / shard_groups.expert)
        optimizer_s = max(optimizer_s, cluster.accelerator.memory_time(sharded * opt_bytes))
        stages.append(StageCost(
            index=i, first_layer=first, last_layer=last, has_embedding=i == 0, has_head=i == dims.pp - 1,
            devices=dims.stage_devices, forward_s=comp["forward_compute"] + comp["tp_comm"] / 2,
            backward_s=backward + comp["tp_comm"] / 2, cycle_s=cycles[i],
            components_s=MappingProxyType(dict(comp)), memory_bytes=MappingProxyType(memory),
            dp_sync_s=sync, dp_exposed_s=exposed))
    tied = _tied_embedding_sync(model, cluster, dims, job, placement)
    breakdown = {k: m * v_ for k, v_ in pieces[slowest][2].items()}
    breakdown["pipeline_bubble"] = bubble_s
    breakdown["dp_sync"] = exposed_max + tied
    breakdown["optimizer"] = optimizer_s
    step = pipe_s + exposed_max + tied + optimizer_s
    assert abs(sum(breakdown.values()) - step) <= 1e-9 * step
    model_flops, hw_flops = _model_flops(model, job, dims.recompute)
    pred = Prediction(
        step_time_s=step, breakdown_s=MappingProxyType(breakdown), tokens_per_s=job.tokens_per_step / step,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops, devices_used=dims.devices,
        peak_flops_per_device=cluster.accelerator.peak(job.dtype),
        memory_capacity_bytes=cluster.accelerator.hbm_bytes, num_microbatches=m,
        stages=tuple(stages), bottleneck_stage=slowest, plan=dims, placement=placement)
    return pred
