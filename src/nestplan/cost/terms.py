"""Per-node terms of the layer graph under one sub-graph configuration.

The layer graph is embedding -> blocks -> head. Under fixed tp, sp, cp, ep, microbatch,
recomputation and ZeRO stage, every node's per-microbatch time components, parameters
and stored activations are fixed; a stage sums the nodes it holds. The evaluator and the
search both build stages from these terms, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Hashable, Mapping

from nestplan.cluster import Cluster
from nestplan.cost import comm
from nestplan.cost.compute import (
    FP8_BYTES,
    FP8_COPIES,
    LayerTime,
    Precision,
    block_time,
    embedding_time,
    head_time,
    mtp_own_time,
    ring_merge_time,
)
from nestplan.cost.memory import weight_gradient_input_bytes
from nestplan.cost.prediction import BREAKDOWN_TERMS
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.settings import CpCommType, MoeDispatcher
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, ZeroStage
from nestplan.strategy.legality import saved_activations_distributed
from nestplan.strategy.placement import GroupSpan
from nestplan.strategy.subgraph import SubGraph
from nestplan.network.topology import Topology


@dataclass(frozen=True)
class NodeTerms:
    """One node's per-microbatch cost on one device."""

    components: Mapping[str, float]  # BREAKDOWN_TERMS -> seconds (pipeline terms zero)
    params: L.ParamCount  # per device, before ZeRO
    activations: float  # bytes stored per microbatch
    forward: float = 0.0  # seconds of the components that run in the forward pass
    transient: float = 0.0  # bytes alive only while this node recomputes
    fp8_weight_bytes: float = 0.0  # FP8 copies of its GEMM weights, kept all step besides the ZeRO states
    weight_gradient: float = 0.0  # seconds of backward_compute that are weight-gradient GEMMs (zero-bubble W)
    weight_gradient_bytes: float = 0.0  # of its stored activations, the bytes W still reads after B

    @property
    def cycle(self) -> float:
        return float(sum(self.components.values()))


@dataclass(frozen=True)
class GraphTerms:
    blocks: Mapping[Hashable, NodeTerms]  # keyed by ModelSpec.block_kind, in the order kinds first appear
    embedding: NodeTerms
    head: NodeTerms
    # the last of several stages' copy of the embedding: a tied output projection's, or the one MTP modules read
    embedding_copy: L.ParamCount


TERM_GROUPS = ("tp", "cp", "cp+ep+dp", "cp+dp", "expert", "etp")  # the groups whose spans the terms depend on


def terms_zero(zero: ZeroStage) -> ZeroStage:
    """The ZeRO stage as the node terms see it: ZeRO 1 shards only optimizer state, which no node
    term holds or moves, so its terms are ZeRO 0's."""
    return zero if zero >= ZeroStage.GRADIENTS else ZeroStage.NONE


def shard_of(sub: SubGraph, job: Job) -> L.Shard:
    """How a layer of the job runs on one device under the sub-graph strategy ``sub``: the one place a
    ``Shard`` is built from a plan."""
    return L.Shard(
        **vars(sub),
        seq_len=job.seq_len,
        dtype_bytes=job.dtype_bytes,
        flash=job.settings.flash_attention,
        capacity=job.settings.moe_capacity_factor or 1.0,
        fp8_gemms=job.fp8,
    )


def _layer_shard(shard: L.Shard) -> L.Shard:
    """``shard`` without its recomputation: what a layer computes and sends does not depend on it (the
    bytes it stores under each recomputation are computed together), so every recomputation shares them."""
    return shard if shard.recompute is Recompute.NONE else replace(shard, recompute=Recompute.NONE)


def _components(**values: float) -> Mapping[str, float]:
    out = {k: 0.0 for k in BREAKDOWN_TERMS}
    out.update(values)
    return MappingProxyType(out)


