"""Model files read as their authors meant them, and counted as the frameworks count them (issue 30):
Llama 4's empty ``no_rope_layers``, model FLOPs with causal attention."""

from __future__ import annotations

import pytest

from nestplan import api
from nestplan.cost.evaluator import evaluate_plan
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.config import config_dict, load_model, parse_config
from nestplan.strategy.dims import ParallelDims


@pytest.mark.parametrize("given", [[], None])
def test_llama4_no_rope_layers_empty_or_null_is_computed_from_the_interval(given) -> None:
    """HF Llama4TextConfig's default ``no_rope_layers=[]`` is replaced by every ``no_rope_layer_interval``-th
    layer without rotary positions: an empty list is read as the absent field."""
    config = config_dict(load_model("llama4-scout"))
    config.pop("layer_types")
    absent = {k: v for k, v in config.items() if k != "no_rope_layers"}
    spec = parse_config(config | {"no_rope_layers": given}, "scout")
    assert spec == parse_config(absent, "scout") == parse_config(config, "scout")
    assert [i for i, block in enumerate(spec.blocks) if not block.rope] == list(range(3, spec.num_layers, 4))


def test_model_flops_count_the_causal_half_of_attention_as_megatron_does() -> None:
    """MFU's model FLOPs count the query-key pairs a causal model attends (Megatron-LM's
    num_floating_point_operations: the square halved), as the attention's time is costed."""
    model, seq = load_model("llama3-8b"), 8192
    job = Job(global_batch_size=8, seq_len=seq)
    pred = evaluate_plan(model, api.resolve_cluster("dgx-h100", 8), ParallelDims(tp=8), job)
    blocks = sum(L.block_model_flops(model, i, seq, seq, attended=True) for i in range(model.num_layers))
    assert pred.model_flops_per_step == pytest.approx(3 * 8 * (blocks + L.head_model_flops(model, seq)))
    full = L.block_model_flops(model, 0, seq, seq)
    half = L.block_model_flops(model, 0, seq, seq, attended=True)
    assert full - half == pytest.approx(seq * L.attention_model_flops(model, 0, seq) / 2)


def test_mfu_at_long_sequences_stays_below_what_the_attention_time_allows() -> None:
    """At 128k tokens attention dominates: counted over the whole square, MFU read 73% of a step whose
    attention the kernels run causal; counted causal it is the fraction of peak the costed work is."""
    model = parse_config(config_dict(load_model("llama3-8b")) | {"max_position_embeddings": 131072}, "l128k")
    pred = api.evaluate(model, "dgx-h100", ParallelDims(cp=8, recompute="full"), Job(8, 131072), devices=8)
    assert pred.mfu < 0.5  # 0.732 with the whole square counted
