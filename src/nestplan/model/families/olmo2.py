"""OLMo 2: the Llama block with post-norms and full-width QK-norm; written as Llama's fields."""

from __future__ import annotations

from nestplan.model.families.common import (
    MAX_FFN,
    ConfigFields,
    Family,
    decoder_blocks,
    rotary_decoder,
)
from nestplan.model.families.llama import llama_fields
from nestplan.model.facts import FactKeys
from nestplan.model.spec import ModelSpec, QKNorm


def _read_olmo2(f: ConfigFields, name: str) -> ModelSpec:
    """OLMo 2: the Llama block with its two norms after attention and after the MLP instead of before
    (the same parameters) and QK-norm over the full query and key widths (HF modeling_olmo2; OLMo
    Team 2024, "2 OLMo 2 Furious", arXiv 2501.00656 section 3)."""
    fields = rotary_decoder(f, name)
    blocks = decoder_blocks(len(fields["blocks"]), qk_norm=QKNorm.FULL)
    fields |= {"blocks": blocks, "linear_bias": f.flag("attention_bias", False)}
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields)


FAMILIES = (Family("olmo2", _read_olmo2, llama_fields, 2048, facts=FactKeys(("rms_norm_eps", 1e-5))),)
