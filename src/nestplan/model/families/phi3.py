"""Phi-3: Mistral's block and windows with partial rotary positions."""

from __future__ import annotations

from typing import Any

from nestplan.model.families.common import (
    MAX_FFN,
    ConfigFields,
    Family,
    every_layer,
    rotary_decoder,
)
from nestplan.model.families.mistral import mistral_fields
from nestplan.model.facts import FactKeys
from nestplan.model.spec import ModelSpec


def _read_phi3(f: ConfigFields, name: str) -> ModelSpec:
    """Phi-3: the Llama block with fused qkv_proj and gate_up_proj (the same weights and FLOPs as the
    separate projections, HF modeling_phi3), a ``sliding_window`` on every layer where set, rotary
    positions on ``partial_rotary_factor`` (default 1) of each head."""
    fields = rotary_decoder(f, name) | {
        "rotary_fraction": f.fraction("partial_rotary_factor", 1.0),
        "dropout": f.any_dropout({"attention_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    }
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN),
        **fields | {"blocks": every_layer(f, len(fields["blocks"]), None)},
    )


def _phi3_fields(spec: ModelSpec) -> dict[str, Any]:
    """Mistral's fields (one window for every layer) and the share of each head that RoPE rotates."""
    return {**mistral_fields(spec), "partial_rotary_factor": spec.rotary_fraction}


FAMILIES = (Family("phi3", _read_phi3, _phi3_fields, 4096, facts=FactKeys(("rms_norm_eps", 1e-5))),)
