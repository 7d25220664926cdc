"""Communication of a plan: intra-layer collectives (tp, sp, cp, ep), stage-boundary
transfers, data-parallel gradient synchronisation and ZeRO gathers.

Every collective goes through ``nestplan.network.collectives`` with the fan-out the
placement gives its group, so the level a group spans sets its cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nestplan.model import ssm
from nestplan.model.layers import Shard, _kv_per_device, boundary_bytes
from nestplan.model.spec import ModelSpec
from nestplan.network import collectives as coll
from nestplan.network.topology import Topology
from nestplan.settings import CpCommType
from nestplan.strategy.enums import ZeroStage
from nestplan.strategy.placement import GroupSpan


@dataclass(frozen=True)
class LayerComm:
    """Seconds per microbatch of one layer's collectives on the critical path."""

    tp_forward: float = 0.0
    tp_backward: float = 0.0
    cp_forward: float = 0.0  # exposed part only (ring exchange overlaps the attention core)
    cp_backward: float = 0.0
    ep_forward: float = 0.0
    ep_backward: float = 0.0


@dataclass(frozen=True)
class CpComm:
    """How context parallelism exchanges keys and values (``job.CpCommType``) and the all-to-all
    group's size of the hierarchical kind."""

    kind: CpCommType = CpCommType.P2P
    a2a_size: int = 1
    copy_s_per_byte: float = 0.0  # seconds a memory-bound copy takes per byte moved (Accelerator.memory_time)


# Transformer Engine's Ulysses exchange (context_parallel.py flash_attn_a2a_communicate) copies each tensor it
# trades three times: into the all-to-all's head-major layout (movedim, contiguous), then out of it
# (movedim, contiguous) and into the load-balanced chunk order (index_select); each copy reads and writes it
A2A_LAYOUT_COPIES = 3


def tp_collectives(
    topo: Topology, tp: GroupSpan, shard: Shard, hidden: int, count: int, gather_bytes: int | None = None
) -> float:
    """``count`` tensor-parallel synchronisations of the hidden states.

    Without sp each is an all-reduce; with sp an all-gather plus a reduce-scatter of the
    same buffer, which moves the same bytes (Korthikanti et al. 2022, section 4.2.2).
    ``gather_bytes``: bytes per element of the all-gather where it moves another dtype than the
    activations (FP8 operands cast before the gather), else the activations' own.
    """
    if tp.size <= 1:
        return 0.0
    if shard.sp_div > 1:
        return count * (_all_gather(topo, tp, shard, hidden, gather_bytes) + _reduce_scatter(topo, tp, shard, hidden))
    return count * coll.all_reduce(topo, tp.fanout, shard.dtype_bytes * shard.tokens * hidden)


def _all_gather(topo: Topology, tp: GroupSpan, shard: Shard, hidden: float, gather_bytes: int | None) -> float:
    element = shard.dtype_bytes if gather_bytes is None else gather_bytes
    return coll.all_gather(topo, tp.fanout, element * shard.tokens * hidden)


def _reduce_scatter(topo: Topology, tp: GroupSpan, shard: Shard, hidden: float) -> float:
    return coll.reduce_scatter(topo, tp.fanout, shard.dtype_bytes * shard.tokens * hidden)


def saved_input_gather_time(topo: Topology, tp: GroupSpan, shard: Shard, hidden: int) -> float:
    """Seconds to all-gather a layer's saved input over the tp ranks before its recomputation, where full
    recomputation keeps it split over them (Megatron-Core ``distribute_saved_activations``:
    tensor_parallel/random.py CheckpointFunction.backward, gather_split_1d_tensor): the whole input,
    tokens x hidden in the activations' dtype, gathered from tp equal chunks, before the recomputed
    forward can start (not overlapped)."""
    return coll.all_gather(topo, tp.fanout, shard.dtype_bytes * shard.tokens * hidden)


def overlapped(collective_s: float, gemm_s: float, chunks: int) -> float:
    """Exposed seconds of a collective pipelined with the GEMM that produces or consumes it, both
    split into ``chunks`` pieces (Transformer Engine's userbuffer overlap, Megatron-LM
    --tp-comm-overlap; Wang et al., ASPLOS 2023, "Overlap communication with dependent computation
    via decomposition"): the first piece cannot hide, the rest hides under the GEMM while it lasts."""
    piece = collective_s / chunks
    return piece + max(0.0, collective_s - piece - gemm_s)


