"""Compute time of one layer on one device, per microbatch.

time = sum over GEMMs of a roofline with a shape-dependent efficiency (Accelerator.matmul_time)
     + attention core (fused flash kernel, or batched GEMMs + softmax/dropout traffic)
     + memory-bound elementwise kernels (norms, residuals, activations, rotary) at HBM bandwidth.
Backward GEMMs are the data-gradient (m x n) @ (n x k) and weight-gradient (k x m) @ (m x n)
products of each forward GEMM (2x the forward FLOPs, Narayanan et al. SC'21 section 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from nestplan.cost.kernels import Kernels
from nestplan.cost.ssm import CHUNK_STATE_GEMM, mamba_elementwise_bytes, selective_scan_time, ssd_gemms, ssd_scan_bytes
from nestplan.hardware.accelerator import Accelerator
from nestplan.job import Job
from nestplan.model.layers import (
    COLUMN,
    INDEX_BYTES,
    MASK_BYTES,
    ROW,
    Gemm,
    Shard,
    _kv_per_device,
    attention_core_flops,
    attention_core_gemms,
    block_gemms,
    head_gemm,
    mtp_projection_gemm,
    score_elements,
)
from nestplan.model.spec import ModelSpec
from nestplan.model.ssm import Mamba1Shape
from nestplan.settings import Fp8Recipe

FLASH_BACKWARD_FLOP_RATIO = 2.5  # flash backward: 5 GEMMs vs 2 forward (Dao 2023, FlashAttention-2 section 3.1)
ELEMENTWISE_BACKWARD_RATIO = 2.0  # a backward elementwise kernel reads input and output grad, writes input grad


# FP8 casts (Transformer Engine, transformer_engine/pytorch/module/linear.py and its cast kernels): every
# FP8 GEMM operand is cast from the activation dtype; a GEMM's forward input is used again transposed by
# the weight-gradient GEMM and its output gradient by the data-gradient one, so each is written twice
# (row- and column-wise: Hopper's FP8 tensor cores take only the TN layout, MXFP8 scales along either
# axis), and per-tensor current scaling reads the tensor once more for its amax first.
FP8_BYTES = 1
FP8_COPIES = 2


@dataclass(frozen=True)
class LayerTime:
    """Seconds per microbatch on one device, before communication."""

    forward: float
    backward: float
    attention_forward: float  # the part of forward a selective recomputation re-runs
    gemms: tuple[tuple[float, float], ...] = ()  # (forward, backward) of each GEMM of block_gemms' list
    weight_gradient: float = 0.0  # the part of backward that is weight-gradient GEMMs (a zero-bubble W)


FUSED = Kernels(1.0, 1.0, eager=False)  # Transformer Engine's kernels: the accelerator's own figures


@dataclass(frozen=True)
class Precision:
    """What a block computes in and with: its activations and non-GEMM kernels (``dtype``), its GEMMs
    (``gemm_dtype``: fp8 under an FP8 recipe), the FP8 recipe, if any, and the framework's kernels."""

    dtype: str
    gemm_dtype: str
    fp8_recipe: Fp8Recipe | None = None
    kernels: Kernels = FUSED

    @classmethod
    def of(cls, job: Job, acc: Accelerator) -> Precision:
        return cls(job.dtype, job.gemm_dtype, job.settings.fp8_recipe, Kernels.of(job.settings, acc))


def _gemm_times(acc: Accelerator, gemms: list[Gemm], dtype: str) -> tuple[tuple[float, float], ...]:
    """(forward, backward) seconds of each GEMM; backward = data gradient (m x n) @ (n x k) and
    weight gradient (k x m) @ (m x n)."""
    return tuple(
        (
            acc.matmul_time(g.m, g.n, g.k, dtype, g.count),
            acc.matmul_time(g.m, g.k, g.n, dtype, g.count) + acc.matmul_time(g.k, g.n, g.m, dtype, g.count),
        )
        for g in gemms
    )


def weight_gradient_time(acc: Accelerator, gemms: list[Gemm], dtype: str) -> float:
    """Seconds of the weight-gradient GEMMs (k x m) @ (m x n) of ``gemms``: the W pass a zero-bubble
    schedule runs apart from the input gradients (Qi et al. ICLR 2024, section 2)."""
    return sum(acc.matmul_time(g.k, g.n, g.m, dtype, g.count) for g in gemms)


