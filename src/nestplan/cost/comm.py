"""Communication of a plan: intra-layer collectives (tp, sp, cp, ep), stage-boundary
transfers, data-parallel gradient synchronisation and ZeRO gathers.

Every collective goes through ``nestplan.network.collectives`` with the fan-out the
placement gives its group, so the level a group spans sets its cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nestplan.job import CpCommType
from nestplan.model.layers import Shard, _kv_per_device, boundary_bytes
from nestplan.model.spec import ModelSpec
from nestplan.network import collectives as coll
from nestplan.network.topology import Topology
from nestplan.strategy.placement import GroupSpan


@dataclass(frozen=True)
class LayerComm:
    """Seconds per microbatch of one layer's collectives on the critical path."""

    tp_forward: float = 0.0
    tp_backward: float = 0.0
    cp_forward: float = 0.0   # exposed part only (ring exchange overlaps the attention core)
    cp_backward: float = 0.0
    ep_forward: float = 0.0
    ep_backward: float = 0.0


@dataclass(frozen=True)
class CpComm:
    """How context parallelism exchanges keys and values (``job.CpCommType``) and the all-to-all
    group's size of the hierarchical kind."""

    kind: CpCommType = CpCommType.P2P
    a2a_size: int = 1


def tp_collectives(topo: Topology, tp: GroupSpan, shard: Shard, hidden: int, count: int,
                   gather_bytes: int | None = None) -> float:
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


def _all_gather(topo: Topology, tp: GroupSpan, shard: Shard, hidden: int, gather_bytes: int | None) -> float:
    element = shard.dtype_bytes if gather_bytes is None else gather_bytes
    return coll.all_gather(topo, tp.fanout, element * shard.tokens * hidden)


def _reduce_scatter(topo: Topology, tp: GroupSpan, shard: Shard, hidden: int) -> float:
    return coll.reduce_scatter(topo, tp.fanout, shard.dtype_bytes * shard.tokens * hidden)


def overlapped(collective_s: float, gemm_s: float, chunks: int) -> float:
    """Exposed seconds of a collective pipelined with the GEMM that produces or consumes it, both
    split into ``chunks`` pieces (Transformer Engine's userbuffer overlap, Megatron-LM
    --tp-comm-overlap; Wang et al., ASPLOS 2023, "Overlap communication with dependent computation
    via decomposition"): the first piece cannot hide, the rest hides under the GEMM while it lasts."""
    piece = collective_s / chunks
    return piece + max(0.0, collective_s - piece - gemm_s)


def _tp_exposed(topo: Topology, tp: GroupSpan, shard: Shard, hidden: int, pairs: Sequence[tuple[float, float]],
                gather_bytes: int | None) -> tuple[float, float]:
    """(forward, backward) exposed tp collectives of the sub-blocks whose GEMMs overlap them;
    ``pairs``: (forward, backward) seconds of each sub-block's column- and row-parallel GEMM, in
    that order. Forward, the all-gather hides under the column-parallel GEMM and the reduce-scatter
    under the row-parallel one. Backward, the row-parallel GEMM's grad-output all-gather hides under
    its data-gradient product and the column-parallel GEMM's input-gradient reduce-scatter under its
    weight-gradient product: each half of the GEMM's backward."""
    gather = _all_gather(topo, tp, shard, hidden, gather_bytes)
    scatter = _reduce_scatter(topo, tp, shard, hidden)
    forward = backward = 0.0
    for column, row in zip(pairs[::2], pairs[1::2]):
        forward += overlapped(gather, column[0], tp.size) + overlapped(scatter, row[0], tp.size)
        backward += overlapped(gather, row[1] / 2, tp.size) + overlapped(scatter, column[1] / 2, tp.size)
    return forward, backward


def routed_tokens_per_token(spec: ModelSpec, layer: int) -> int:
    """Copies of each token an MoE block's routed experts receive (top-k), 0 in a dense block."""
    return spec.experts_per_token if spec.is_moe_layer(layer) else 0


def _mlp_syncs(topo: Topology, tp: GroupSpan, etp: GroupSpan, shard: Shard, spec: ModelSpec, layer: int,
               gather_bytes: int | None) -> float:
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
        routed = copies * (coll.all_gather(topo, etp.fanout, gathered) + coll.reduce_scatter(topo, etp.fanout, gathered))
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
) -> LayerComm:
    """Collectives of one transformer block: 2 tp syncs forward and 2 backward (Megatron
    column/row-parallel pair per sub-block, Shoeybi et al. 2019 Figure 3; an MoE block's MLP
    syncs its routed token copies, ``_mlp_syncs``), the context-parallel exchange of keys and
    values (``context_exchange``), the expert all-to-alls (dispatch and combine).

    With ``tp_overlap`` (and sequence parallelism, which Megatron-LM requires for it) each tp
    all-gather and reduce-scatter hides under its GEMM (``overlapped``); ``gemms`` are the block's
    (forward, backward) GEMM seconds in ``model.layers.block_gemms`` order. Transformer Engine
    overlaps its own linear layers: the attention projections always, the MLP's only in a dense
    block (experts run as grouped GEMMs without it). ``gather_bytes``: the all-gathers' bytes per
    element when they move FP8 operands (``tp_collectives``)."""
    tp, hidden = groups["tp"], spec.hidden_size
    moe = spec.is_moe_layer(layer)
    if tp_overlap and shard.sp_div > 1:
        pairs = [gemms[0], gemms[1]] + ([] if moe else [gemms[2], gemms[3]])
        tp_f, tp_b = _tp_exposed(topo, tp, shard, hidden, pairs, gather_bytes)
    else:
        tp_f = tp_b = tp_collectives(topo, tp, shard, hidden, 1 if moe else 2, gather_bytes)
    if moe:
        mlp = _mlp_syncs(topo, tp, groups["etp"], shard, spec, layer, gather_bytes)
        tp_f, tp_b = tp_f + mlp, tp_b + mlp
    cp_f, cp_b = context_exchange(topo, spec, shard, groups["cp"], cp_comm, attention_forward_s)
    ep_f = 0.0
    experts = groups["expert"]   # ep x tp / etp ranks holding different experts
    if moe and experts.size > 1:
        # each rank sends top-k copies of its sequence-parallel share of the tokens
        routed = shard.dtype_bytes * shard.tokens * spec.experts_per_token * spec.hidden_size / shard.tp
        ep_f = 2 * coll.all_to_all(topo, experts.fanout, routed)   # dispatch + combine
    return LayerComm(tp_forward=tp_f, tp_backward=tp_b, cp_forward=cp_f, cp_backward=cp_b,
                     ep_forward=ep_f, ep_backward=ep_f)


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