@dataclass(frozen=True)
class _BlockCompute:
    """What one block kind costs under one shard, whatever the placement: its time before
    communication, its parameters and its stored activations per recomputation mode."""

    time: LayerTime  # forward and backward include the ring's merges; attention_forward does not
    params: L.ParamCount
    activations: Mapping[Recompute, float]
    weight_gradient_bytes: float  # GEMM inputs kept from B until W
    ring_merge_forward: float = 0.0  # seconds of the forward merges of a context-parallel ring


def ring_length(job: Job, cp: int) -> int:
    """Ranks of the ring whose partial attention results a device merges: cp under the p2p exchange, the
    ring across the all-to-all groups of a2a+p2p, none under a2a or allgather."""
    if job.settings.cp_comm_type is CpCommType.P2P:
        return cp
    return cp // job.settings.cp_a2a_size if job.settings.cp_comm_type is CpCommType.A2A_P2P else 1


def _block_compute(model: ModelSpec, acc, shard: L.Shard, precision: Precision, layer: int, ring: int) -> _BlockCompute:
    acts = model.traced_activation_scale  # 1 unless a trace calibrated it
    stored = {rc: acts * L.block_activation_bytes(model, layer, shard, rc) for rc in Recompute}
    # W reads the inputs' FP8 column-wise copies under an FP8 recipe (cost/compute.py FP8_COPIES)
    kept_bytes = FP8_BYTES if precision.fp8_recipe is not None else shard.dtype_bytes
    kept = weight_gradient_input_bytes(L.block_gemms(model, layer, shard), kept_bytes, shard.sp_div)
    time = block_time(acc, model, layer, shard, precision)
    merge_f, merge_b = ring_merge_time(acc, model, layer, shard, ring)
    time = replace(time, forward=time.forward + merge_f, backward=time.backward + merge_b)
    return _BlockCompute(
        time, L.block_params_per_device(model, layer, shard), MappingProxyType(stored), acts * kept, merge_f
    )


def fp8_weight_copies(job: Job) -> float:
    """Bytes per block parameter of the FP8 weight copies Transformer Engine keeps across a step's
    microbatches (row- and column-wise, cost/compute.py FP8_COPIES); none when the parameters are
    themselves FP8 (fp8_params: the weight is the row-wise copy and its transpose takes the bytes
    the bf16 weight would)."""
    if not job.fp8 or job.settings.fp8_params:
        return 0.0
    return FP8_COPIES * FP8_BYTES


def gathered_kv_bytes(model: ModelSpec, shard: L.Shard, cp: int) -> float:
    """Keys and values of the whole sequence a device holds while its attention runs when context
    parallelism all-gathers them (Transformer Engine's all-gather kind keeps them for that layer only)."""
    return cp * comm.local_kv_bytes(model, shard)


# NCCL runs a collective as kernels on the SMs, one thread block per channel, up to 32 channels
# (NCCL_MAX_NCHANNELS, NCCL's environment-variable documentation), about a fifth of an H100's 132 SMs: a
# layer's compute runs that much slower while a ZeRO 2/3 collective it hides is in flight (FSDP's per-layer
# all-gathers and reduce-scatters: Zhao et al. 2023, PyTorch FSDP, VLDB, section 7 on overlap).
COLLECTIVE_SM_SHARE = 0.2


def _hidden_cost(collective: float, compute: float) -> float:
    """Seconds a collective under ``compute`` adds: what compute cannot hide, and the SMs it takes from the
    part it hides."""
    return max(0.0, collective - compute) + COLLECTIVE_SM_SHARE * min(collective, compute)


