"""Compute time of one layer on one device, per microbatch.

time = sum over GEMMs of a roofline with a shape-dependent efficiency (Accelerator.matmul_time)
     + attention core (fused flash kernel, or batched GEMMs + softmax/dropout traffic)
     + memory-bound elementwise kernels (norms, residuals, activations, rotary) at HBM bandwidth.
Backward GEMMs are the data-gradient (m x n) @ (n x k) and weight-gradient (k x m) @ (m x n)
products of each forward GEMM (2x the forward FLOPs, Narayanan et al. SC'21 section 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from nestplan.hardware.accelerator import Accelerator
from nestplan.model.layers import (
    MASK_BYTES,
    Gemm,
    Shard,
    attention_core_gemms,
    block_gemms,
    head_gemm,
    score_elements,
)
from nestplan.model.spec import ModelSpec

FLASH_BACKWARD_FLOP_RATIO = 2.5  # flash backward: 5 GEMMs vs 2 forward (Dao 2023, FlashAttention-2 section 3.1)
ELEMENTWISE_BACKWARD_RATIO = 2.0  # a backward elementwise kernel reads input and output grad, writes input grad


@dataclass(frozen=True)
class LayerTime:
    """Seconds per microbatch on one device, before communication."""

    forward: float
    backward: float
    attention_forward: float  # the part of forward a selective recomputation re-runs


def _gemms_forward(acc: Accelerator, gemms: list[Gemm], dtype: str) -> float:
    return sum(acc.matmul_time(g.m, g.n, g.k, dtype, g.count) for g in gemms)


def _gemms_backward(acc: Accelerator, gemms: list[Gemm], dtype: str) -> float:
    dgrad = sum(acc.matmul_time(g.m, g.k, g.n, dtype, g.count) for g in gemms)
    wgrad = sum(acc.matmul_time(g.k, g.n, g.m, dtype, g.count) for g in gemms)
    return dgrad + wgrad


def _attention_core(acc: Accelerator, spec: ModelSpec, shard: Shard, dtype: str) -> tuple[float, float]:
    """(forward, backward) seconds of softmax(Q K^T) V on one device."""
    gemms = attention_core_gemms(spec, shard)
    if shard.flash:
        causal = 0.5 if spec.causal else 1.0  # a causal flash kernel skips the masked half
        q, k = gemms[0].m, gemms[0].n
        eff = acc.matmul_efficiency_for(q, k, spec.head_dim)
        fwd = causal * sum(g.flops for g in gemms) / (acc.peak(dtype) * eff)
        return fwd, FLASH_BACKWARD_FLOP_RATIO * fwd
    elems = score_elements(spec, shard)
    B = shard.dtype_bytes
    # scale+mask+softmax reads and writes the scores; dropout reads them, writes output and mask
    traffic = elems * (2 * B + ((2 * B + MASK_BYTES) if spec.dropout else 0))
    fwd = _gemms_forward(acc, gemms, dtype) + acc.memory_time(traffic)
    bwd = _gemms_backward(acc, gemms, dtype) + ELEMENTWISE_BACKWARD_RATIO * acc.memory_time(traffic)
    return fwd, bwd


def _elementwise_bytes(spec: ModelSpec, layer: int, shard: Shard) -> float:
    """HBM traffic of the memory-bound kernels of one block's forward pass."""
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    rep = T * spec.hidden_size / shard.sp_div
    norms = 2 * (2 * B * rep)                                        # read x, write y, twice
    residual = 2 * (3 * B * rep + (MASK_BYTES * rep if spec.dropout else 0))  # (bias-dropout-)add
    if spec.is_moe_layer(layer):
        ffn = spec.moe_ffn_hidden_size * spec.experts_per_token + spec.shared_expert_ffn_hidden_size * spec.num_shared_experts
        permute = 2 * 2 * B * T * spec.experts_per_token * spec.hidden_size / shard.sp_div
    else:
        ffn, permute = spec.ffn_hidden_size, 0.0
    activation = (3 if spec.gated_mlp else 2) * B * T * ffn / t     # act(x) [* up]: read 1-2, write 1
    rotary = 0.0 if spec.learned_position_embeddings else 2 * B * T * (spec.q_channels + spec.kv_channels) / t
    return norms + residual + activation + rotary + permute


def block_time(acc: Accelerator, spec: ModelSpec, layer: int, shard: Shard, dtype: str) -> LayerTime:
    gemms = block_gemms(spec, layer, shard)
    attn_f, attn_b = _attention_core(acc, spec, shard, dtype)
    elem = acc.memory_time(_elementwise_bytes(spec, layer, shard))
    forward = _gemms_forward(acc, gemms, dtype) + attn_f + elem
    backward = _gemms_backward(acc, gemms, dtype) + attn_b + ELEMENTWISE_BACKWARD_RATIO * elem
    return LayerTime(forward=forward, backward=backward, attention_forward=attn_f)


def embedding_time(acc: Accelerator, spec: ModelSpec, shard: Shard) -> LayerTime:
    """Lookup: read the rows, write the output; backward scatters the gradient back."""
    traffic = 2 * shard.dtype_bytes * shard.tokens * spec.hidden_size
    return LayerTime(forward=acc.memory_time(traffic), backward=2 * acc.memory_time(traffic), attention_forward=0.0)


def head_time(acc: Accelerator, spec: ModelSpec, shard: Shard, dtype: str) -> LayerTime:
    """Final norm, vocab-parallel output projection and fp32 cross-entropy."""
    g = head_gemm(spec, shard)
    logits = shard.tokens * spec.vocab_size / shard.tp
    ce_traffic = 3 * 4.0 * logits                                   # write fp32 logits, read for softmax, write probs
    norm = 2 * shard.dtype_bytes * shard.tokens * spec.hidden_size / shard.sp_div
    forward = _gemms_forward(acc, [g], dtype) + acc.memory_time(ce_traffic + norm)
    backward = _gemms_backward(acc, [g], dtype) + acc.memory_time(2 * (ce_traffic + norm))
    return LayerTime(forward=forward, backward=backward, attention_forward=0.0)