@dataclass(frozen=True)
class TpSync:
    """One tensor-parallel synchronisation per direction of a sub-block (Megatron's column/row-parallel
    pair, Shoeybi et al. 2019 Figure 3): with sp an all-gather of ``gather_width`` channels per token
    before its column-parallel GEMMs and a reduce-scatter of the hidden states after its row-parallel
    ones; without sp one all-reduce of the hidden states (``output_width`` channels per token).
    ``columns``, ``rows``: indices of those GEMMs in ``model.layers.block_gemms``' list (negative: from
    its end), which tp overlap hides the collectives under."""

    gather_width: float
    output_width: float
    columns: tuple[int, ...]
    rows: tuple[int, ...]


def _mixer_gemm_count(spec: ModelSpec, layer: int) -> int:
    """GEMMs ``model.layers.block_gemms`` lists for block ``layer``'s mixer before its FFN's."""
    mixer = spec.mixer_of(layer)
    if mixer == "mamba":
        return len(ssm.projection_shapes(spec.mamba, spec.hidden_size, 1))
    return 2 if mixer == "attention" else 0


def _latent_gather_width(spec: ModelSpec) -> float:
    """Channels per token MLA's sp all-gathers move instead of the hidden states: Megatron-core's
    MLASelfAttention (megatron/core/transformer/multi_latent_attention.py)
    runs the down-projections replicated on each rank's own 1/tp of the tokens, then the
    column-parallel up-projections gather the query latent (q_lora_rank; the hidden states for a
    plain q projection without one) and the key/value latent (kv_lora_rank), and
    ``gather_from_sequence_parallel_region`` gathers the shared rotary key (qk_rope_head_dim)."""
    return (spec.q_lora_rank or spec.hidden_size) + spec.kv_lora_rank + spec.qk_rope_head_dim


def _tp_syncs(spec: ModelSpec, layer: int) -> list[TpSync]:
    """The tp synchronisations of block ``layer`` besides an MoE FFN's (``_mlp_syncs``): one for its
    mixer (attention or Mamba: in_proj column-, out_proj row-parallel, Megatron-core MambaMixer) if it
    has one, one for its dense FFN if it has one. Falcon's parallel block (HF modeling_falcon
    ``parallel_attn``: attention and MLP read one normed input, their outputs summed) shares them: one
    gather of that input, one reduce of the summed output."""
    mixer, m = spec.mixer_of(layer), _mixer_gemm_count(spec, layer)
    dense_ffn = spec.has_ffn(layer) and not spec.is_moe_layer(layer)
    if spec.parallel_block and mixer == "attention" and dense_ffn:
        return [TpSync(spec.hidden_size, spec.hidden_size, (0, m), (1, m + 1))]
    syncs = []
    if mixer == "attention" and spec.is_mla:  # the key/value up-projection, block_gemms' last, gathers too
        syncs.append(TpSync(_latent_gather_width(spec), spec.hidden_size, (0, -1), (1,)))
    elif mixer != "none":
        syncs.append(TpSync(spec.hidden_size, spec.hidden_size, (0,), (1,)))
    if dense_ffn:
        syncs.append(TpSync(spec.hidden_size, spec.hidden_size, (m,), (m + 1,)))
    return syncs


def _sync_time(topo: Topology, tp: GroupSpan, shard: Shard, sync: TpSync, gather_bytes: int | None) -> float:
    """One direction's seconds of ``sync`` not overlapped: all-gather and reduce-scatter with sp (the
    same bytes as one all-reduce for the hidden states, Korthikanti et al. 2022 section 4.2.2), else
    an all-reduce of the block's output."""
    if tp.size <= 1:
        return 0.0
    if shard.sp_div > 1:
        gather = _all_gather(topo, tp, shard, sync.gather_width, gather_bytes)
        return gather + _reduce_scatter(topo, tp, shard, sync.output_width)
    return coll.all_reduce(topo, tp.fanout, shard.dtype_bytes * shard.tokens * sync.output_width)