def _zero_exposed(
    topo: Topology, zero: ZeroStage, job: Job, groups: Mapping[str, GroupSpan], params: L.ParamCount, t: LayerTime
) -> tuple[float, float]:
    """Seconds of a layer's ZeRO 2 and 3 collectives its forward and backward do not hide."""
    if zero is ZeroStage.GRADIENTS:
        # sharded gradients cannot accumulate locally: every microbatch reduce-scatters them,
        # overlapped with the backward pass (DeepSpeed ZeRO-2 with overlap_comm)
        rs = sum(
            comm.zero3_layer_time(topo, groups[key], 0.0, n * job.grad_bytes)[1]
            for key, n in (("cp+ep+dp", params.dense), ("cp+dp", params.expert))
        )
        return 0.0, _hidden_cost(rs, t.backward)
    if zero is ZeroStage.PARAMETERS:
        zf, zb = comm.zero3_layer_time(
            topo, groups["cp+ep+dp"], params.dense * job.dtype_bytes, params.dense * job.grad_bytes
        )
        ef, eb = comm.zero3_layer_time(
            topo, groups["cp+dp"], params.expert * job.dtype_bytes, params.expert * job.grad_bytes
        )
        return _hidden_cost(zf + ef, t.forward), _hidden_cost(zb + eb, t.backward)
    return 0.0, 0.0


def _block(
    model: ModelSpec,
    topo: Topology,
    dims: ParallelDims,
    job: Job,
    groups: Mapping[str, GroupSpan],
    b: _BlockCompute,
    c: comm.LayerComm,
) -> NodeTerms:
    t, params = b.time, b.params
    if dims.recompute is Recompute.FULL:
        redo = t.forward + c.tp_forward + c.cp_forward + c.ep_forward
    elif dims.recompute is Recompute.SELECTIVE:
        redo = t.attention_forward + b.ring_merge_forward  # the attention core as context parallelism runs it
    else:
        redo = 0.0
    zero_f, zero_b = _zero_exposed(topo, dims.zero, job, groups, params, t)
    fs = model.traced_flops_scale  # 1 unless a trace calibrated it
    # full recomputation's saved input split over the tp ranks, all-gathered before the recomputation
    split = saved_activations_distributed(job.settings, dims)
    saved_gather = (
        comm.saved_input_gather_time(topo, groups["tp"], shard_of(dims.subgraph, job), model.hidden_size)
        if split
        else 0.0
    )
    transient = b.activations[Recompute.NONE] if dims.recompute is Recompute.FULL else 0.0
    fp8_copies = fp8_weight_copies(job) * params.total
    if dims.zero is ZeroStage.PARAMETERS:
        # the gathered layer and the prefetched next one, with the FP8 copies cast from them: under ZeRO 3 a
        # layer's weights exist whole only while it runs (FSDP frees them after its forward and backward), and
        # so do the FP8 casts of them (Transformer Engine casts the weight it is given at each use)
        transient += 2 * (params.total * job.dtype_bytes + fp8_copies)
        fp8_copies = 0.0
    if job.settings.cp_comm_type is CpCommType.ALLGATHER and dims.cp > 1:
        transient += gathered_kv_bytes(model, shard_of(dims.subgraph, job), dims.cp)
    return NodeTerms(
        components=_components(
            forward_compute=fs * t.forward,
            backward_compute=fs * t.backward,
            recompute=fs * redo,
            tp_comm=c.tp_forward + c.tp_backward + saved_gather,
            cp_comm=c.cp_forward + c.cp_backward,
            ep_comm=c.ep_forward + c.ep_backward,
            zero_comm=zero_f + zero_b,
        ),
        params=params,
        activations=b.activations[dims.recompute] / (dims.tp if split else 1),
        forward=fs * t.forward + c.tp_forward + c.cp_forward + c.ep_forward + zero_f,
        transient=transient,
        fp8_weight_bytes=fp8_copies,
        weight_gradient=fs * t.weight_gradient,
        weight_gradient_bytes=b.weight_gradient_bytes,
    )


