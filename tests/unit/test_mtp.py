"""Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2) as Megatron-Core runs it
(``--mtp-num-layers``, multi_token_prediction.py): each module on the last pipeline stage is a block
like the last main one, an embedding lookup and the output head again (the main model's weights,
an embedding copy on the last of several stages), and its own norms and projection M."""

from __future__ import annotations

import dataclasses

import pytest

from nestplan import api
from nestplan.cost import terms as T
from nestplan.cost.evaluator import _model_flops, evaluate_plan
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import place

MODEL = api.resolve_model("deepseek-v2-lite")
CLUSTER = api.resolve_cluster("dgx-h100", 16)
JOB = Job(global_batch_size=64, seq_len=4096)
DIMS = ParallelDims(tp=2, sp=True, ep=4, pp=2, dp=1, zero=1, layers_per_stage=(14, 13))


def _terms(model, dims=DIMS):
    return T.graph_terms(model, CLUSTER, dims, JOB, place(dims, CLUSTER.topology).groups)


def test_an_mtp_module_adds_a_block_a_lookup_a_head_and_its_projection_to_the_head_node() -> None:
    with_mtp = dataclasses.replace(MODEL, mtp_layers=1)
    plain, mtp = _terms(MODEL), _terms(with_mtp)
    last = plain.blocks[MODEL.block_kind(MODEL.num_layers - 1)]
    shard = T.shard_of(DIMS.subgraph, JOB)
    own = T._mtp_own(with_mtp, shard, T.mtp_own_time(CLUSTER.accelerator, with_mtp, shard, JOB.dtype), 0.0)
    added = mtp.head.cycle - plain.head.cycle
    assert added == pytest.approx(last.cycle + plain.embedding.cycle + plain.head.cycle + own.cycle, rel=0.02)
    assert own.components["forward_compute"] > 0
    # its parameters: the block's and its own (M, two norms); the lookup and the head share the main weights
    assert mtp.head.params.total == pytest.approx(
        plain.head.params.total + last.params.total + L.mtp_own_params_per_device(with_mtp, shard)
    )
    # its logits and block activations are kept too
    assert mtp.head.activations > plain.head.activations + last.activations


def test_the_last_of_several_stages_keeps_an_embedding_copy_for_the_mtp_lookup() -> None:
    untied = dataclasses.replace(MODEL, mtp_layers=1)
    assert not untied.tied_embeddings
    assert _terms(MODEL).embedding_copy.total == 0
    assert _terms(untied).embedding_copy.total == pytest.approx(_terms(untied).embedding.params.total)


def test_mtp_slows_the_last_stage_and_counts_in_the_model_flops() -> None:
    with_mtp = dataclasses.replace(MODEL, mtp_layers=1)
    plain = evaluate_plan(MODEL, CLUSTER, DIMS, JOB)
    mtp = evaluate_plan(with_mtp, CLUSTER, DIMS, JOB)
    assert mtp.stages[-1].cycle_s > plain.stages[-1].cycle_s
    assert mtp.stages[0].cycle_s == pytest.approx(plain.stages[0].cycle_s)
    assert mtp.stages[-1].peak_memory_bytes > plain.stages[-1].peak_memory_bytes
    seq = JOB.seq_len
    module = (
        L.block_model_flops(MODEL, MODEL.num_layers - 1, seq, seq, attended=True)
        + L.head_model_flops(MODEL, seq)
        + 2 * seq * 2 * MODEL.hidden_size**2
    )
    model_plain, _ = _model_flops(MODEL, seq, 1, Recompute.NONE)
    model_mtp, _ = _model_flops(with_mtp, seq, 1, Recompute.NONE)
    assert model_mtp - model_plain == pytest.approx(3 * module)


def test_megatron_layout_places_the_mtp_modules_before_the_loss() -> None:
    """Megatron-core's layout must count the MTP modules (m) in the last virtual stage, after every decoder
    layer (pipeline_parallel_layer_layout.py validate_layer_layout)."""
    from nestplan.export import megatron

    dims = ParallelDims(
        tp=1, ep=8, pp=2, dp=1, zero=1, virtual_stages=2, schedule=Schedule.INTERLEAVED, layers_per_stage=(7, 7, 7, 6)
    )
    plan = api.evaluate_full(dataclasses.replace(MODEL, mtp_layers=1), CLUSTER, dims, JOB, devices=16).plan
    text = megatron.layout(plan)
    assert text.endswith("t*6mL") and text.count("m") == 1
