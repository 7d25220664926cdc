"""The exact evaluator: step time, its breakdown and memory per device of one plan."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Sequence

import numpy as np

from nestplan.cost import comm, stage
from nestplan.cost.memory import (
    in_flight_microbatches,
    live_activation_peak,
    moe_a2a_early,
)
from nestplan.cost.pipeline import pipeline_floor, pipeline_time, split_pipeline_time
from nestplan.cost.prediction import Prediction, StageCost
from nestplan.cost.schedules import family
from nestplan.cost.schedules.walk import SplitTimes, activation_peak
from nestplan.cost.stepend import StepEnd, SyncContext, step_end, tied_embedding_sync
from nestplan.cost.terms import GraphTerms, TermCache, shard_of
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import check_against_accelerator, check_against_model, check_cp_comm
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import DEFAULT_AXIS_ORDER, Placement, place

if TYPE_CHECKING:
    from nestplan.cluster import Cluster


@lru_cache(maxsize=256)
def _model_flops(model: ModelSpec, seq: int, global_batch_size: int, recompute: Recompute) -> tuple[float, float]:
    """(model, hardware) FLOPs of one step: 3x forward (Narayanan et al. SC'21 eq. 3), MTP modules
    included, plus recomputation, which re-runs the blocks (an MTP module's block like the main ones).
    Attention counts the pairs a causal model attends, the causal half of the square (Megatron-LM's
    convention, ``block_model_flops(attended=True)``), as its time is costed: MFU stays below 100%."""
    fwd = sum(L.block_model_flops(model, i, seq, seq, attended=True) for i in range(model.num_layers))
    fwd += L.head_model_flops(model, seq) + L.mtp_model_flops(model, seq, attended=True)
    model_flops = 3.0 * fwd * global_batch_size
    # the blocks as they run, each MTP module's like the last main one
    blocks = list(range(model.num_layers)) + [model.num_layers - 1] * model.mtp_layers
    if recompute is Recompute.FULL:
        extra = sum(L.block_model_flops(model, i, seq, seq, attended=True) for i in blocks)
    elif recompute is Recompute.SELECTIVE:
        # selective recomputation re-runs the attention cores only (Korthikanti et al. 2022 section 5):
        # their forward FLOPs, with MLA's own query/key and value head widths; Mamba and MLP-only blocks none
        extra = seq * sum(
            L.attended_fraction(model, i, seq) * L.attention_model_flops(model, i, seq)
            for i in blocks
            if model.mixer_of(i) == "attention"
        )
    else:
        extra = 0.0
    return model_flops, model_flops + extra * global_batch_size


def evaluate_plan(
    model: ModelSpec,
    cluster: Cluster,
    dims: ParallelDims,
    job: Job,
    axis_order: Sequence[str] = DEFAULT_AXIS_ORDER,
    *,
    terms: TermCache | None = None,
) -> Prediction:
    """Predict one plan. A plan that does not fit is still evaluated; ``Prediction.fits`` says so.
    ``terms``: the node terms already computed for this (model, cluster, job), shared by a caller
    that evaluates many plans of it (the planner); the result is the same without it."""
    check_against_model(dims, model, job.seq_len)
    check_cp_comm(dims, model, job)
    check_against_accelerator(job.settings, cluster.accelerator)
    if dims.devices > cluster.devices:
        raise ConfigError(
            f"the plan needs {dims.devices} devices but cluster '{cluster.name}' has {cluster.devices}",
            field="devices",
            value=dims.devices,
            limit=cluster.devices,
        )
    m = dims.num_microbatches(job.global_batch_size)
    placement = place(dims, cluster.topology, axis_order)
    cache = terms if terms is not None else TermCache(model, cluster, job)
    assert cache.model is model and cache.cluster is cluster and cache.job == job, "terms of other inputs"
    return _assemble(model, cluster, dims, job, placement, cache.graph_terms(dims, placement.groups), m)


def _boundary_times(
    model: ModelSpec, cluster: Cluster, dims: ParallelDims, job: Job, placement: Placement
) -> list[float]:
    shard = shard_of(dims.subgraph, job)
    return [comm.boundary_time(cluster.topology, model, shard, lv) for lv in placement.pp_boundary_levels]


def _step_end(
    model: ModelSpec, cluster: Cluster, dims: ParallelDims, job: Job, placement: Placement, st: _Stages
) -> tuple[StepEnd, float]:
    """The step end of the stages (exposed sync and optimizer step) and the tied-embedding sync."""
    sync = SyncContext(
        cluster.topology, cluster.accelerator, job, dims.zero, placement.groups["cp+ep+dp"], placement.groups["cp+dp"]
    )
    end = step_end(sync, *stage.step_end_inputs(st.sums), st.bounds)
    return end, tied_embedding_sync(model, cluster.topology, dims.tp, job, placement.pp_ends)


def step_floor_s(
    model: ModelSpec,
    cluster: Cluster,
    dims: ParallelDims,
    job: Job,
    axis_order: Sequence[str] = DEFAULT_AXIS_ORDER,
    *,
    terms: TermCache | None = None,
) -> float:
    """A lower bound of ``evaluate_plan(...).step_time_s`` at a fraction of its cost: the pipeline's
    floor (cost/pipeline.py ``pipeline_floor``, no schedule simulation) of the same stages plus the
    same step end. A caller comparing many splits or schedules of one plan skips those that cannot win."""
    check_against_model(dims, model, job.seq_len)
    check_cp_comm(dims, model, job)
    m = dims.num_microbatches(job.global_batch_size)
    placement = place(dims, cluster.topology, axis_order)
    cache = terms if terms is not None else TermCache(model, cluster, job)
    stages = _stages(model, cluster, dims, job, placement, cache.graph_terms(dims, placement.groups))
    end, tied = _step_end(model, cluster, dims, job, placement, stages)
    forward, backward = stages.times()
    if dims.schedule.splits_backward:  # every stage runs all its operations one after another
        floor = m * max(_least_busy(stages, dims.schedule)) * (1 - 1e-9)
    else:
        floor = pipeline_floor(forward, backward, m, dims.virtual_stages)
    return floor + end.exposed_s + tied + end.optimizer_s


def _least_busy(stages: _Stages, schedule: Schedule) -> list[float]:
    """Per stage, the least time one microbatch of all its chunks keeps it busy: its cycle, or under
    DualPipeV, whose overlapped operations may hide its expert all-to-alls and transfers, the rest."""
    if not family(schedule).hides_communication:
        return list(stages.cycles)
    c = stages.chunks
    assert c is not None  # its forward_comm and backward_comm are the communication an F&BW may hide
    return (c.forward + c.backward - c.forward_comm - c.backward_comm).sum(axis=1).tolist()


@dataclass(frozen=True)
class _Chunks:
    """Per stage and chunk (p, v), for chunks given per virtual stage: seconds of a forward and of a
    backward per microbatch (transfers included), activation bytes stored per microbatch, and for
    the schedules that split the backward: its weight-gradient seconds, the bytes W keeps after B,
    and the communication seconds of the forward and the backward (transfers included)."""

    forward: np.ndarray
    backward: np.ndarray
    activations: np.ndarray
    weight_grad: np.ndarray
    kept: np.ndarray
    forward_comm: np.ndarray
    backward_comm: np.ndarray

    def split_times(self) -> SplitTimes:
        return SplitTimes.of_backward(
            self.forward, self.backward, self.weight_grad, self.forward_comm, self.backward_comm
        )


@dataclass(frozen=True)
class _Stages:
    """Every stage of one split: its boundary transfers, layers, summed nodes, components per
    microbatch (transfers included), forward part and cycle; its chunks where they differ."""

    bounds: list[float]
    layers: tuple[int, ...]
    starts: list[int]
    sums: list[stage.StageSums]
    components: list[dict[str, float]]
    forward: list[float]
    cycles: list[float]
    chunks: _Chunks | None = None

    def times(self) -> tuple[list[float] | np.ndarray, list[float] | np.ndarray]:
        """(forward, backward) per microbatch as the schedule simulation takes them: per stage and
        chunk where the chunks differ, else per stage."""
        if self.chunks is not None:
            return self.chunks.forward, self.chunks.backward
        return self.forward, [c - f for c, f in zip(self.cycles, self.forward)]


def _stages(
    model: ModelSpec, cluster: Cluster, dims: ParallelDims, job: Job, placement: Placement, terms: GraphTerms
) -> _Stages:
    bounds = _boundary_times(model, cluster, dims, job, placement)
    wrap = max(bounds, default=0.0)  # interleaved chunks also pass from the last stage back to the first
    v = dims.virtual_stages
    kinds = [model.block_kind(i) for i in range(model.num_layers)]
    layers = dims.stage_layers(model.num_layers)
    starts = [sum(layers[:i]) for i in range(dims.pp)]
    if dims.per_virtual_stage or dims.schedule.splits_backward:
        return _chunked_stages(model, dims, terms, bounds, kinds, layers, starts)
    sums, components, forward = [], [], []
    for i, (first, n_layers) in enumerate(zip(starts, layers)):
        part = stage.stage_sums(terms, kinds[first : first + n_layers], i, dims.pp)
        prev = bounds[i - 1] if i > 0 else (wrap if v > 1 else 0.0)
        nxt = bounds[i] if i < dims.pp - 1 else (wrap if v > 1 else 0.0)
        sums.append(part)
        components.append(dict(part.components, pp_comm=stage.transfer_seconds(prev, nxt, v)))
        forward.append(part.forward + v * nxt)  # a stage sends its outputs forward, its input gradients back
    return _Stages(bounds, layers, starts, sums, components, forward, [sum(c.values()) for c in components])


# what DualPipeV's overlapped F&BW hides under the other microbatch's compute: the expert all-to-alls
# and the pipeline transfers (DeepSeek-V3, arXiv 2412.19437, section 3.2.1); tensor- and context-parallel
# collectives stay in line (torch.distributed.pipelining runs an F&BW's halves one after the other unless
# the model registers an overlap; torchtitan registers one for the MoE all-to-alls)
OVERLAPPED_TERMS = ("ep_comm", "pp_comm")


def _chunked_stages(model, dims, terms: GraphTerms, bounds, kinds, layers, starts) -> _Stages:
    """Stages whose chunks are costed per virtual stage (ParallelDims.virtual_stage_position says
    which stage and chunk runs each), each holding its own blocks, the embedding (virtual stage 0)
    or the head (the last)."""
    pp, v = dims.pp, dims.virtual_stages
    counts = dims.virtual_stage_layers(model.num_layers)
    firsts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    positions = [dims.virtual_stage_position(i) for i in range(pp * v)]
    owner = [s for s, _ in positions]
    arrays = {name: np.zeros((pp, v)) for name in ("fwd", "bwd", "acts", "wgrad", "kept", "fcomm", "bcomm")}
    parts: list[list[stage.StageSums]] = [[] for _ in range(pp)]
    sent = [0.0] * pp
    known: dict[tuple, stage.StageSums] = {}  # a virtual stage's sums depend on its blocks and whether it is an end
    for i, (s, c) in enumerate(positions):
        held = tuple(kinds[firsts[i] : firsts[i + 1]])
        key = (held, i == 0, i == pp * v - 1)
        part = known.get(key) or known.setdefault(key, stage.stage_sums(terms, held, i, pp * v))
        prev, nxt = stage.chunk_transfers(i, owner, bounds)
        overlappable = part.components["ep_comm"] / 2  # dispatch and combine forward, their transposes back
        arrays["fwd"][s, c] = part.forward + nxt  # its outputs forward
        arrays["bwd"][s, c] = sum(part.components.values()) - part.forward + prev  # its input gradients back
        arrays["acts"][s, c] = part.activations
        arrays["wgrad"][s, c] = part.weight_gradient
        arrays["kept"][s, c] = part.weight_gradient_bytes
        arrays["fcomm"][s, c] = overlappable + nxt
        arrays["bcomm"][s, c] = overlappable + prev
        parts[s].append(part)
        sent[s] += prev + nxt
    sums = [stage.combined_sums(x) for x in parts]
    components = [dict(whole.components, pp_comm=out) for whole, out in zip(sums, sent)]
    cycles = [sum(c.values()) for c in components]
    a = arrays
    chunks = _Chunks(a["fwd"], a["bwd"], a["acts"], a["wgrad"], a["kept"], a["fcomm"], a["bcomm"])
    return _Stages(bounds, layers, starts, sums, components, a["fwd"].sum(axis=1).tolist(), cycles, chunks)


def _stage_memory(ctx: stage.StageContext, dims: ParallelDims, st: _Stages, i: int, m: int) -> dict[str, float]:
    """Stage i's memory breakdown: activations x microbatches in flight, or, where its chunks
    differ, the peak of its live chunks."""
    if st.chunks is None:
        in_flight = in_flight_microbatches(dims.schedule, i, dims.pp, m, dims.virtual_stages, moe_a2a_early(ctx.job))
        return stage.stage_memory_breakdown(ctx, st.sums[i], in_flight)
    if dims.schedule.splits_backward:
        live = activation_peak(dims.schedule, i, dims.pp, m, st.chunks.activations[i], st.chunks.kept[i])
        return stage.chunked_memory_breakdown(ctx, st.sums[i], live)
    live = live_activation_peak(dims.schedule, i, dims.pp, m, st.chunks.activations[i], moe_a2a_early(ctx.job))
    return stage.chunked_memory_breakdown(ctx, st.sums[i], live)


def _split_fields(dims: ParallelDims, st: _Stages, i: int) -> dict[str, tuple[float, ...]]:
    """Stage i's per-chunk W and communication seconds, under a schedule that splits the backward."""
    if not dims.schedule.splits_backward:
        return {}
    c = st.chunks
    assert c is not None
    return {
        "chunk_weight_grad_s": tuple(c.weight_grad[i].tolist()),
        "chunk_forward_comm_s": tuple(c.forward_comm[i].tolist()),
        "chunk_backward_comm_s": tuple(c.backward_comm[i].tolist()),
    }


def _exposed(components: dict[str, float], m: int, busy_s: float) -> dict[str, float]:
    """The bottleneck stage's m microbatches by component. Where its operations overlap one
    microbatch's communication with another's compute (DualPipeV's F&BW), it is busy for less than
    m times its components: the communication terms shrink by what hid, in proportion."""
    out = {k: m * x for k, x in components.items()}
    hidden = sum(out.values()) - busy_s
    comm = sum(out[k] for k in OVERLAPPED_TERMS)
    if hidden > 1e-12 * busy_s and comm > 0:
        assert hidden <= comm * (1 + 1e-9), (hidden, comm)
        keep = max(0.0, 1 - hidden / comm)
        out.update({k: out[k] * keep for k in OVERLAPPED_TERMS})
    return out


def _stage_costs(ctx: stage.StageContext, dims: ParallelDims, st: _Stages, m: int) -> tuple[StageCost, ...]:
    """Every stage of one replica: what it holds, its times per microbatch and its memory per device."""
    head_stage = dims.virtual_stage_position(dims.pp * dims.virtual_stages - 1)[0]  # stage 0 under a V schedule
    stages = []
    for i, (first, n_layers, comp) in enumerate(zip(st.starts, st.layers, st.components)):
        memory = _stage_memory(ctx, dims, st, i, m)
        stages.append(
            StageCost(
                index=i,
                first_layer=first,
                last_layer=first + n_layers - 1,
                has_embedding=i == 0,
                has_head=i == head_stage,
                devices=dims.stage_devices,
                forward_s=st.forward[i],
                backward_s=st.cycles[i] - st.forward[i],
                cycle_s=st.cycles[i],
                components_s=MappingProxyType(comp),
                memory_bytes=MappingProxyType(memory),
                chunk_forward_s=() if st.chunks is None else tuple(st.chunks.forward[i].tolist()),
                chunk_backward_s=() if st.chunks is None else tuple(st.chunks.backward[i].tolist()),
                **_split_fields(dims, st, i),
            )
        )
    return tuple(stages)


def _assemble(
    model: ModelSpec,
    cluster: Cluster,
    dims: ParallelDims,
    job: Job,
    placement: Placement,
    terms: GraphTerms,
    m: int,
) -> Prediction:
    st = _stages(model, cluster, dims, job, placement, terms)
    v = dims.virtual_stages
    dense, expert = placement.groups["cp+ep+dp"].size, placement.groups["cp+dp"].size
    ctx = stage.StageContext.on(job, dims.zero, dense, expert, cluster.accelerator)
    if dims.schedule.splits_backward:
        assert st.chunks is not None
        pipe_s, bubble_s, slowest, busy_s = split_pipeline_time(st.chunks.split_times(), m, dims.schedule)
    else:
        pipe_s, bubble_s, slowest = pipeline_time(*st.times(), m, dims.schedule, v)
        busy_s = m * st.cycles[slowest]
    end, tied = _step_end(model, cluster, dims, job, placement, st)
    breakdown = _exposed(st.components[slowest], m, busy_s)
    breakdown["pipeline_bubble"] = bubble_s
    breakdown["dp_sync"] = end.exposed_s + tied
    breakdown["optimizer"] = end.optimizer_s
    step = pipe_s + end.exposed_s + tied + end.optimizer_s
    assert abs(sum(breakdown.values()) - step) <= 1e-9 * step
    model_flops, hw_flops = _model_flops(model, job.seq_len, job.global_batch_size, dims.recompute)
    return Prediction(
        step_time_s=step,
        breakdown_s=MappingProxyType(breakdown),
        tokens_per_s=job.tokens_per_step / step,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hw_flops,
        devices_used=dims.devices,
        peak_flops_per_device=cluster.accelerator.peak(job.dtype),
        memory_capacity_bytes=cluster.accelerator.hbm_bytes,
        num_microbatches=m,
        stages=_stage_costs(ctx, dims, st, m),
        bottleneck_stage=slowest,
        plan=dims,
        placement=placement,
        settings=job.settings,
    )