def _head_all_to_alls(topo: Topology, fanout: Sequence[int], spec: ModelSpec, shard: Shard) -> float:
    """One direction's all-to-alls of Ulysses sequence parallelism (Jacobs et al. 2023, section
    3.1): Q, K and V trade their sequence shard for a head shard before attention, the output
    trades back after it; not overlapped with compute."""
    q = spec.q_channels / shard.tp
    kv = _kv_per_device(spec, shard.tp)
    tensors = (q, kv, kv, q)   # Q, K, V in; the attention output back
    return sum(coll.all_to_all(topo, fanout, shard.dtype_bytes * shard.tokens * c) for c in tensors)


def context_exchange(topo: Topology, spec: ModelSpec, shard: Shard, cp: GroupSpan, how: CpComm,
                     attention_forward_s: float) -> tuple[float, float]:
    """(forward, backward) exposed seconds of one block's context-parallel exchange per microbatch."""
    if cp.size <= 1:
        return 0.0, 0.0
    kv_bytes = local_kv_bytes(spec, shard)
    if how.kind is CpCommType.P2P:
        return _ring(topo, cp.fanout, kv_bytes, attention_forward_s)
    if how.kind is CpCommType.ALLGATHER:
        # K/V of the whole sequence gathered before attention, again in backward, whose K/V gradients
        # are reduce-scattered (Dubey et al. 2024, section 3.3.2; Transformer Engine's all-gather kind)
        gather = coll.all_gather(topo, cp.fanout, cp.size * kv_bytes)
        return gather, gather + coll.reduce_scatter(topo, cp.fanout, cp.size * kv_bytes)
    if how.kind is CpCommType.A2A:
        a2a = _head_all_to_alls(topo, cp.fanout, spec, shard)
        return a2a, a2a
    inside, across = split_fanout(cp.fanout, how.a2a_size)
    a2a = _head_all_to_alls(topo, inside, spec, shard)
    # after the all-to-all a rank holds a2a_size times the tokens of 1/a2a_size of the heads: the same K/V bytes
    ring_f, ring_b = _ring(topo, across, kv_bytes, attention_forward_s)
    return a2a + ring_f, a2a + ring_b


def boundary_time(topo: Topology, spec: ModelSpec, shard: Shard, level: int) -> float:
    """One stage-boundary transfer (activations forward or gradients backward) of one microbatch."""
    return coll.send_recv(topo, level, boundary_bytes(spec, shard))


def grad_sync_time(topo: Topology, group: GroupSpan, grad_bytes: float, param_bytes: float, zero: int) -> float:
    """Data-parallel gradient synchronisation of one stage's gradients at the end of a step.

    ZeRO 0: all-reduce. ZeRO 1: reduce-scatter of the gradients (the parameter all-gather
    after the optimizer step is costed by :func:`param_gather_time`). ZeRO 2 and 3 shard the
    gradients, so they are reduce-scattered every microbatch (cost/terms.py); nothing is
    left for the step's end.
    """
    if group.size <= 1 or zero >= 2:
        return 0.0
    if zero == 0:
        return coll.all_reduce(topo, group.fanout, grad_bytes)
    return coll.reduce_scatter(topo, group.fanout, grad_bytes)


def param_gather_time(topo: Topology, group: GroupSpan, param_bytes: float, zero: int) -> float:
    """ZeRO 1/2: all-gather of the updated parameters after the optimizer step."""
    if group.size <= 1 or zero not in (1, 2):
        return 0.0
    return coll.all_gather(topo, group.fanout, param_bytes)


def zero3_layer_time(topo: Topology, group: GroupSpan, param_bytes: float, grad_bytes: float) -> tuple[float, float]:
    """ZeRO 3, per microbatch: (forward, backward) seconds of gathering a layer's parameters
    (again in backward) and reduce-scattering its gradients (Rajbhandari et al. 2020, section 7.2.2)."""
    if group.size <= 1:
        return 0.0, 0.0
    gather = coll.all_gather(topo, group.fanout, param_bytes)
    return gather, gather + coll.reduce_scatter(topo, group.fanout, grad_bytes)
