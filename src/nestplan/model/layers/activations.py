"""Per-layer activation bytes a device keeps for the backward pass (Korthikanti et al. 2022, generalised:
the block's, an MoE block's router, dispatcher and experts', the embedding's, the head's, an MTP
module's), and the bytes it sends across a stage boundary (``nestplan.model.layers``)."""

from __future__ import annotations

from nestplan.model import ssm
from nestplan.model.layers.flops import _kv_per_device
from nestplan.model.layers.shard import MASK_BYTES, Shard
from nestplan.strategy.enums import Recompute
from nestplan.model.spec import ModelSpec


def mtp_own_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """What one MTP module keeps besides its block's and its head's: the two norms' inputs (the hidden
    state and the next token's embedding) and the projection's concatenated input (2h), each on this
    device's (sequence-split) tokens."""
    return shard.dtype_bytes * shard.tokens * 4 * spec.hidden_size / shard.sp_div


def score_elements(spec: ModelSpec, shard: Shard) -> float:
    """Elements of one s x s attention-score tensor on one device: a b s^2 / (t cp). A sliding
    window does not shrink it: attention that is not fused computes the full s x s scores and then
    masks those outside the window (HF modeling_mistral ``eager_attention_forward``: Q K^T + mask)."""
    return spec.num_heads / shard.tp * shard.micro_batch_size * (shard.seq_len / shard.cp) * shard.seq_len


def block_activation_bytes(spec: ModelSpec, layer: int, shard: Shard, recompute: Recompute) -> float:
    """Bytes a block stores for its backward pass, per microbatch, on one device.

    Korthikanti et al. 2022 section 4 / Table 2: sbh(34 + 5as/h) without parallelism,
    sbh(10 + 24/t + 5as/(ht)) with tp, sbh/t (34 + 5as/h) with tp + sp, the 5as/h term
    dropped by selective recomputation, and 2sbh (the layer input) with full
    recomputation. Generalised term by term to GQA, gated MLPs, top-k experts, no-dropout
    models and flash attention (no s x s tensors stored, so a sliding window changes nothing
    stored: see ``score_elements``), and QK-norm and post-norms (each stores its input). Under
    FP8 a GEMM keeps its input as FP8 (``Shard.gemm_input_bytes``): the QKV and first MLP inputs
    (Transformer Engine's fused norm + linear keeps the FP8 norm output), the down-projection's
    input; the output projection keeps an FP8 copy beside the attention's own output.
    """
    B, T, h = shard.dtype_bytes, shard.tokens, spec.hidden_size
    G = shard.gemm_input_bytes
    rep = T * h / shard.sp_div  # a replicated (or, with sp, sequence-split) hidden-sized tensor, in elements
    if recompute is Recompute.FULL:
        return B * rep
    t = shard.tp
    mask = MASK_BYTES if spec.dropout else 0
    # attention: norm input, QKV input (replicated); Q, K, V, output-projection input (split); mask
    out_in = spec.num_heads * spec.value_head_dim / t
    attn = (B + G) * rep + B * T * (spec.q_channels / t + 2 * _kv_per_device(spec, t) + out_in)
    attn += shard.fp8_input_copy_bytes * T * out_in
    attn += mask * rep + _latent_activation_bytes(spec, shard)
    if spec.has_qk_norm(layer):  # the query and key norms' inputs
        attn += B * T * (spec.q_channels / t + _kv_per_device(spec, t))
    # the MLP's norm input and the MLP input, which a dense FFN's first GEMM keeps, an MoE block's router
    mlp_in = (B if spec.is_moe_layer(layer) else G) * rep
    mlp_norms = B * rep + mlp_in
    if spec.parallel_block:  # one block input for both; with one norm, one norm output for both too
        mlp_norms -= B * rep + (mlp_in if spec.block_norms == 1 else 0.0)
    else:
        attn += max(0, spec.block_norms - 2) * B * rep  # post-norm inputs (Gemma 2/3: attention and MLP outputs)
    if not (shard.flash or recompute is Recompute.SELECTIVE):
        per_score = B + (mask + B if spec.dropout else 0)  # softmax output, dropout mask and output
        attn += per_score * score_elements(spec, shard)
    mlp = mlp_norms + mask * rep  # norm input, MLP input, dropout mask
    mlp += _mlp_activation_bytes(spec, layer, shard)
    # a hybrid block (Nemotron-H) stores its mixer's part (a Mamba-2 mixer: its norm's and in_proj's
    # input, model/ssm.py ``mamba_saved_bytes``) and its FFN's, where it has them
    mixer = spec.mixer_of(layer)
    if mixer != "attention":
        attn = (B + G) * rep + ssm.mamba_saved_bytes(spec.mamba, T, t, B) if mixer == "mamba" else 0.0
    return attn + (mlp if spec.has_ffn(layer) else 0.0)