def _gemms_forward(acc: Accelerator, gemms: list[Gemm], dtype: str) -> float:
    return sum(f for f, _ in _gemm_times(acc, gemms, dtype))


def _gemms_backward(acc: Accelerator, gemms: list[Gemm], dtype: str) -> float:
    return sum(b for _, b in _gemm_times(acc, gemms, dtype))


def fp8_cast_bytes(gemms: list[Gemm], dtype_bytes: int, recipe: Fp8Recipe, sp_div: int = 1) -> tuple[float, float]:
    """(forward, backward) HBM bytes of casting the FP8 GEMMs' activation operands: the input (m x k)
    in forward, the output gradient (m x n) in backward, each read once and written row- and
    column-wise. An operand sequence parallelism gathers is cast row-wise on the device's 1/tp
    share before the gather, which then moves FP8, and the gathered whole is transposed (read and
    written in FP8) for the other copy (Transformer Engine's linear layers with sequence_parallel).
    Weights are cast once a step and kept (Megatron passes is_first_microbatch), which is not
    charged per microbatch."""
    amax = dtype_bytes if recipe is Fp8Recipe.TENSORWISE else 0
    local = dtype_bytes + FP8_COPIES * FP8_BYTES + amax  # read, write both copies
    gathered = (dtype_bytes + FP8_BYTES + amax) / sp_div + 2 * FP8_BYTES  # cast the share, transpose the whole

    def traffic(elements: float, is_gathered: bool) -> float:
        return elements * (gathered if is_gathered and sp_div > 1 else local)

    forward = sum(traffic(g.count * g.m * g.k, g.gathered == COLUMN) for g in gemms)
    backward = sum(traffic(g.count * g.m * g.n, g.gathered == ROW) for g in gemms)
    return forward, backward


def _attention_core(
    acc: Accelerator, spec: ModelSpec, layer: int, shard: Shard, dtype: str, kernels: Kernels = FUSED
) -> tuple[float, float]:
    """(forward, backward) seconds of softmax(Q K^T) V of block ``layer`` on one device: a flash
    kernel computes the causal part of its keys (its sliding window, where it has one:
    model/layers.py ``attention_core_flops``), at the framework's kernel's speed relative to the
    accelerator's fused one (cost/kernels.py); eager attention builds and masks the full scores."""
    if shard.flash:
        gemms = attention_core_gemms(spec, shard, layer)
        q, k = gemms[0].m, gemms[0].n
        flops = attention_core_flops(spec, shard, layer)
        if acc.attention_efficiency is None:  # no kernel measurement: the GEMM efficiency of its shapes
            fwd = flops / (acc.peak(dtype) * acc.matmul_efficiency_for(q, k, spec.head_dim))
            return fwd / kernels.attention_forward, FLASH_BACKWARD_FLOP_RATIO * fwd / kernels.attention_backward
        # the kernel's measured efficiency at long sequences, lower where the queries or keys are few
        shape = acc.shape_factor(q, k)
        forward_ceiling = acc.attention_efficiency * kernels.attention_forward
        backward_ceiling = acc.attention_backward_efficiency * kernels.attention_backward
        fwd = flops / (acc.peak(dtype) * forward_ceiling * shape)
        bwd = FLASH_BACKWARD_FLOP_RATIO * flops / (acc.peak(dtype) * backward_ceiling * shape)
        return fwd, bwd
    gemms = attention_core_gemms(spec, shard)
    elems = score_elements(spec, shard)
    B = shard.dtype_bytes
    # scale+mask+softmax reads and writes the scores; dropout reads them, writes output and mask
    traffic = elems * (2 * B + ((2 * B + MASK_BYTES) if spec.dropout else 0))
    fwd = _gemms_forward(acc, gemms, dtype) + acc.memory_time(traffic)
    bwd = _gemms_backward(acc, gemms, dtype) + ELEMENTWISE_BACKWARD_RATIO * acc.memory_time(traffic)
    return fwd, bwd


