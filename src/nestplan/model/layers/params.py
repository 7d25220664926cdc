"""Per-layer parameters: a block's (attention, MLA, a Mamba mixer, MLP and experts, norms), the embedding's,
the head's and the MTP modules', whole and as one device holds them (``nestplan.model.layers``)."""

from __future__ import annotations

from nestplan.model import ssm
from nestplan.model.layers.shard import ParamCount, Shard
from nestplan.model.spec import ModelSpec


def _norm_params(spec: ModelSpec) -> int:
    return 2 * spec.hidden_size if spec.norm == "layernorm" else spec.hidden_size


def qk_norm_params(spec: ModelSpec) -> int:
    """Weights of the query and key norms: one head_dim vector each shared by the heads (Qwen3,
    HF modeling_qwen3 ``q_norm = Qwen3RMSNorm(head_dim)``; Gemma 3 likewise), or one vector over
    the full projection width each (OLMo 2, HF modeling_olmo2 ``q_norm = Olmo2RMSNorm(num_heads *
    head_dim)``, ``k_norm`` over num_key_value_heads * head_dim); none without QK-norm."""
    per_weight = 2 if spec.norm == "layernorm" else 1
    widths = {"none": 0, "head": 2 * spec.head_dim, "full": spec.q_channels + spec.kv_channels, "l2": 0}
    return per_weight * widths[spec.qk_norm]


def latent_norm_params(spec: ModelSpec) -> int:
    """MLA's norms of the query and key/value latents (HF modeling_deepseek_v3 ``q_a_layernorm``
    over q_lora_rank, ``kv_a_layernorm`` over kv_lora_rank); none without MLA."""
    return spec.q_lora_rank + spec.kv_lora_rank if spec.is_mla else 0


def _mla_projection_params(spec: ModelSpec) -> int:
    """MLA's projections (DeepSeek-V2, arXiv 2405.04434 eqs. 9-14; HF DeepseekV3Attention): queries
    through q_a_proj (h x q_lora_rank) and q_b_proj (q_lora_rank x heads (nope + rope)), or one q_proj
    (h x heads (nope + rope)) without a query latent; kv_a_proj_with_mqa (h x (kv_lora_rank + rope)),
    kv_b_proj (kv_lora_rank x heads (nope + v)); o_proj (heads v x h)."""
    h, q, r = spec.hidden_size, spec.q_channels, spec.q_lora_rank
    nope = spec.head_dim - spec.qk_rope_head_dim
    queries = r * (h + q) if r else h * q
    keys_values = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank * spec.num_heads * (
        nope + spec.value_head_dim
    )
    return queries + keys_values + spec.num_heads * spec.value_head_dim * h


def attention_params(spec: ModelSpec) -> int:
    """QKV and output projections (+ biases), QK-norm (MLA: its latent norms), attention sinks (one
    logit per head, gpt-oss: HF modeling_gpt_oss ``sinks``) and one norm of the block."""
    h, q, k, v = spec.hidden_size, spec.q_channels, spec.kv_channels, spec.v_channels
    out_in = spec.num_heads * spec.value_head_dim
    weights = _mla_projection_params(spec) if spec.is_mla else h * (q + k + v) + out_in * h
    if spec.linear_bias:
        biases = q + k + v + h
    else:  # Qwen2: bias on q_proj, k_proj, v_proj only (HF modeling_qwen2, Qwen2Attention)
        biases = (q + k + v) if spec.qkv_bias else 0
    sinks = spec.num_heads if spec.attention_sinks else 0
    return weights + biases + sinks + qk_norm_params(spec) + latent_norm_params(spec) + _norm_params(spec)


def mlp_params(spec: ModelSpec, ffn: int) -> int:
    """One MLP (dense FFN or one expert): up (and gate) and down projections."""
    h = spec.hidden_size
    mats = 3 if spec.gated_mlp else 2
    biases = (ffn * (mats - 1) + h) if spec.linear_bias else 0
    return mats * h * ffn + biases


def _mixer_params(spec: ModelSpec, layer: int) -> int:
    """The mixer of block ``layer`` with the block's first norm: attention (``attention_params``), a
    Mamba mixer (model/ssm.py), or the norm alone where the block has no mixer (Nemotron-H's MLP layers)."""
    mixer = spec.mixer_of(layer)
    if mixer == "attention":
        return attention_params(spec)
    own = ssm.mamba_params(spec.mamba, spec.hidden_size) if mixer == "mamba" else 0
    return own + _norm_params(spec)


def block_params(spec: ModelSpec, layer: int) -> ParamCount:
    """Full (unsharded) parameters of transformer block ``layer``."""
    dense = _mixer_params(spec, layer) + (spec.block_norms - 1) * _norm_params(spec)
    if not spec.has_ffn(layer):
        return ParamCount(dense=dense)
    if not spec.is_moe_layer(layer):
        return ParamCount(dense=dense + mlp_params(spec, spec.ffn_hidden_size))
    router = (spec.hidden_size + (1 if spec.router_bias else 0)) * spec.num_experts
    shared = spec.num_shared_experts * mlp_params(spec, spec.shared_expert_ffn_hidden_size)
    experts = spec.num_experts * mlp_params(spec, spec.moe_ffn_hidden_size)
    return ParamCount(dense=dense + router + shared, expert=experts)


