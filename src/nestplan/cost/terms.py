"""Per-node terms of the layer graph under one sub-graph configuration.

The layer graph is embedding -> blocks -> head. Under fixed tp, sp, cp, ep, microbatch,
recomputation and ZeRO stage, every node's per-microbatch time components, parameters
and stored activations are fixed; a stage sums the nodes it holds. The evaluator and the
search both build stages from these terms, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from nestplan.cost import comm
from nestplan.cost.compute import block_time, embedding_time, head_time
from nestplan.cost.prediction import BREAKDOWN_TERMS
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, ZeroStage
from nestplan.strategy.placement import GroupSpan


@dataclass(frozen=True)
class NodeTerms:
    """One node's per-microbatch cost on one device."""

    components: Mapping[str, float]   # BREAKDOWN_TERMS -> seconds (pipeline terms zero)
    params: L.ParamCount              # per device, before ZeRO
    activations: float                # bytes stored per microbatch
    forward: float = 0.0              # seconds of the components that run in the forward pass
    transient: float = 0.0            # bytes alive only while this node recomputes

    @property
    def cycle(self) -> float:
        return float(sum(self.components.values()))


@dataclass(frozen=True)
class GraphTerms:
    blocks: Mapping[bool, NodeTerms]   # keyed by "is an MoE block"
    embedding: NodeTerms
    head: NodeTerms
    tied_head_copy: L.ParamCount       # extra head parameters when head and embedding sit on different stages


def shard_of(dims: ParallelDims, job: Job) -> L.Shard:
    return L.Shard(tp=dims.tp, sp=dims.sp_active, cp=dims.cp, ep=dims.ep, micro_batch=dims.micro_batch_size,
                   seq_len=job.seq_len, dtype_bytes=job.dtype_bytes, flash=job.flash_attention)


def _components(**values: float) -> Mapping[str, float]:
    out = {k: 0.0 for k in BREAKDOWN_TERMS}
    out.update(values)
    return MappingProxyType(out)


def _block(model: ModelSpec, cluster, dims: ParallelDims, job: Job, groups: Mapping[str, GroupSpan],
           layer: int) -> NodeTerms:
    shard = shard_of(dims, job)
    acc, topo = cluster.accelerator, cluster.topology
    t = block_time(acc, model, layer, shard, job.dtype)
    c = comm.block_comm(topo, model, layer, shard, groups, t.attention_forward)
    params = L.block_params_per_device(model, layer, shard)
    if dims.recompute is Recompute.FULL:
        redo = t.forward + c.tp_forward + c.cp_forward + c.ep_forward
    elif dims.recompute is Recompute.SELECTIVE:
        redo = t.attention_forward
    else:
        redo = 0.0
    zero_f = zero_b = 0.0
    if dims.zero is ZeroStage.GRADIENTS:
        # sharded gradients cannot accumulate locally: every microbatch reduce-scatters them,
        # overlapped with the backward pass (DeepSpeed ZeRO-2 with overlap_comm)
        rs = sum(comm.zero3_layer_time(topo, groups[key], 0.0, n * job.grad_bytes)[1]
                 for key, n in (("cp+ep+dp", params.dense), ("cp+dp", params.expert)))
        zero_b = max(0.0, rs - t.backward)
    elif dims.zero is ZeroStage.PARAMETERS:
        zf, zb = comm.zero3_layer_time(topo, groups["cp+ep+dp"], params.dense * job.dtype_bytes,
                                       params.dense * job.grad_bytes)
        ef, eb = comm.zero3_layer_time(topo, groups["cp+dp"], params.expert * job.dtype_bytes,
                                       params.expert * job.grad_bytes)
        zero_f, zero_b = max(0.0, zf + ef - t.forward), max(0.0, zb + eb - t.backward)
    rc = L.Recomputation(dims.recompute.value)
    fs, acts = model.traced_flops_scale, model.traced_activation_scale   # 1 unless a trace calibrated them
    full = acts * L.block_activation_bytes(model, layer, shard, L.Recomputation.NONE)
    transient = full if dims.recompute is Recompute.FULL else 0.0
    if dims.zero is ZeroStage.PARAMETERS:
        transient += 2 * params.total * job.dtype_bytes   # the gathered layer and the prefetched next one
    return NodeTerms(
        components=_components(
            forward_compute=fs * t.forward, backward_compute=fs * t.backward, recompute=fs * redo,
            tp_comm=c.tp_forward + c.tp_backward, cp_comm=c.cp_forward + c.cp_backward,
            ep_comm=c.ep_forward + c.ep_backward, zero_comm=zero_f + zero_b),
        params=params, activations=acts * L.block_activation_bytes(model, layer, shard, rc),
        forward=fs * t.forward + c.tp_forward + c.cp_forward + c.ep_forward + zero_f, transient=transient)


def graph_terms(model: ModelSpec, cluster, dims: ParallelDims, job: Job, groups: Mapping[str, GroupSpan]) -> GraphTerms:
    """Terms of every node kind under ``dims`` (pp and dp only matter through ``groups``)."""
    shard = shard_of(dims, job)
    acc, topo = cluster.accelerator, cluster.topology
    kinds = {model.is_moe_layer(i): i for i in range(model.num_layers)}
    blocks = {moe: _block(model, cluster, dims, job, groups, i) for moe, i in kinds.items()}
    tp_sync = comm.tp_collectives(topo, groups["tp"], shard, model.hidden_size, 1)
    e = embedding_time(acc, model, shard)
    positions = model.max_position_embeddings if model.learned_position_embeddings else 0
    vocab_rows = model.vocab_size / dims.tp + positions + model.type_vocab_size
    embedding = NodeTerms(
        components=_components(forward_compute=e.forward, backward_compute=e.backward, tp_comm=tp_sync),
        params=L.ParamCount(dense=vocab_rows * model.hidden_size),
        activations=L.embedding_activation_bytes(model, shard), forward=e.forward + tp_sync)
    h = head_time(acc, model, shard, job.dtype)
    head_own = L.head_params(model, separate_copy=False) / dims.tp
    head_copy = L.head_params(model, separate_copy=True) / dims.tp - head_own
    head = NodeTerms(
        components=_components(forward_compute=h.forward, backward_compute=h.backward, tp_comm=tp_sync),
        params=L.ParamCount(dense=head_own), activations=L.head_activation_bytes(model, shard),
        forward=h.forward + tp_sync / 2)   # vocab-parallel loss: reductions forward, input gradient backward
    return GraphTerms(blocks=MappingProxyType(blocks), embedding=embedding, head=head,
                      tied_head_copy=L.ParamCount(dense=head_copy))