def _mixer_core(
    acc: Accelerator, spec: ModelSpec, layer: int, shard: Shard, dtype: str, kernels: Kernels = FUSED
) -> tuple[float, float]:
    """(forward, backward) seconds of block ``layer``'s mixer core: attention (``_attention_core``), a
    Mamba-2 mixer's SSD scan (its batched products and HBM traffic, cost/ssm.py; backward: the
    products' gradients, the chunk states recomputed, twice the traffic), a Mamba-1 mixer's selective
    scan (cost/ssm.py ``selective_scan_time``), nothing without a mixer."""
    mixer = spec.mixer_of(layer)
    if mixer == "attention":
        return _attention_core(acc, spec, layer, shard, dtype, kernels)
    if mixer == "none":
        return 0.0, 0.0
    if isinstance(spec.mamba, Mamba1Shape):
        return selective_scan_time(acc, spec.mamba, shard)
    gemms = ssd_gemms(spec.mamba, shard)
    traffic = acc.memory_time(ssd_scan_bytes(spec.mamba, shard))
    recomputed = _gemms_forward(acc, gemms[CHUNK_STATE_GEMM : CHUNK_STATE_GEMM + 1], dtype)
    return (
        _gemms_forward(acc, gemms, dtype) + traffic,
        _gemms_backward(acc, gemms, dtype) + recomputed + ELEMENTWISE_BACKWARD_RATIO * traffic,
    )


# per routing-map entry, sorted for the copies' expert-major positions (torch.argsort(stable=True) on
# CUB's radix sort of key-position pairs): the int64 positions written, then the one-byte key and its
# position read and written once, a one-byte key being one digit pass of CUB's onesweep sort (8-bit
# digits: Adinets and Merrill 2022, arXiv 2206.01784)
ROUTING_SORT_BYTES = INDEX_BYTES + 2 * (1 + INDEX_BYTES)


def moe_permutation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """HBM traffic of an MoE block's token permutation around the expert all-to-all (forward) as
    Megatron-Core's unfused moe_utils.permute and unpermute run it (moe_permute_fusion off, its
    default), on this device's sequence-split tokens, their top-k copies (padded to the experts'
    capacity, ``shard.capacity``: drop_and_pad sorts each expert's row of the map) and the E experts:
    - the routing map (tokens x E bools) transposed (read, write) and sorted (``ROUTING_SORT_BYTES``),
      the dense probabilities transposed (read, write);
    - the int64 positions: taken modulo the tokens (read, write), read by the probabilities' gather,
      by index_select and by the scatter-add; the copies' probabilities gathered (read, write);
    - permute: the tokens gathered into their copies (index_select: read and write each copy);
    - unpermute, the probabilities already applied by the experts: the output zeroed, the copies read
      and scatter-added into it, each output row read and written once (its k additions, atomics,
      meet in L2)."""
    B, h, E = shard.dtype_bytes, spec.hidden_size, spec.num_experts
    tokens = shard.tokens / shard.sp_div
    copies = tokens * spec.experts_per_token * shard.capacity
    routing_map = tokens * E * (2 + ROUTING_SORT_BYTES + 2 * B)
    positions = copies * (5 * INDEX_BYTES + 2 * B)
    permute = 2 * B * copies * h
    unpermute = B * copies * h + 3 * B * tokens * h
    return routing_map + positions + permute + unpermute


def _elementwise_bytes(spec: ModelSpec, layer: int, shard: Shard) -> float:
    """HBM traffic of the memory-bound kernels of one block's forward pass: a residual add per sub-block
    (mixer, FFN: a hybrid block, Nemotron-H's, may have one of them only), the QK-norms of the layers that
    have them, MLA's latent norms, RoPE where the layer rotates, a Mamba-2 mixer's own kernels
    (cost/ssm.py ``mamba_elementwise_bytes``)."""
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    rep = T * spec.hidden_size / shard.sp_div
    mixer = spec.mixer_of(layer)
    norms = spec.block_norms * (2 * B * rep)  # read x, write y, per norm (2; Gemma 4)
    if mixer == "attention" and spec.has_qk_norm(layer):  # Qwen3, OLMo 2, Gemma 3, Llama 4's rotary layers
        norms += 2 * B * T * (spec.q_channels + spec.kv_channels) / t
    if mixer == "attention" and spec.is_mla:  # q_a_layernorm, kv_a_layernorm on each rank's own tokens
        norms += 2 * B * T * (spec.q_lora_rank + spec.kv_lora_rank) / shard.sp_div
    sub_blocks = (mixer != "none") + spec.has_ffn(layer)
    residual = sub_blocks * (3 * B * rep + (MASK_BYTES * rep if spec.dropout else 0))  # (bias-dropout-)add
    if not spec.has_ffn(layer):
        ffn, permute = 0, 0.0
    elif spec.is_moe_layer(layer):
        ffn = (
            spec.moe_ffn_hidden_size * spec.experts_per_token
            + spec.shared_expert_ffn_hidden_size * spec.num_shared_experts
        )
        copies = T * spec.experts_per_token * spec.hidden_size * shard.capacity  # routed copies (padded), tp-gathered
        permute = moe_permutation_bytes(spec, shard)
        # copies received from every ep rank, regrouped by local expert and back (Megatron-Core's
        # MoEAlltoAllTokenDispatcher, sort_chunks_by_idxs, where a device holds several experts)
        # (the copies a device's experts process: T k x etp / tp, all T k without folding)
        regroup = 2 * 2 * B * copies * shard.expert_tp / t if spec.num_experts > shard.expert_parallel else 0.0
        permute += regroup
    else:
        ffn, permute = spec.ffn_hidden_size, 0.0
    activation = (3 if spec.gated_mlp else 2) * B * T * ffn / t  # act(x) [* up]: read 1-2, write 1
    # RoPE: read and write the rotated share of Q and K (partial rotary: rotary_fraction of each head)
    rotates = mixer == "attention" and not spec.learned_position_embeddings and spec.blocks[layer].rope
    rotary = 0.0 if not rotates else (spec.rotary_fraction * 2 * B * T * (spec.q_channels + spec.kv_channels) / t)
    mamba = mamba_elementwise_bytes(spec.mamba, shard) if mixer == "mamba" else 0.0
    return norms + residual + activation + rotary + permute + mamba