def _latent_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """MLA's latents, each stored twice (its norm's input and the up-projection's input, in
    ``Shard.gemm_input_bytes``): 2 (q_lora_rank + kv_lora_rank) per token, split over tp by sequence
    parallelism (the up-projections keep their input before the gather); so an MLA block stores per
    token 2 h + 2 (q_lora + kv_lora) (/ tp with sp) and heads x (2 d_qk + 2 d_v) / tp (Q, K, V and
    the output projection's input); 0 without MLA."""
    if not spec.is_mla:
        return 0.0
    kept = shard.dtype_bytes + shard.gemm_input_bytes
    return kept * shard.tokens * (spec.q_lora_rank + spec.kv_lora_rank) / shard.sp_div


def _mlp_activation_bytes(spec: ModelSpec, layer: int, shard: Shard) -> float:
    """The FFN's inner tensors: up-projection output(s) and the down-projection input; in an MoE
    block, the routed experts', the router's, the token dispatcher's and the shared experts'."""
    B, T, t = shard.dtype_bytes, shard.tokens, shard.tp
    up = 2 if spec.gated_mlp else 1
    if not spec.is_moe_layer(layer):  # the up-projection's output(s), the down-projection's input
        return T * (B * up + shard.gemm_input_bytes) * spec.ffn_hidden_size / t
    return (
        routed_expert_activation_bytes(spec, shard)
        + router_activation_bytes(spec, shard)
        + dispatch_activation_bytes(spec, shard)
        + shared_expert_activation_bytes(spec, shard)
    )


# What an MoE block keeps for its backward pass, as Megatron-Core's MoE layer keeps it
# (megatron/core/transformer/moe/: router.py TopKRouter, token_dispatcher.py
# MoEAlltoAllTokenDispatcher, experts.py TEGroupedMLP, moe_utils.py permute/unpermute; its
# defaults, unfused: moe_router_fusion and moe_permute_fusion off, moe_router_dtype unset).
FP32_BYTES = 4  # the router's softmax, taken in fp32 (moe_utils.topk_routing_with_score_function)


INDEX_BYTES = 8  # int64: torch.topk's indices and moe_utils.permute's argsort positions


def routed_copies(spec: ModelSpec, shard: Shard) -> float:
    """Token copies the routed experts of one device process per microbatch (balanced routing, as
    ``block_gemms``): top-k of each of the T / tp tokens of a sequence-parallel share, all-gathered
    over the etp ranks of an expert's shard after the expert all-to-all
    (MoEAlltoAllTokenDispatcher.dispatch_postprocess): T k without folding (etp = tp); padded to
    ``shard.capacity`` times that (RunSettings.moe_capacity_factor)."""
    return shard.tokens * spec.experts_per_token * shard.expert_tp / shard.tp * shard.capacity