def _tp_exposed(
    topo: Topology,
    tp: GroupSpan,
    shard: Shard,
    syncs: Sequence[TpSync],
    gemms: Sequence[tuple[float, float]],
    gather_bytes: int | None,
) -> tuple[float, float]:
    """(forward, backward) exposed tp collectives of the sub-blocks whose GEMMs overlap them;
    ``gemms``: (forward, backward) seconds of the block's GEMMs in ``block_gemms`` order. Forward,
    the all-gather hides under the column-parallel GEMMs and the reduce-scatter under the row-parallel
    ones. Backward, the row-parallel GEMMs' grad-output all-gather hides under their data-gradient
    product and the column-parallel GEMMs' input-gradient reduce-scatter under their weight-gradient
    product: each half of the GEMMs' backward."""
    forward = backward = 0.0
    for sync in syncs:
        gather = _all_gather(topo, tp, shard, sync.gather_width, gather_bytes)
        scatter = _reduce_scatter(topo, tp, shard, sync.output_width)
        column = [sum(gemms[i][d] for i in sync.columns) for d in (0, 1)]
        row = [sum(gemms[i][d] for i in sync.rows) for d in (0, 1)]
        forward += overlapped(gather, column[0], tp.size) + overlapped(scatter, row[0], tp.size)
        backward += overlapped(gather, row[1] / 2, tp.size) + overlapped(scatter, column[1] / 2, tp.size)
    return forward, backward


def _x_proj_all_reduce(topo: Topology, tp: GroupSpan, spec: ModelSpec, layer: int, shard: Shard) -> float:
    """One direction's all-reduce of a Mamba-1 mixer's x_proj output (dt, B, C: R + 2 N per token of
    the gathered sequence; vLLM's MambaMixer makes x_proj row-parallel over the channels; backward,
    their gradients from every rank's channels are summed the same way); none in other blocks."""
    if tp.size <= 1 or spec.mixer_of(layer) != "mamba" or not isinstance(spec.mamba, ssm.Mamba1Shape):
        return 0.0
    return coll.all_reduce(topo, tp.fanout, shard.dtype_bytes * shard.tokens * spec.mamba.x_proj_width)


def routed_tokens_per_token(spec: ModelSpec, layer: int) -> int:
    """Copies of each token an MoE block's routed experts receive (top-k), 0 in a dense block."""
    return spec.experts_per_token if spec.is_moe_layer(layer) else 0


def _mlp_syncs(
    topo: Topology, tp: GroupSpan, etp: GroupSpan, shard: Shard, spec: ModelSpec, layer: int, gather_bytes: int | None
) -> float:
    """One direction's tensor-parallel synchronisations of an MoE block's MLP part. Megatron-Core's
    all-to-all token dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
    MoEAlltoAllTokenDispatcher) all-gathers the permuted token copies over the expert-tensor-parallel
    group after the expert all-to-all and reduce-scatters them after the experts, so the routed
    experts' sync moves top-k copies of every token, in the activations' dtype (the experts cast to
    FP8 after the gather): of the T tokens a tp group syncs, the etp ranks of a folded expert shard
    gather etp / tp of them (none with etp 1). Shared experts are ordinary column/row-parallel layers
    over tp on the tokens themselves."""
    copies = routed_tokens_per_token(spec, layer)
    if shard.etp is None:
        routed = copies * tp_collectives(topo, tp, shard, spec.hidden_size, 1)
    elif etp.size > 1:
        gathered = shard.dtype_bytes * shard.tokens * spec.hidden_size * shard.expert_tp / shard.tp
        routed = copies * (
            coll.all_gather(topo, etp.fanout, gathered) + coll.reduce_scatter(topo, etp.fanout, gathered)
        )
    else:
        routed = 0.0
    shared = tp_collectives(topo, tp, shard, spec.hidden_size, 1, gather_bytes) if spec.num_shared_experts else 0.0
    return routed + shared


