"""Gemma 2 and Gemma 3 (text): local sliding-window layers between global ones (``layer_types``
names them where given). Logit soft-capping is harmless: a tanh on the scores and logits that adds
no parameter, FLOP or stored byte nestplan counts (Gemma 2 report, Gemma Team 2024, arXiv 2408.00118
section 2; with flash attention it runs inside the kernel)."""

from __future__ import annotations

from typing import Any

from nestplan.model.families.common import (
    MAX_FFN,
    MAX_LAYERS,
    ConfigFields,
    Family,
    decoder_blocks,
    layer_types,
    rotary_decoder,
    rotary_fields,
)
from nestplan.model.facts import FactKeys
from nestplan.model.spec import ModelSpec, QKNorm


def _read_gemma(f: ConfigFields, name: str) -> ModelSpec:
    """Gemma 2 and Gemma 3 (text): four RMSNorms per block (before and after attention and the MLP),
    a gated GeLU MLP, tied embeddings, ``head_dim`` explicit (default 256), local sliding-window layers
    between global ones: Gemma 2 every other layer from the first (HF Gemma2Config layer_types:
    sliding where (i + 1) % 2), Gemma 3 all but every ``sliding_window_pattern``-th (default 6: 5 local
    to 1 global, Gemma 3 report arXiv 2503.19786 section 2.2), window default 4096; Gemma 3 adds QK-norm
    of head_dim (HF modeling_gemma3 q_norm/k_norm). The embedding scale by sqrt(hidden) and soft-capping
    add no parameters and no FLOPs worth counting."""
    fields = rotary_decoder(f, name, head_dim_default=256) | {
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "block_norms": 4,
    }
    num_layers, window, qk_norm = len(fields["blocks"]), f.window(4096), QKNorm.NONE
    if f.family == "gemma2":
        layers = f.sliding_layers(num_layers, lambda i: (i + 1) % 2 != 0)
    else:
        pattern = f.integer("sliding_window_pattern", MAX_LAYERS, default=6)
        layers = f.sliding_layers(num_layers, lambda i: (i + 1) % pattern != 0)
        qk_norm = QKNorm.HEAD
    blocks = decoder_blocks(num_layers, window, layers, qk_norm=qk_norm)
    return ModelSpec(ffn_hidden_size=f.integer("intermediate_size", MAX_FFN), **fields | {"blocks": blocks})


def _gemma_fields(spec: ModelSpec) -> dict[str, Any]:
    return {
        **rotary_fields(spec),
        "intermediate_size": spec.ffn_hidden_size,
        "sliding_window": spec.sliding_window,
        "layer_types": layer_types(spec),
    }


_SOFTCAPPING = ("attn_logit_softcapping", "final_logit_softcapping")
# HF Gemma2Config / Gemma3TextConfig defaults: Gemma 3 rotates its sliding-window layers at a base of its own
_GEMMA2 = FactKeys(("rms_norm_eps", 1e-6), ("hidden_activation", "gelu_pytorch_tanh"))
_GEMMA3 = FactKeys(
    ("rms_norm_eps", 1e-6),
    ("hidden_activation", "gelu_pytorch_tanh"),
    rope_theta=1_000_000.0,
    local_rope_theta=("rope_local_base_freq", 10_000.0),
)

FAMILIES = (
    Family("gemma2", _read_gemma, _gemma_fields, 8192, harmless_keys=_SOFTCAPPING, facts=_GEMMA2),
    Family("gemma3", _read_gemma, _gemma_fields, 131072, harmless_keys=_SOFTCAPPING, facts=_GEMMA3),
    Family("gemma3_text", _read_gemma, _gemma_fields, 131072, harmless_keys=_SOFTCAPPING, facts=_GEMMA3),
)
