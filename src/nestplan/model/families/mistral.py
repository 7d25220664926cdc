"""Mistral and Mixtral: the rotary decoder with a ``sliding_window`` on every layer (null: full
attention). Mixtral has no dense MLP: its ``intermediate_size`` is the expert width and fills both
``ffn_hidden_size`` and ``moe_ffn_hidden_size``; every layer is MoE."""

from __future__ import annotations

from typing import Any

from nestplan.model.families.common import (
    MAX_FFN,
    ConfigFields,
    Family,
    every_layer,
    expert_counts,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys, RouterKeys, RouterScore
from nestplan.model.spec import ModelSpec


def _read_mistral(f: ConfigFields, name: str) -> ModelSpec:
    fields = rotary_decoder(f, name)
    return ModelSpec(
        ffn_hidden_size=f.integer("intermediate_size", MAX_FFN),
        **fields | {"blocks": every_layer(f, len(fields["blocks"]), 4096)},
    )


def mistral_fields(spec: ModelSpec) -> dict[str, Any]:
    """Mistral (and Phi-3's first fields): one window for every layer."""
    return {**rotary_fields(spec), "intermediate_size": spec.ffn_hidden_size, "sliding_window": spec.sliding_window}


def _read_mixtral(f: ConfigFields, name: str) -> ModelSpec:
    fields = rotary_decoder(f, name)
    fields["blocks"] = every_layer(f, len(fields["blocks"]), None, moe=True)
    experts, top_k = expert_counts(f, "num_local_experts")
    expert_ffn = f.integer("intermediate_size", MAX_FFN)
    return ModelSpec(
        ffn_hidden_size=expert_ffn,
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=expert_ffn,
        **fields,
    )


def _mixtral_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.moe_ffn_hidden_size,
        "sliding_window": spec.sliding_window,
        "num_local_experts": spec.num_experts,
        "num_experts_per_tok": spec.experts_per_token,
    }


# HF MixtralConfig: a softmax over the top-k logits (renormalised), its base 1e6
_MIXTRAL = FactKeys(
    ("rms_norm_eps", 1e-5), rope_theta=1_000_000.0, router=RouterKeys((None, RouterScore.SOFTMAX), (None, True))
)

FAMILIES = (
    Family("mistral", _read_mistral, mistral_fields, 4096 * 32, facts=FactKeys(("rms_norm_eps", 1e-6))),
    Family("mixtral", _read_mixtral, _mixtral_fields, 4096 * 32, facts=_MIXTRAL),
)