def block_comm(
    topo: Topology,
    spec: ModelSpec,
    layer: int,
    shard: Shard,
    groups: dict[str, GroupSpan],
    attention_forward_s: float,
    gemms: Sequence[tuple[float, float]] = (),
    tp_overlap: bool = False,
    gather_bytes: int | None = None,
    cp_comm: CpComm = CpComm(),
    a2a_hidden_under: tuple[float, float] | None = None,
    a2a_per_node: bool = False,
) -> LayerComm:
    """Collectives of one block: a tp sync per direction for its mixer and one for its dense FFN
    (``_tp_syncs``; an MoE block's MLP syncs its routed token copies, ``_mlp_syncs``; a Mamba-1
    mixer's x_proj all-reduce, ``_x_proj_all_reduce``), the context-parallel exchange
    (``context_exchange``), the expert all-to-alls (dispatch and combine).

    With ``tp_overlap`` (and sequence parallelism, which Megatron-LM requires for it) each tp
    all-gather and reduce-scatter hides under its GEMM (``overlapped``); ``gemms`` are the block's
    (forward, backward) GEMM seconds in ``model.layers.block_gemms`` order. Transformer Engine
    overlaps its own linear layers: the attention projections always, the MLP's only in a dense
    block (experts run as grouped GEMMs without it). ``gather_bytes``: the all-gathers' bytes per
    element when they move FP8 operands (``tp_collectives``). ``a2a_hidden_under``: the block's compute
    seconds another microbatch's expert all-to-alls hide under (``expert_all_to_alls``), or None;
    ``a2a_per_node``: tokens cross the network once per node (``expert_all_to_alls``)."""
    moe = spec.is_moe_layer(layer)
    syncs = _tp_syncs(spec, layer)
    if tp_overlap and shard.sp_div > 1:
        tp_f, tp_b = _tp_exposed(topo, groups["tp"], shard, syncs, gemms, gather_bytes)
    else:
        tp_f = tp_b = sum(_sync_time(topo, groups["tp"], shard, s, gather_bytes) for s in syncs)
    x_proj = _x_proj_all_reduce(topo, groups["tp"], spec, layer, shard)
    tp_f, tp_b = tp_f + x_proj, tp_b + x_proj
    if moe:
        mlp = _mlp_syncs(topo, groups["tp"], groups["etp"], shard, spec, layer, gather_bytes)
        tp_f, tp_b = tp_f + mlp, tp_b + mlp
    cp_f, cp_b = context_exchange(topo, spec, shard, groups["cp"], cp_comm, attention_forward_s, layer)
    ep_f, ep_b = expert_all_to_alls(topo, spec, layer, shard, groups["expert"], a2a_hidden_under, a2a_per_node)
    return LayerComm(
        tp_forward=tp_f, tp_backward=tp_b, cp_forward=cp_f, cp_backward=cp_b, ep_forward=ep_f, ep_backward=ep_b
    )


def expert_all_to_alls(
    topo: Topology,
    spec: ModelSpec,
    layer: int,
    shard: Shard,
    experts: GroupSpan,
    hidden_under: tuple[float, float] | None = None,
    per_node: bool = False,
) -> tuple[float, float]:
    """(forward, backward) exposed seconds of an MoE block's dispatch and combine all-to-alls over the
    ``experts`` group (ep x tp / etp ranks holding different experts): each rank sends top-k copies of
    its sequence-parallel share of the tokens (padded to the capacity factor), and gets as many back.

    ``hidden_under``: the block's (forward, backward) compute seconds where another microbatch's
    all-to-alls run under them (Megatron-Core's 1F1B A2A overlap, RunSettings.moe_comm_overlap: the forward
    of microbatch i + 1 and the backward of microbatch i run merged, layer by layer, each one's
    all-to-alls on a communication stream under the other's compute): the forward's all-to-alls
    hide under the backward's compute and the backward's under the forward's, what exceeds it is
    exposed. That is the pipeline's steady state; a stage's first and last microbatches, which run
    alone, are costed as steady too.

    ``per_node``: a dispatcher that sends a token once to each node holding one of its experts
    (``job.MoeDispatcher.DEEPEP``): beyond the node, ``remote_units`` per token instead of top-k."""
    if not spec.is_moe_layer(layer) or experts.size <= 1:
        return 0.0, 0.0
    routed = shard.dtype_bytes * shard.tokens * spec.experts_per_token * spec.hidden_size / shard.tp * shard.capacity
    outer = remote_units(spec, topo, experts.fanout) / spec.experts_per_token if per_node else 1.0
    both = 2 * coll.all_to_all(topo, experts.fanout, routed, outer)  # dispatch + combine
    if hidden_under is None:
        return both, both
    forward_compute, backward_compute = hidden_under
    return max(0.0, both - backward_compute), max(0.0, both - forward_compute)


