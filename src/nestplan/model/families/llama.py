"""Llama (HF modeling_llama): the rotary decoder (RMSNorm, RoPE, gated SiLU MLP, GQA); biases where
``attention_bias`` or ``mlp_bias`` (recorded as ``linear_bias``)."""

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


def _read_llama(f: ConfigFields, name: str) -> ModelSpec:
    bias = f.flag("attention_bias", False) or f.flag("mlp_bias", False)
    fields = rotary_decoder(f, name) | {"linear_bias": bias}
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields)


def llama_fields(spec: ModelSpec) -> dict[str, Any]:
    return {**rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, "attention_bias": spec.linear_bias}


FAMILIES = (Family("llama", _read_llama, llama_fields, 2048, facts=FactKeys(("rms_norm_eps", 1e-6))),)
