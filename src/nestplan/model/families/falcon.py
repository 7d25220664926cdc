"""Falcon: the parallel attention + MLP block (``parallel_block``)."""

from __future__ import annotations

from typing import Any

from nestplan.model.families.common import (
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    ConfigFields,
    Family,
    decoder_blocks,
    decoder_fields,
    dropout_fields,
)
from nestplan.model.facts import FactKeys
from nestplan.model.spec import ModelSpec


def _read_falcon(f: ConfigFields, name: str) -> ModelSpec:
    """Falcon (HF modeling_falcon; Almazrouei et al. 2023, arXiv 2311.16867): attention and a non-gated
    GeLU MLP of ``ffn_hidden_size`` (default 4 h) in parallel on the block input (``parallel_attn``,
    default true), LayerNorm, rotary positions (ALiBi is refused), biases where ``bias``; key/value heads
    ``num_kv_heads`` with ``new_decoder_architecture`` or without ``multi_query``, else one (multi-query);
    one norm per parallel block, two (ln_attn, ln_mlp) where ``num_ln_in_parallel_attn`` is 2 (the
    default with new_decoder_architecture), two in a sequential block."""
    hidden = f.integer("hidden_size", MAX_HIDDEN)
    heads = f.integer("num_attention_heads", MAX_HEADS)
    if hidden % heads:
        raise f.error(
            f"num_attention_heads {heads} does not divide hidden_size {hidden}", "num_attention_heads", heads, hidden
        )
    if f.flag("alibi", False):
        raise f.error(
            "field 'alibi' true (ALiBi positions) is not honoured; nestplan costs rotary positions",
            "alibi",
            True,
            "false",
        )
    new_arch, multi_query = f.flag("new_decoder_architecture", False), f.flag("multi_query", True)
    kv_heads = f.integer("num_kv_heads", MAX_HEADS, default=heads)  # HF saves it whatever the architecture
    if heads % kv_heads:
        raise f.error(
            f"num_kv_heads {kv_heads} does not divide num_attention_heads {heads}", "num_kv_heads", kv_heads, heads
        )
    if multi_query and not new_arch:
        kv_heads = 1
    parallel = f.flag("parallel_attn", True)
    one_or_two = f.integer("num_ln_in_parallel_attn", 2, default=2 if new_arch else 1)
    norms = one_or_two if parallel else 2
    shape = (hidden, heads, kv_heads, hidden // heads)
    blocks = decoder_blocks(f.integer("num_hidden_layers", MAX_LAYERS))
    return ModelSpec(
        **decoder_fields(f, name, shape, blocks, ("ffn_hidden_size", 4 * hidden), tied=True),
        gated_mlp=False,
        learned_position_embeddings=False,
        norm="layernorm",
        linear_bias=f.flag("bias", False),
        dropout=f.any_dropout({"hidden_dropout": 0.0, "attention_dropout": 0.0}),
        block_norms=norms,
        parallel_block=parallel,
    )


def _falcon_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "new_decoder_architecture": True,
        "parallel_attn": spec.parallel_block,
        "num_ln_in_parallel_attn": spec.block_norms if spec.parallel_block else None,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "bias": spec.linear_bias,
        **dropout_fields(spec, "hidden_dropout", "attention_dropout"),
    }


FAMILIES = (
    Family(
        "falcon",
        _read_falcon,
        _falcon_fields,
        2048,
        facts=FactKeys(("layer_norm_epsilon", 1e-5), ("activation", "gelu")),
    ),
)  # HF FalconConfig