def remote_units(spec: ModelSpec, topo: Topology, fanout: Sequence[int]) -> int:
    """The most lowest-level units (nodes, NVLink domains: the innermost network, however many levels
    draw it, ``coll.per_network``) of the expert group one token's top-k copies reach: at most k, at most
    the units, and with node-limited routing (DeepSeek-V2/V3 ``n_group`` / ``topk_group``; DeepSeek-V3
    report, arXiv 2412.19437, section 2.1.2: "each token will be sent to at most M nodes") at most the
    chosen groups' units (experts laid out in order, a group spanning ceil(units / groups) of them)."""
    units = math.prod(coll.per_network(topo, fanout)[1][1:])
    bound = min(spec.experts_per_token, units)
    if spec.routing_groups > 1:
        bound = min(bound, spec.routing_groups_per_token * -(-units // spec.routing_groups))
    return bound


def split_fanout(fanout: Sequence[int], inner: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A group's fan-out split into sub-groups of ``inner`` consecutive ranks (the lowest levels
    first, as ranks are laid out) and the group across them."""
    inside, across, left = [], [], inner
    for g in fanout:
        take = math.gcd(left, g)
        inside.append(take)
        across.append(g // take)
        left //= take
    assert left == 1, "the sub-group size divides the group"
    return tuple(inside), tuple(across)


def local_kv_bytes(spec: ModelSpec, shard: Shard) -> float:
    """Bytes of the keys and values of a device's own tokens (its share of heads after tp)."""
    return shard.dtype_bytes * shard.tokens * 2 * _kv_per_device(spec, shard.tp)


def _ring(topo: Topology, fanout: Sequence[int], kv_bytes: float, attention_forward_s: float) -> tuple[float, float]:
    """K/V passed round a ring of ranks (Liu et al. 2023, ring attention; Megatron-LM/Transformer
    Engine cp_comm_type p2p), hidden under the attention it feeds; backward, K/V and their
    gradients travel, under the backward attention (twice the forward's time)."""
    ring = (math.prod(fanout) - 1) * coll.send_recv(topo, topo.span_level(fanout), kv_bytes)
    return max(0.0, ring - attention_forward_s), max(0.0, 2 * ring - 2 * attention_forward_s)


def _head_all_to_alls(
    topo: Topology, fanout: Sequence[int], spec: ModelSpec, shard: Shard, copy_s_per_byte: float
) -> float:
    """One direction's exchange of Ulysses sequence parallelism (Jacobs et al. 2023, section 3.1): Q, K
    and V trade their sequence shard for a head shard before attention, the output trades back after
    it (backward: their gradients); not overlapped with compute. Each tensor's layout copies
    (``A2A_LAYOUT_COPIES``) run while the next tensor's all-to-all is in flight, as Transformer Engine
    pipelines them: a tensor costs the longer of the two, and the pipeline's fill and drain one more
    tensor's copies."""
    q = spec.q_channels / shard.tp
    kv = _kv_per_device(spec, shard.tp)
    sizes = [shard.dtype_bytes * shard.tokens * c for c in (q, kv, kv, q)]  # Q, K, V in; the output back
    copies = [2 * A2A_LAYOUT_COPIES * n * copy_s_per_byte for n in sizes]
    steps = [max(coll.all_to_all(topo, fanout, n), c) for n, c in zip(sizes, copies)]
    return sum(steps) + max(copies)


def context_exchange(
    topo: Topology,
    spec: ModelSpec,
    shard: Shard,
    cp: GroupSpan,
    how: CpComm,
    attention_forward_s: float,
    layer: int = 0,
) -> tuple[float, float]:
    """(forward, backward) exposed seconds of block ``layer``'s context-parallel exchange per
    microbatch: the attention's keys and values (``how``), a Mamba-2 mixer's all-to-alls
    (``_mamba_all_to_alls``), nothing in a block without a mixer (its MLP or MoE works token by token)."""
    mixer = spec.mixer_of(layer)
    if cp.size <= 1 or mixer == "none":
        return 0.0, 0.0
    if mixer == "mamba":
        a2a = _mamba_all_to_alls(topo, cp, spec.mamba, shard)
        return a2a, a2a
    kv_bytes = local_kv_bytes(spec, shard)
    if how.kind is CpCommType.P2P:
        return _ring(topo, cp.fanout, kv_bytes, attention_forward_s)
    if how.kind is CpCommType.ALLGATHER:
        # K/V of the whole sequence gathered before attention, again in backward, whose K/V gradients
        # are reduce-scattered (Dubey et al. 2024, section 3.3.2; Transformer Engine's all-gather kind)
        gather = coll.all_gather(topo, cp.fanout, cp.size * kv_bytes)
        return gather, gather + coll.reduce_scatter(topo, cp.fanout, cp.size * kv_bytes)
    if how.kind is CpCommType.A2A:
        a2a = _head_all_to_alls(topo, cp.fanout, spec, shard, how.copy_s_per_byte)
        return a2a, a2a
    inside, across = split_fanout(cp.fanout, how.a2a_size)
    a2a = _head_all_to_alls(topo, inside, spec, shard, how.copy_s_per_byte)
    # after the all-to-all a rank holds a2a_size times the tokens of 1/a2a_size of the heads: the same K/V bytes
    ring_f, ring_b = _ring(topo, across, kv_bytes, attention_forward_s)
    return a2a + ring_f, a2a + ring_b


def _mamba_all_to_alls(topo: Topology, cp: GroupSpan, m: ssm.MambaShape, shard: Shard) -> float:
    """One direction's all-to-alls of a Mamba-2 mixer under context parallelism (Megatron-core
    megatron/core/ssm/mamba_context_parallel.py, MambaContextParallel): ``pre_conv_ssm`` trades the
    in_proj output's sequence shard for a head shard before the conv and the scan (z, x: d / t each;
    B, C: G N / t each, each group repeated cp t / G times first where a rank has fewer groups than
    cp; dt: H / t), ``post_conv_ssm`` trades the scan's output (d / t) back; backward, the same
    all-to-alls transposed; not overlapped with compute. Mamba-1 has no context parallelism
    (strategy/dims.py refuses it)."""
    assert isinstance(m, ssm.Mamba2Shape), "context parallelism runs Mamba-2 mixers only"
    t = shard.tp
    groups = m.groups / t
    repeat = max(1.0, cp.size / groups)
    widths = (
        m.inner / t,
        m.inner / t,
        groups * repeat * m.state_size,
        groups * repeat * m.state_size,
        m.num_heads / t,
        m.inner / t,
    )  # z, x, B, C, dt in; y back
    return sum(coll.all_to_all(topo, cp.fanout, shard.dtype_bytes * shard.tokens * w) for w in widths)


def boundary_time(topo: Topology, spec: ModelSpec, shard: Shard, level: int) -> float:
    """One stage-boundary transfer (activations forward or gradients backward) of one microbatch."""
    return coll.send_recv(topo, level, boundary_bytes(spec, shard))


def grad_sync_time(topo: Topology, group: GroupSpan, grad_bytes: float, param_bytes: float, zero: ZeroStage) -> float:
    """Data-parallel gradient synchronisation of one stage's gradients at the end of a step.

    ZeRO 0: all-reduce. ZeRO 1: reduce-scatter of the gradients (the parameter all-gather
    after the optimizer step is costed by :func:`param_gather_time`). ZeRO 2 and 3 shard the
    gradients, so they are reduce-scattered every microbatch (cost/terms.py); nothing is
    left for the step's end.
    """
    if group.size <= 1 or zero >= ZeroStage.GRADIENTS:
        return 0.0
    if zero == ZeroStage.NONE:
        return coll.all_reduce(topo, group.fanout, grad_bytes)
    return coll.reduce_scatter(topo, group.fanout, grad_bytes)


def param_gather_time(topo: Topology, group: GroupSpan, param_bytes: float, zero: ZeroStage) -> float:
    """ZeRO 1/2: all-gather of the updated parameters after the optimizer step."""
    if group.size <= 1 or zero not in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
        return 0.0
    return coll.all_gather(topo, group.fanout, param_bytes)


def zero3_layer_time(topo: Topology, group: GroupSpan, param_bytes: float, grad_bytes: float) -> tuple[float, float]:
    """ZeRO 3, per microbatch: (forward, backward) seconds of gathering a layer's parameters
    (again in backward) and reduce-scattering its gradients (Rajbhandari et al. 2020, section 7.2.2)."""
    if group.size <= 1:
        return 0.0, 0.0
    gather = coll.all_gather(topo, group.fanout, param_bytes)
    return gather, gather + coll.reduce_scatter(topo, group.fanout, grad_bytes)
