"""The exact evaluator: step time, its breakdown and memory per device of one plan."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Sequence

from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from nestplan.cluster import Cluster
from nestplan.cost import comm
from nestplan.cost.compute import LayerTime, block_time, embedding_time, head_time
from nestplan.cost.memory import ShardGroups, in_flight_microbatches, model_state_bytes, stage_memory
from nestplan.cost.pipeline import pipeline_time
from nestplan.cost.prediction import BREAKDOWN_TERMS, Prediction, StageCost
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.network import collectives as coll
from nestplan.strategy.dims import ParallelDims, check_against_model
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER, Placement, place

# bytes an optimizer step moves per parameter (Adam: read master, m, v, grad; write master, m, v, weight)
OPTIMIZER_TRAFFIC_BYTES = {12: 4 * 4 + 3 * 4 + 2, 4: 2 * 4 + 4 + 2}


@dataclass(frozen=True)
class BlockProfile:
    """Everything the evaluator needs of one kind of transformer block (dense or MoE)."""

    time: LayerTime
    comm: comm.LayerComm
    params: L.ParamCount
    activations: float        # stored per microbatch under the plan's recomputation
    activations_full: float   # stored without recomputation (the transient peak when recomputing)
    zero3: tuple[float, float]


def _shard(dims: ParallelDims, job: Job) -> L.Shard:
    return L.Shard(tp=dims.tp, sp=dims.sp_active, cp=dims.cp, ep=dims.ep, micro_batch=dims.micro_batch_size,
                   seq_len=job.seq_len, dtype_bytes=job.dtype_bytes, flash=job.flash_attention)


def _profile(model: ModelSpec, cluster: Cluster, dims: ParallelDims, job: Job, placement: Placement,
             layer: int) -> BlockProfile:
    shard = _shard(dims, job)
    acc, topo = cluster.accelerator, cluster.topology
    t = block_time(acc, model, layer, shard, job.dtype)
    c = comm.block_comm(topo, model, layer, shard, placement.groups, t.attention_forward)
    params = L.block_params_per_device(model, layer, shard)
    rc = L.Recomputation(dims.recompute.value)
    zero3 = (0.0, 0.0)
    if dims.zero is ZeroStage.PARAMETERS:
        dense_g, expert_g = placement.groups["cp+ep+dp"], placement.groups["cp+dp"]
        zf, zb = comm.zero3_layer_time(topo, dense_g, params.dense * job.dtype_bytes, params.dense * job.grad_bytes)
        ef, eb = comm.zero3_layer_time(topo, expert_g, params.expert * job.dtype_bytes, params.expert * job.grad_bytes)
        zero3 = (max(0.0, zf + ef - t.forward), max(0.0, zb + eb - t.backward))
    return BlockProfile(
        time=t, comm=c, params=params,
        activations=L.block_activation_bytes(model, layer, shard, rc),
        activations_full=L.block_activation_bytes(model, layer, shard, L.Recomputation.NONE),
        zero3=zero3,
    )


def _block_components(p: BlockProfile, recompute: Recompute) -> dict[str, float]:
    c = p.comm
    if recompute is Recompute.FULL:
        redo = p.time.forward + c.tp_forward + c.cp_forward + c.ep_forward
    elif recompute is Recompute.SELECTIVE:
        redo = p.time.attention_forward
    else:
        redo = 0.0
    return {
        "forward_compute": p.time.forward, "backward_compute": p.time.backward, "recompute": redo,
        "tp_comm": c.tp_forward + c.tp_backward, "cp_comm": c.cp_forward + c.cp_backward,
        "ep_comm": c.ep_forward + c.ep_backward, "zero_comm": p.zero3[0] + p.zero3[1],
    }


def _add(total: dict[str, float], part: dict[str, float], times: float = 1.0) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + value * times


def _stage_compute(model, cluster, dims, job, placement, profiles, first, last, stage) -> tuple[dict, float, L.ParamCount, float]:
    """Per-microbatch components (no pipeline transfers), activation bytes, params, transient bytes."""
    shard = _shard(dims, job)
    acc, topo = cluster.accelerator, cluster.topology
    comp: dict[str, float] = {k: 0.0 for k in BREAKDOWN_TERMS}
    acts, params, transient = 0.0, L.ParamCount(), 0.0
    for layer in range(first, last + 1):
        prof = profiles[model.is_moe_layer(layer)]
        _add(comp, _block_components(prof, dims.recompute))
        acts += prof.activations
        params = params + prof.params
        if dims.recompute is Recompute.FULL:
            transient = max(transient, prof.activations_full)
    if dims.zero is ZeroStage.PARAMETERS:
        biggest = max(profiles[model.is_moe_layer(i)].params.total for i in range(first, last + 1))
        transient += 2 * biggest * job.dtype_bytes   # the gathered layer and the prefetched next one
    tp_sync = comm.tp_collectives(topo, placement.groups["tp"], shard, model.hidden_size, 1)
    if stage == 0:
        e = embedding_time(acc, model, shard)
        _add(comp, {"forward_compute": e.forward, "backward_compute": e.backward, "tp_comm": tp_sync})
        acts += L.embedding_activation_bytes(model, shard)
        positions = model.max_position_embeddings if model.learned_position_embeddings else 0
        vocab_rows = model.vocab_size / dims.tp + positions + model.type_vocab_size
        params = params + L.ParamCount(dense=vocab_rows * model.hidden_size)
    if stage == dims.pp - 1:
        h = head_time(acc, model, shard, job.dtype)
        _add(comp, {"forward_compute": h.forward, "backward_compute": h.backward, "tp_comm": tp_sync})
        acts += L.head_activation_bytes(model, shard)
        head = L.head_params(model, separate_copy=dims.pp > 1)
        params = params + L.ParamCount(dense=head / dims.tp)
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
    kinds = {model.is_moe_layer(i): i for i in range(model.num_layers)}
    profiles = {moe: _profile(model, cluster, dims, job, placement, i) for moe, i in kinds.items()}
    return _assemble(model, cluster, dims, job, placement, profiles, m)


def _boundary_times(model, cluster, dims, job, placement) -> list[float]:
    shard = _shard(dims, job)
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


def _assemble(model, cluster, dims, job, placement, profiles, m) -> Prediction:
    bounds = _boundary_times(model, cluster, dims, job, placement)
    wrap = max(bounds, default=0.0)   # interleaved chunks also pass from the last stage back to the first
    v = dims.virtual_stages
    shard_groups = ShardGroups(dense=placement.groups["cp+ep+dp"].size, expert=placement.groups["cp+dp"].size)
    stages: list[StageCost] = []
    first = 0
    pieces = []
    for i, n_layers in enumerate(dims.stage_layers(model.num_layers)):
        last = first + n_layers - 1
        comp, acts, params, transient = _stage_compute(model, cluster, dims, job, placement, profiles, first, last, i)
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