def embedding_params(spec: ModelSpec) -> int:
    positions = spec.max_position_embeddings if spec.learned_position_embeddings else 0
    return spec.hidden_size * (spec.vocab_size + positions + spec.type_vocab_size)


def head_params(spec: ModelSpec, separate_copy: bool) -> int:
    """Final norm + output projection; a tied projection costs nothing unless the
    head sits on another device than the embedding (then Megatron keeps a copy)."""
    proj = spec.vocab_size * spec.hidden_size if (not spec.tied_embeddings or separate_copy) else 0
    return proj + _norm_params(spec)


def total_params(spec: ModelSpec) -> float:
    """Every parameter of the model, a tied output projection counted once."""
    blocks = sum(block_params(spec, i).total for i in range(spec.num_layers))
    return blocks + embedding_params(spec) + head_params(spec, separate_copy=False)


def active_params(spec: ModelSpec) -> float:
    """Parameters one token computes with, as the model cards count their "active parameters": every
    block's but the routed experts, plus the ``experts_per_token`` of them its router picks in each MoE
    block, plus the output head (its norm and projection, a tied one included: the token's logits are a
    GEMM with it); not the input embedding, a lookup (token, position and type tables), which the cards
    leave out (gpt-oss-120b: 5.13B active of 116.83B, OpenAI's gpt-oss model card, table 1;
    DeepSeek-V2-Lite: 2.4B of 15.7B, its Hugging Face model card)."""
    routed = spec.experts_per_token / spec.num_experts if spec.num_experts else 0.0
    blocks = sum(p.dense + routed * p.expert for p in (block_params(spec, i) for i in range(spec.num_layers)))
    return blocks + head_params(spec, separate_copy=True)


def mtp_params(spec: ModelSpec, own_embedding_and_head: bool) -> float:
    """Parameters of the multi-token-prediction modules (DeepSeek-V3, arXiv 2412.19437 section 2.2):
    each an RMSNorm of the hidden state and of the next token's embedding, a projection M (2h x h),
    one block (like the last one), its own norm before the shared head (Hugging Face's
    ``shared_head.norm``, Megatron-core's ``MultiTokenPredictionLayer.final_layernorm``) and, with
    ``own_embedding_and_head``, the copies of the embedding
    and output head the Hugging Face checkpoint stores with it (``embed_tokens``, ``shared_head``;
    the paper shares them with the main model). Not part of ``total_params``."""
    copies = embedding_params(spec) + spec.vocab_size * spec.hidden_size if own_embedding_and_head else 0
    module = mtp_own_params_per_device(spec, Shard()) + block_params(spec, spec.num_layers - 1).total + copies
    return spec.mtp_layers * module


def mtp_own_params_per_device(spec: ModelSpec, shard: Shard) -> float:
    """What one MTP module adds on a device besides its block and the shared embedding and head: the
    projection M (split over tp) and its three norms (``mtp_params``)."""
    return 2 * spec.hidden_size * spec.hidden_size / shard.tp + 3 * _norm_params(spec)


def block_params_per_device(spec: ModelSpec, layer: int, shard: Shard) -> ParamCount:
    """Parameters a device holds: projections split over tp, the replicated ones
    (``_tp_replicated_params``) whole, experts over etp x expert_parallel (= tp x ep, folded or not)."""
    full = block_params(spec, layer)
    replicated = _tp_replicated_params(spec, layer)
    dense = (full.dense - replicated) / shard.tp + replicated
    return ParamCount(dense=dense, expert=full.expert / (shard.expert_tp * shard.expert_parallel))


def _tp_replicated_params(spec: ModelSpec, layer: int) -> int:
    """Parameters of block ``layer`` every tp rank holds whole: its norms and QK-norms, the row-parallel
    output biases, MLA's down-projections h x (q_lora_rank + kv_lora_rank + rope) and latent norms
    (Megatron-core MLASelfAttention builds linear_q_down_proj and linear_kv_down_proj with
    ``parallel_mode="duplicated"``, megatron/core/transformer/multi_latent_attention.py) and an MoE
    router (Megatron-core TopKRouter's weight, E x h, and its bias are not split)."""
    attention = spec.mixer_of(layer) == "attention"
    norms = spec.block_norms * _norm_params(spec) + (qk_norm_params(spec) if attention else 0)
    biases = 2 * spec.hidden_size if spec.linear_bias else 0  # row-parallel output biases
    latents = 0
    if attention and spec.is_mla:
        down = spec.hidden_size * (spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim)
        latents = down + latent_norm_params(spec)
    moe = spec.has_ffn(layer) and spec.is_moe_layer(layer)
    router = (spec.hidden_size + (1 if spec.router_bias else 0)) * spec.num_experts if moe else 0
    return norms + biases + latents + router