def _mtp_own(model: ModelSpec, shard: L.Shard, t: LayerTime, tp_comm: float) -> NodeTerms:
    """One MTP module's own part (DeepSeek-V3, arXiv 2412.19437 section 2.2; Megatron-Core
    multi_token_prediction.py): the norms and the projection M (``compute.mtp_own_time``) and M's
    collectives over tp, its input's gather (2h, reduce-scattered back in backward) and its output's
    gather (h, forward and backward): the bytes of one sync of width 3h (``tp_comm``)."""
    return NodeTerms(
        components=_components(forward_compute=t.forward, backward_compute=t.backward, tp_comm=tp_comm),
        params=L.ParamCount(dense=L.mtp_own_params_per_device(model, shard)),
        activations=L.mtp_own_activation_bytes(model, shard),
        forward=t.forward + tp_comm / 2,
        weight_gradient=t.weight_gradient,
        weight_gradient_bytes=weight_gradient_input_bytes([L.mtp_projection_gemm(model, shard)], shard.dtype_bytes),
    )


def _sum(*nodes: NodeTerms) -> NodeTerms:
    """Nodes that run one after the other as one node: their times, parameters and kept bytes add up,
    the transient buffers do not (one is alive at a time)."""
    return NodeTerms(
        components=_components(**{k: sum(n.components[k] for n in nodes) for k in BREAKDOWN_TERMS}),
        params=sum((n.params for n in nodes), L.ParamCount()),
        activations=sum(n.activations for n in nodes),
        forward=sum(n.forward for n in nodes),
        transient=max(n.transient for n in nodes),
        fp8_weight_bytes=sum(n.fp8_weight_bytes for n in nodes),
        weight_gradient=sum(n.weight_gradient for n in nodes),
        weight_gradient_bytes=sum(n.weight_gradient_bytes for n in nodes),
    )


def graph_terms(
    model: ModelSpec, cluster: Cluster, dims: ParallelDims, job: Job, groups: Mapping[str, GroupSpan]
) -> GraphTerms:
    """Terms of every node kind under ``dims`` (pp and dp only matter through ``groups``)."""
    return TermCache(model, cluster, job).graph_terms(dims, groups)


