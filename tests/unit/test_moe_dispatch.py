"""An MoE block's tensor-parallel traffic and token regrouping under Megatron-Core's all-to-all
dispatcher (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher): after
the expert all-to-all the permuted token copies are all-gathered over tp (and reduce-scattered
after the experts), then regrouped by local expert (sort_chunks_by_idxs)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nestplan import api
from nestplan.cost import comm
from nestplan.cost.compute import _elementwise_bytes
from nestplan.model.layers import Shard
from nestplan.strategy.placement import GroupSpan

CLUSTER = api.resolve_cluster("dgx-h100", 64)
MIXTRAL = api.resolve_model("mixtral-8x7b")
LEVELS = CLUSTER.topology.num_levels


def _group(size: int) -> GroupSpan:
    return GroupSpan(size=size, fanout=(size,) + (1,) * (LEVELS - 1), level=0)


def _groups(tp: int) -> dict[str, GroupSpan]:
    return {"tp": _group(tp), "cp": _group(1), "expert": _group(1), "etp": _group(tp)}


def _tp_forward(spec, tp: int, gather_bytes: int | None = None) -> float:
    shard = Shard(tp=tp, sp=tp > 1, seq_len=4096)  # sequence parallelism needs tp > 1
    return comm.block_comm(CLUSTER.topology, spec, 0, shard, _groups(tp), 0.0, gather_bytes=gather_bytes).tp_forward


def test_routed_experts_sync_top_k_copies_of_each_token() -> None:
    """Attention syncs the tokens once; the routed experts' gather and scatter move top-k copies."""
    one = comm.tp_collectives(CLUSTER.topology, _group(4), Shard(tp=4, sp=True, seq_len=4096), MIXTRAL.hidden_size, 1)
    assert MIXTRAL.experts_per_token == 2 and MIXTRAL.num_shared_experts == 0
    assert _tp_forward(MIXTRAL, 4) == pytest.approx(one * (1 + 2))
    top4 = replace(MIXTRAL, experts_per_token=4)
    assert _tp_forward(top4, 4) == pytest.approx(one * (1 + 4))


def test_routed_gather_moves_the_activations_dtype_under_fp8() -> None:
    """FP8 operands are gathered in one byte by the attention's column-parallel layer; the dispatcher
    gathers bf16 token copies (the experts cast after the gather), so only the attention part shrinks."""
    shard = Shard(tp=4, sp=True, seq_len=4096)
    attention_bf16 = comm.tp_collectives(CLUSTER.topology, _group(4), shard, MIXTRAL.hidden_size, 1)
    attention_fp8 = comm.tp_collectives(CLUSTER.topology, _group(4), shard, MIXTRAL.hidden_size, 1, gather_bytes=1)
    saved = _tp_forward(MIXTRAL, 4) - _tp_forward(MIXTRAL, 4, gather_bytes=1)
    assert saved == pytest.approx(attention_bf16 - attention_fp8)


def test_shared_experts_sync_the_tokens_once() -> None:
    shared = replace(MIXTRAL, num_shared_experts=1, shared_expert_ffn_hidden_size=MIXTRAL.moe_ffn_hidden_size)
    one = comm.tp_collectives(CLUSTER.topology, _group(4), Shard(tp=4, sp=True, seq_len=4096), MIXTRAL.hidden_size, 1)
    assert _tp_forward(shared, 4) == pytest.approx(one * (1 + 2 + 1))


def test_no_tp_no_sync() -> None:
    assert _tp_forward(MIXTRAL, 1) == 0.0


def test_tokens_are_regrouped_where_a_device_holds_several_experts() -> None:
    """With 8 experts over ep 2 each device regroups its received copies by local expert and back
    (read and write each time); with one expert per device (ep 8) nothing is regrouped."""
    shard = Shard(tp=1, ep=2, seq_len=4096)
    copies = shard.tokens * MIXTRAL.experts_per_token * MIXTRAL.hidden_size
    several = _elementwise_bytes(MIXTRAL, 0, shard)
    one_each = _elementwise_bytes(MIXTRAL, 0, replace(shard, ep=8))
    assert several - one_each == pytest.approx(2 * 2 * shard.dtype_bytes * copies)
