"""GPT-2, GPT-NeoX and BERT: LayerNorm, a GeLU MLP and biases everywhere, MHA; GPT-2 and BERT learn
their positions (GPT-NeoX rotates them), BERT attends both ways and adds token types. Dropout
defaults to 0.1 in GPT-2 and BERT, 0.0 in GPT-NeoX. GPT-NeoX's parallel residual (x + attn(ln1(x)) +
mlp(ln2(x))) has the sequential block's GEMMs and norms, and rotary_pct changes only which channels
RoPE rotates: both harmless."""

from __future__ import annotations

from functools import partial
from typing import Any

from nestplan.inputs import MISSING
from nestplan.model.families.common import (
    MAX_LAYERS,
    MAX_VOCAB,
    ConfigFields,
    Family,
    attention_shape,
    decoder_blocks,
    decoder_fields,
    dropout_fields,
)
from nestplan.model.facts import FactKeys
from nestplan.model.spec import ModelSpec


_GPT2_KEYS = ("n_embd", "n_head", "n_layer", "n_inner", "n_positions")
_ENCODER_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "max_position_embeddings",
)


def _read_layernorm_mha(
    f: ConfigFields,
    name: str,
    keys: tuple[str, str, str, str, str],
    *,
    tied: bool,
    learned_positions: bool,
    dropouts: dict[str, float],
    ffn_per_hidden: int | None = None,
    causal: bool = True,
    token_types: bool = False,
) -> ModelSpec:
    """LayerNorm, GeLU MLP, biases, MHA, read under ``keys`` (hidden, heads, layers, FFN width,
    positions); the FFN width defaults to ``ffn_per_hidden`` times the hidden size where given."""
    hidden_key, heads_key, layers_key, ffn_key, positions_key = keys
    shape = attention_shape(f, hidden_key, heads_key, None, None)
    blocks = decoder_blocks(f.integer(layers_key, MAX_LAYERS))
    ffn_default = ffn_per_hidden * shape[0] if ffn_per_hidden else MISSING
    return ModelSpec(
        **decoder_fields(f, name, shape, blocks, (ffn_key, ffn_default), tied=tied, positions_key=positions_key),
        gated_mlp=False,
        learned_position_embeddings=learned_positions,
        norm="layernorm",
        linear_bias=True,
        dropout=f.any_dropout(dropouts),
        causal=causal,
        type_vocab_size=f.integer("type_vocab_size", MAX_VOCAB, default=2, minimum=0) if token_types else 0,
    )


_read_gpt2 = partial(
    _read_layernorm_mha,
    keys=_GPT2_KEYS,
    tied=True,
    learned_positions=True,
    dropouts={"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
    ffn_per_hidden=4,
)
_read_gpt_neox = partial(
    _read_layernorm_mha,
    keys=_ENCODER_KEYS,
    tied=False,
    learned_positions=False,
    dropouts={"attention_dropout": 0.0, "hidden_dropout": 0.0},
)
_read_bert = partial(
    _read_layernorm_mha,
    keys=_ENCODER_KEYS,
    tied=True,
    learned_positions=True,
    causal=False,
    token_types=True,
    dropouts={"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
)


def _gpt2_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "n_embd": spec.hidden_size,
        "n_head": spec.num_heads,
        "n_layer": spec.num_layers,
        "n_inner": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "n_positions": spec.max_position_embeddings,
        **dropout_fields(spec, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
    }


def _encoder_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "intermediate_size": spec.ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
    }


def _gpt_neox_fields(spec: ModelSpec) -> dict[str, Any]:
    return {**_encoder_fields(spec), **dropout_fields(spec, "attention_dropout", "hidden_dropout")}


def _bert_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **_encoder_fields(spec),
        "type_vocab_size": spec.type_vocab_size,
        **dropout_fields(spec, "hidden_dropout_prob", "attention_probs_dropout_prob"),
    }


FAMILIES = (
    Family(
        "gpt2",
        _read_gpt2,
        _gpt2_fields,
        1024,
        facts=FactKeys(("layer_norm_epsilon", 1e-5), ("activation_function", "gelu_new"), None),
    ),
    Family(
        "gpt_neox",
        _read_gpt_neox,
        _gpt_neox_fields,
        2048,
        harmless_keys=("use_parallel_residual", "rotary_pct"),
        facts=FactKeys(("layer_norm_eps", 1e-5), ("hidden_act", "gelu")),
    ),
    Family(
        "bert", _read_bert, _bert_fields, 512, facts=FactKeys(("layer_norm_eps", 1e-12), ("hidden_act", "gelu"), None)
    ),
)