class TermCache:
    """``graph_terms`` of one (model, cluster, job) for many sub-graph configurations.

    What a block computes depends on the shard only (tp, sp, cp, ep, etp, microbatch: its
    sub-graph strategy but the recomputation), its collectives on the shard and the spans of
    its tp, cp and ep groups, and recomputation and ZeRO only combine those: each part is
    computed once and the terms are assembled from them,
    so a search over thousands of configurations and an evaluator polishing one plan's split
    pay for each part once. Results are identical to computing them afresh.
    """

    def __init__(self, model: ModelSpec, cluster: Cluster, job: Job) -> None:
        self.model, self.cluster, self.job = model, cluster, job
        # one representative layer per kind of block (``ModelSpec.block_kind``; the last of each), in
        # the order the kinds first appear: GraphTerms.blocks keeps that order
        self._kinds = {model.block_kind(i): i for i in range(model.num_layers)}
        self._compute: dict[L.Shard, tuple] = {}
        self._comm: dict[tuple, tuple] = {}
        self._terms: dict[tuple, GraphTerms] = {}

    def graph_terms(self, dims: ParallelDims, groups: Mapping[str, GroupSpan]) -> GraphTerms:
        shard = shard_of(dims.subgraph, self.job)
        key = (shard, terms_zero(dims.zero)) + tuple(groups[k] for k in TERM_GROUPS)
        found = self._terms.get(key)
        if found is None:
            found = self._terms[key] = self._assemble(dims, shard, groups)
        return found

    def _compute_parts(self, shard: L.Shard) -> tuple:
        found = self._compute.get(shard)
        if found is None:
            model, acc, job = self.model, self.cluster.accelerator, self.job
            precision = Precision.of(job, acc)
            ring = ring_length(job, shard.cp)
            blocks = {kind: _block_compute(model, acc, shard, precision, i, ring) for kind, i in self._kinds.items()}
            found = self._compute[shard] = (
                blocks,
                embedding_time(acc, model, shard),
                head_time(acc, model, shard, job.dtype),
                mtp_own_time(acc, model, shard, job.dtype),
            )
        return found

    def _comm_parts(
        self, shard: L.Shard, groups: Mapping[str, GroupSpan], blocks: Mapping[Hashable, _BlockCompute]
    ) -> tuple:
        key = (shard, groups["tp"], groups["cp"], groups["expert"], groups["etp"])
        found = self._comm.get(key)
        if found is None:
            topo, model = self.cluster.topology, self.model
            gather = FP8_BYTES if self.job.fp8 else None  # FP8 operands are cast, then gathered
            cp_comm = comm.CpComm(
                self.job.settings.cp_comm_type, self.job.settings.cp_a2a_size, self.cluster.accelerator.memory_time(1.0)
            )
            comms = {
                kind: comm.block_comm(
                    topo,
                    model,
                    i,
                    shard,
                    groups,
                    blocks[kind].time.attention_forward,
                    blocks[kind].time.gemms,
                    self.job.settings.tp_comm_overlap,
                    gather,
                    cp_comm,
                    self._a2a_hidden_under(blocks[kind].time),
                    self.job.settings.moe_dispatcher is MoeDispatcher.DEEPEP,
                )
                for kind, i in self._kinds.items()
            }
            found = self._comm[key] = (comms, comm.tp_collectives(topo, groups["tp"], shard, model.hidden_size, 1))
        return found

    def _a2a_hidden_under(self, time: LayerTime) -> tuple[float, float] | None:
        """The block's (forward, backward) compute another microbatch's expert all-to-alls hide under
        with RunSettings.moe_comm_overlap (comm.expert_all_to_alls), None without."""
        return (time.forward, time.backward) if self.job.settings.moe_comm_overlap else None

    def _assemble(self, dims: ParallelDims, shard: L.Shard, groups: Mapping[str, GroupSpan]) -> GraphTerms:
        model, job = self.model, self.job
        layer = _layer_shard(shard)  # what every recomputation shares
        computed, e, h, mtp = self._compute_parts(layer)
        comms, tp_sync = self._comm_parts(layer, groups, computed)
        topo = self.cluster.topology
        blocks = {kind: _block(model, topo, dims, job, groups, computed[kind], comms[kind]) for kind in self._kinds}
        positions = model.max_position_embeddings if model.learned_position_embeddings else 0
        vocab_rows = model.vocab_size / dims.tp + positions + model.type_vocab_size
        embedding = NodeTerms(
            components=_components(forward_compute=e.forward, backward_compute=e.backward, tp_comm=tp_sync),
            params=L.ParamCount(dense=vocab_rows * model.hidden_size),
            activations=L.embedding_activation_bytes(model, shard),
            forward=e.forward + tp_sync,
        )
        head_own = L.head_params(model, separate_copy=False) / dims.tp
        # a tied output projection's copy, or the embedding the MTP modules read, on the last of several stages
        copy = L.head_params(model, separate_copy=True) / dims.tp - head_own
        if model.mtp_layers:
            copy = max(copy, embedding.params.dense)
        head = NodeTerms(
            components=_components(forward_compute=h.forward, backward_compute=h.backward, tp_comm=tp_sync),
            params=L.ParamCount(dense=head_own),
            activations=L.head_activation_bytes(model, shard),
            forward=h.forward + tp_sync / 2,
            weight_gradient=h.weight_gradient,
            weight_gradient_bytes=weight_gradient_input_bytes([L.head_gemm(model, shard)], shard.dtype_bytes),
        )  # vocab-parallel loss: reductions forward, input gradient backward
        if model.mtp_layers:
            last = blocks[model.block_kind(model.num_layers - 1)]
            own = _mtp_own(model, shard, mtp, comm.tp_collectives(topo, groups["tp"], shard, 3 * model.hidden_size, 1))
            # its embedding lookup and head reuse the main model's weights (their copy is ``copy``)
            shared = [replace(node, params=L.ParamCount()) for node in (embedding, head)]
            head = _sum(head, *[_sum(last, *shared, own)] * model.mtp_layers)
        return GraphTerms(
            blocks=MappingProxyType(blocks), embedding=embedding, head=head, embedding_copy=L.ParamCount(dense=copy)
        )
