"""Nemotron (``NemotronForCausalLM``): a rotary decoder with a non-gated MLP of two projections (up,
down: squared ReLU, ``hidden_act`` "relu2", whatever the activation), LayerNorm (its layernorm1p
stores weight - 1: the same 2 h parameters) and rotary positions on ``partial_rotary_factor``
(default 0.5) of each head, ``rotary_fraction``; biases as Llama."""

from __future__ import annotations

from typing import Any

from nestplan.model.families.common import (
    MAX_FFN,
    ConfigFields,
    Family,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys
from nestplan.model.spec import ModelSpec


def _read_nemotron(f: ConfigFields, name: str) -> ModelSpec:
    """Nemotron: the rotary decoder's attention with a squared-ReLU MLP of two projections, LayerNorm
    and partial rotary positions (HF NemotronConfig: partial_rotary_factor 0.5, no biases by default)."""
    fields = rotary_decoder(f, name) | {
        "gated_mlp": False,
        "norm": "layernorm",
        "linear_bias": f.flag("attention_bias", False) or f.flag("mlp_bias", False),
        "rotary_fraction": f.fraction("partial_rotary_factor", 0.5),
    }
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields)


def _nemotron_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "attention_bias": spec.linear_bias,
        "mlp_bias": spec.linear_bias,
        "partial_rotary_factor": spec.rotary_fraction,
    }


FAMILIES = (
    Family(
        "nemotron", _read_nemotron, _nemotron_fields, 4096, facts=FactKeys(("norm_eps", 1e-5), ("hidden_act", "relu2"))
    ),
)