# Eager PyTorch kernels, forward, HBM bytes per element beyond the fused kernel's read and write (the
# backward runs each op's own backward kernels: ELEMENTWISE_BACKWARD_RATIO times as much):
# - RMSNorm as Hugging Face's LlamaRMSNorm and torch.nn.RMSNorm's composite run it: the input cast to fp32,
#   squared, averaged, scaled by the reciprocal root, cast back, multiplied by the weight: five kernels over
#   the whole tensor, three of them in fp32, where a fused kernel reads and writes it once (LayerNorm is
#   one native kernel: nothing beyond);
# - a gated activation: act(gate) written and read again before the product with up (one more tensor);
# - rotary embedding (Hugging Face's apply_rotary_pos_emb): x * cos, rotate_half (a negation and a
#   concatenation), * sin, and the sum: four more passes over Q and K than the fused kernel's one.
EAGER_RMSNORM_FP32_PASSES = 3
EAGER_RMSNORM_PASSES = 2
EAGER_GATE_PASSES = 2
EAGER_ROTARY_PASSES = 4


def eager_extra_bytes(spec: ModelSpec, layer: int, shard: Shard) -> float:
    """HBM bytes one block's forward moves beyond ``_elementwise_bytes`` where its norms, activation and
    rotary embedding run as eager PyTorch kernels (cost/kernels.py EAGER_FRAMEWORKS)."""
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    rep = T * spec.hidden_size / shard.sp_div
    norms = 0.0
    if spec.norm == "rmsnorm":
        per_element = EAGER_RMSNORM_FP32_PASSES * 2 * 4 + EAGER_RMSNORM_PASSES * 2 * B - 2 * B
        norms = spec.block_norms * per_element * rep
    gate = 0.0
    if spec.has_ffn(layer) and spec.gated_mlp:
        ffn = (
            spec.ffn_hidden_size if not spec.is_moe_layer(layer) else spec.moe_ffn_hidden_size * spec.experts_per_token
        )
        gate = EAGER_GATE_PASSES * B * T * ffn / t
    rotates = spec.mixer_of(layer) == "attention" and not spec.learned_position_embeddings and spec.blocks[layer].rope
    rotary = 0.0
    if rotates:
        rotary = EAGER_ROTARY_PASSES * spec.rotary_fraction * 2 * B * T * (spec.q_channels + spec.kv_channels) / t
    return norms + gate + rotary