def routed_expert_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """The grouped experts' inputs (the permuted copies, kept by the first GEMM), the first GEMM's
    output(s) (kept by the weighted activation, weighted_bias_swiglu_impl) and the second GEMM's
    input, split over etp (TEGroupedMLP.forward); each GEMM keeps its input in
    ``Shard.gemm_input_bytes``. The routing probabilities are applied inside the
    activation, so nothing hidden-sized is kept to weight the experts' outputs (Megatron-Core 0.13
    on, "Memory efficient token permutation"; before, unpermute weighted the outputs and kept them).
    Where the probabilities scale the experts' input instead (``ModelSpec.moe_probs_on_input``), the copies are
    kept twice: unscaled by that product, scaled by the first GEMM."""
    up = 2 if spec.gated_mlp else 1
    B, G = shard.dtype_bytes, shard.gemm_input_bytes
    copies = routed_copies(spec, shard)
    inputs = ((B if spec.moe_probs_on_input else 0) + G) * copies * spec.hidden_size
    return inputs + (B * up + G) * copies * spec.moe_ffn_hidden_size / shard.expert_tp


def router_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """The router's keeps on this device's (sequence-split) tokens: the fp32 softmax over all
    experts of the load-balancing loss (moe_utils.compute_routing_scores_for_aux_loss), the fp32
    routing scores (over all experts, ``ModelSpec.router_scores_all_experts``, or over the top-k), and the top-k's
    int64 indices (torch.topk; moe_utils.topk_routing_with_score_function)."""
    tokens, k = shard.tokens / shard.sp_div, spec.experts_per_token
    load_balancing = FP32_BYTES * tokens * spec.num_experts
    scores = FP32_BYTES * tokens * (spec.num_experts if spec.router_scores_all_experts else k)
    return load_balancing + scores + INDEX_BYTES * tokens * k


def dispatch_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """The permutation's keeps: two int64 maps of this device's copies (moe_utils.permute: the
    probabilities' expert-major positions, and the copies' token rows, which unpermute's scatter-add
    reads again), and the permuted routing probabilities in the activations' dtype, all-gathered
    over etp with the copies, which the weighted activation keeps (TEGroupedMLP.forward); with
    ``ModelSpec.moe_probs_on_input`` the input's product keeps them and the activation keeps ones in their place."""
    local = shard.tokens / shard.sp_div * spec.experts_per_token
    probs = (2 if spec.moe_probs_on_input else 1) * shard.dtype_bytes * routed_copies(spec, shard)
    return 2 * INDEX_BYTES * local + probs


def shared_expert_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """The shared experts' inner tensors (an MLP of num_shared_experts x their width), and where a
    gate scales their output, that output and the gate's sigmoid, which the product keeps
    (Megatron-Core shared_experts.SharedExpertMLP.forward: ``output * gate_score``)."""
    if not spec.num_shared_experts:
        return 0.0
    B, T = shard.dtype_bytes, shard.tokens
    up = 2 if spec.gated_mlp else 1
    width = spec.shared_expert_ffn_hidden_size * spec.num_shared_experts / shard.tp
    inner = T * (B * up + shard.gemm_input_bytes) * width
    # under FP8 the first linear keeps an FP8 copy of the input the router also keeps
    copy = shard.fp8_input_copy_bytes * T * spec.hidden_size / shard.sp_div
    gate = B * T * (spec.hidden_size + 1) / shard.sp_div if spec.shared_expert_gate else 0.0
    return inner + copy + gate


def embedding_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """The embedding output's dropout mask (Korthikanti et al. 2022, section 4.3: s b h p / t)."""
    return (MASK_BYTES if spec.dropout else 0) * shard.tokens * spec.hidden_size / shard.sp_div


def head_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """Final norm input and the fp32 logits kept for the cross-entropy backward (4 s b v / t)."""
    B, T = shard.dtype_bytes, shard.tokens
    return B * T * spec.hidden_size / shard.sp_div + 4.0 * T * spec.vocab_size / shard.tp


def boundary_bytes(spec: ModelSpec, shard: Shard) -> float:
    """Bytes one device sends across a stage boundary per microbatch: the hidden states,
    split over the tp ranks (Megatron's scatter/gather optimisation, Narayanan et al. SC'21 4.1)."""
    return shard.dtype_bytes * shard.tokens * spec.hidden_size / shard.tp
