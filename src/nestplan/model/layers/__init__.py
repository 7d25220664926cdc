"""Per-layer formulas: parameters, FLOPs, GEMM shapes, activation bytes, boundary bytes.

Everything here is pure arithmetic on a ModelSpec and a ``Shard`` (how one layer is
split on one device: the sub-graph strategy plus the job's facts). Hardware and time
live in ``nestplan.cost``. Notation follows Korthikanti et al. 2022 (arXiv 2205.05198):
s sequence, b microbatch, h hidden, a heads, t tensor-parallel size, L layers, v vocab.

One module per topic, each name importable from here: ``shard`` (Shard, Gemm, ParamCount),
``params`` (parameters), ``flops`` (GEMM shapes and FLOPs), ``activations`` (activation and
boundary bytes).
"""

from nestplan.model.layers.shard import (
    COLUMN,
    FP8_INPUT_BYTES,
    MASK_BYTES,
    ROW,
    Gemm,
    ParamCount,
    Shard,
)
from nestplan.model.layers.params import (
    active_params,
    attention_params,
    block_params,
    block_params_per_device,
    embedding_params,
    head_params,
    latent_norm_params,
    mlp_params,
    mtp_own_params_per_device,
    mtp_params,
    qk_norm_params,
    total_params,
)
from nestplan.model.layers.flops import (
    attended_fraction,
    attention_core_flops,
    attention_core_gemms,
    attention_keys,
    attention_model_flops,
    block_gemms,
    block_model_flops,
    head_gemm,
    head_model_flops,
    mtp_model_flops,
    mtp_projection_gemm,
)
from nestplan.model.layers.activations import (
    FP32_BYTES,
    INDEX_BYTES,
    block_activation_bytes,
    boundary_bytes,
    dispatch_activation_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    mtp_own_activation_bytes,
    routed_copies,
    routed_expert_activation_bytes,
    router_activation_bytes,
    score_elements,
    shared_expert_activation_bytes,
)
from nestplan.model.layers.flops import _kv_per_device as _kv_per_device  # cost/comm.py reads it

__all__ = [
    "COLUMN",
    "FP32_BYTES",
    "FP8_INPUT_BYTES",
    "Gemm",
    "INDEX_BYTES",
    "MASK_BYTES",
    "ParamCount",
    "ROW",
    "Shard",
    "active_params",
    "attended_fraction",
    "attention_core_flops",
    "attention_core_gemms",
    "attention_keys",
    "attention_model_flops",
    "attention_params",
    "block_activation_bytes",
    "block_gemms",
    "block_model_flops",
    "block_params",
    "block_params_per_device",
    "boundary_bytes",
    "dispatch_activation_bytes",
    "embedding_activation_bytes",
    "embedding_params",
    "head_activation_bytes",
    "head_gemm",
    "head_model_flops",
    "head_params",
    "latent_norm_params",
    "mlp_params",
    "mtp_model_flops",
    "mtp_own_activation_bytes",
    "mtp_own_params_per_device",
    "mtp_params",
    "mtp_projection_gemm",
    "qk_norm_params",
    "routed_copies",
    "routed_expert_activation_bytes",
    "router_activation_bytes",
    "score_elements",
    "shared_expert_activation_bytes",
    "total_params",
]