def block_time(acc: Accelerator, spec: ModelSpec, layer: int, shard: Shard, precision: Precision) -> LayerTime:
    """A block's GEMMs in ``precision.gemm_dtype`` (with their FP8 casts), attention and elementwise
    kernels in ``precision.dtype``."""
    gemms = block_gemms(spec, layer, shard)
    times = _gemm_times(acc, gemms, precision.gemm_dtype)
    attn_f, attn_b = _mixer_core(acc, spec, layer, shard, precision.dtype, precision.kernels)
    eager = eager_extra_bytes(spec, layer, shard) if precision.kernels.eager else 0.0
    elem = acc.memory_time(_elementwise_bytes(spec, layer, shard) + eager)
    cast_f = cast_b = 0.0
    if precision.fp8_recipe is not None:
        cast = fp8_cast_bytes(gemms, shard.dtype_bytes, precision.fp8_recipe, shard.sp_div)
        cast_f, cast_b = (acc.memory_time(b) for b in cast)
    forward = sum(f for f, _ in times) + attn_f + elem + cast_f
    backward = sum(b for _, b in times) + attn_b + ELEMENTWISE_BACKWARD_RATIO * elem + cast_b
    selective = attn_f if spec.mixer_of(layer) == "attention" else 0.0  # selective recomputation redoes attention only
    return LayerTime(
        forward=forward,
        backward=backward,
        attention_forward=selective,
        gemms=times,
        weight_gradient=weight_gradient_time(acc, gemms, precision.gemm_dtype),
    )


def ring_merge_time(acc: Accelerator, spec: ModelSpec, layer: int, shard: Shard, ring: int) -> tuple[float, float]:
    """(forward, backward) seconds of merging a context-parallel ring's partial results (Transformer
    Engine's p2p exchange, attention/dot_product_attention/context_parallel.py AttnFuncWithCPAndKVP2P):
    forward, the first step's partial output copied into the output, then each later step's read,
    scaled by its softmax-statistics correction and added in (flash_attn_fwd_out_correction: the part
    read, the output read and written); backward, each later step's dQ added into dQ and its dK, dV into
    the dK, dV that travel on (both read, one written). Memory-bound kernels in the activations' dtype
    between the ring's attention steps, not overlapped; the rank that merges whole tensors at every step
    (the last, under load-balanced causal sharding) sets the pace. ``ring``: the ring's length (cp, or
    cp over the all-to-all group of a2a+p2p, whose ranks hold the same bytes); none but attention layers."""
    if ring <= 1 or spec.mixer_of(layer) != "attention":
        return 0.0, 0.0
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    output = T * spec.num_heads * spec.value_head_dim / t
    query, keys_values = T * spec.q_channels / t, 2 * T * _kv_per_device(spec, t)
    steps = ring - 1
    forward = B * output * (2 + 3 * steps)
    backward = 3 * B * (query + keys_values) * steps
    return acc.memory_time(forward), acc.memory_time(backward)


def mtp_own_time(acc: Accelerator, spec: ModelSpec, shard: Shard, dtype: str) -> LayerTime:
    """One MTP module's own work besides its block, embedding lookup and head: the projection M
    (``model.layers.mtp_projection_gemm``) and the two norms (read and write each, twice that back)."""
    g = mtp_projection_gemm(spec, shard)
    norms = 2 * 2 * shard.dtype_bytes * shard.tokens * spec.hidden_size / shard.sp_div
    return LayerTime(
        forward=_gemms_forward(acc, [g], dtype) + acc.memory_time(norms),
        backward=_gemms_backward(acc, [g], dtype) + ELEMENTWISE_BACKWARD_RATIO * acc.memory_time(norms),
        attention_forward=0.0,
        weight_gradient=weight_gradient_time(acc, [g], dtype),
    )


def embedding_time(acc: Accelerator, spec: ModelSpec, shard: Shard) -> LayerTime:
    """Lookup: read the rows, write the output; backward scatters the gradient back."""
    traffic = 2 * shard.dtype_bytes * shard.tokens * spec.hidden_size
    return LayerTime(forward=acc.memory_time(traffic), backward=2 * acc.memory_time(traffic), attention_forward=0.0)


def head_time(acc: Accelerator, spec: ModelSpec, shard: Shard, dtype: str) -> LayerTime:
    """Final norm, vocab-parallel output projection and fp32 cross-entropy."""
    g = head_gemm(spec, shard)
    logits = shard.tokens * spec.vocab_size / shard.tp
    ce_traffic = 3 * 4.0 * logits  # write fp32 logits, read for softmax, write probs
    norm = 2 * shard.dtype_bytes * shard.tokens * spec.hidden_size / shard.sp_div
    forward = _gemms_forward(acc, [g], dtype) + acc.memory_time(ce_traffic + norm)
    backward = _gemms_backward(acc, [g], dtype) + acc.memory_time(2 * (ce_traffic + norm))
    return LayerTime(
        forward=forward, backward=backward, attention_forward=0.0, weight_gradient=weight_gradient_time(acc, [g], dtype)
    )
