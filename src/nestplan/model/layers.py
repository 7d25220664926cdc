"""Per-layer formulas: parameters, FLOPs, GEMM shapes, activation bytes, boundary bytes.

Everything here is pure arithmetic on a ModelSpec and a ``Shard`` (how one layer is
split on one device: the sub-graph strategy plus the microbatch). Hardware and time
live in ``nestplan.cost``. Notation follows Korthikanti et al. 2022 (arXiv 2205.05198):
s sequence, b microbatch, h hidden, a heads, t tensor-parallel size, L layers, v vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nestplan.model import ssm
from nestplan.model.spec import ModelSpec
from nestplan.strategy.enums import Recompute

MASK_BYTES = 1  # dropout masks are stored as bytes (Korthikanti et al. 2022, section 4.1)
FP8_INPUT_BYTES = 1  # an FP8 element: what an FP8 GEMM keeps of its input (Shard.gemm_input_bytes)


def expert_degrees(tp: int, ep: int, etp: int | None) -> tuple[int, int]:
    """(ranks that split one expert's FFN, ranks that hold different experts) under Megatron-Core's
    parallel folding: etp (tp where None, unfolded) and ep x tp / etp, the ep ranks with the tp / etp
    ranks of each tensor-parallel group that fold into expert parallelism."""
    split = tp if etp is None else etp
    return split, ep * tp // split


@dataclass(frozen=True)
class Shard:
    """How a layer runs on one device for one microbatch."""

    tp: int = 1
    sp: bool = False
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1
    seq_len: int = 2048
    dtype_bytes: int = 2
    flash: bool = True
    etp: int | None = None  # expert tensor parallelism when folded (strategy.ParallelDims.etp); None: tp
    capacity: float = 1.0  # each expert's token copies over its balanced share (RunSettings.moe_capacity_factor)
    fp8_gemms: bool = False  # the GEMMs run in FP8 (RunSettings.fp8_recipe): they keep FP8 copies of their inputs

    @property
    def gemm_input_bytes(self) -> int:
        """Bytes per element of a GEMM input the GEMM itself keeps for its weight gradient: under FP8,
        Transformer Engine's linear layers keep the FP8 cast of their input, not the input
        (transformer_engine/pytorch/module/linear.py, layernorm_linear.py, grouped_linear.py, v1.11:
        ``saved_inputmat`` / ``ln_out`` / ``saved_inputmats`` are the FP8 tensors), 1 byte."""
        return FP8_INPUT_BYTES if self.fp8_gemms else self.dtype_bytes

    @property
    def fp8_input_copy_bytes(self) -> int:
        """Bytes per element of the FP8 copy a linear layer keeps of an input that another op
        also keeps in the activations' dtype (the output projection's input, which the fused
        attention keeps as its output; a shared expert's input, which the router keeps); 0 without FP8."""
        return FP8_INPUT_BYTES if self.fp8_gemms else 0

    @property
    def expert_tp(self) -> int:
        return expert_degrees(self.tp, self.ep, self.etp)[0]

    @property
    def expert_parallel(self) -> int:
        return expert_degrees(self.tp, self.ep, self.etp)[1]

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch on one device: b * s / cp."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def sp_div(self) -> int:
        """Divisor of the activations that sequence parallelism splits over tp."""
        return self.tp if (self.sp and self.tp > 1) else 1


@dataclass(frozen=True)
class Gemm:
    """``count`` GEMMs of (m x k) @ (k x n) on one device in the forward pass.

    ``gathered``: under sequence parallelism the GEMM's forward input (a column-parallel layer) or
    its output gradient in backward (a row-parallel layer) is all-gathered over tp first, so the
    device holds 1/tp of that operand before the gather (Korthikanti et al. 2022, section 4.2.2)."""

    m: float
    n: float
    k: float
    count: float = 1.0
    gathered: str = ""  # "input" (column-parallel), "output_grad" (row-parallel) or "" (neither)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class ParamCount:
    """Parameters split by how they are replicated: dense ones over the whole stage's
    data-parallel ranks, expert ones only over replicas that hold the same experts."""

    dense: float = 0.0
    expert: float = 0.0

    @property
    def total(self) -> float:
        return self.dense + self.expert

    def __add__(self, other: "ParamCount") -> "ParamCount":
        return ParamCount(self.dense + other.dense, self.expert + other.expert)

    def scaled(self, factor: float) -> "ParamCount":
        return ParamCount(self.dense * factor, self.expert * factor)


# ---------------------------------------------------------------- parameters
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
    """Parameters one token passes through: everything but the routed experts, plus the
    ``experts_per_token`` of them its router picks in each MoE block (equal to ``total_params`` for
    a dense model; the "activated parameters" of the MoE model cards)."""
    routed = spec.experts_per_token / spec.num_experts if spec.num_experts else 0.0
    blocks = sum(p.dense + routed * p.expert for p in (block_params(spec, i) for i in range(spec.num_layers)))
    return blocks + embedding_params(spec) + head_params(spec, separate_copy=False)


def mtp_params(spec: ModelSpec, own_embedding_and_head: bool) -> float:
    """Parameters of the multi-token-prediction modules (DeepSeek-V3, arXiv 2412.19437 section 2.2):
    each an RMSNorm of the hidden state and of the next token's embedding, a projection M (2h x h),
    one block (like the last one) and, with ``own_embedding_and_head``, the copies of the embedding
    and output head the Hugging Face checkpoint stores with it (``embed_tokens``, ``shared_head``;
    the paper shares them with the main model). Not part of ``total_params``."""
    copies = embedding_params(spec) + head_params(spec, separate_copy=True) if own_embedding_and_head else 0
    module = mtp_own_params_per_device(spec, Shard()) + block_params(spec, spec.num_layers - 1).total + copies
    return spec.mtp_layers * module


def mtp_projection_gemm(spec: ModelSpec, shard: Shard) -> Gemm:
    """One MTP module's projection M of the concatenated normed embedding and hidden state (2h) onto
    h, column-parallel over tp (Megatron-Core multi_token_prediction.py ``eh_proj``; under sp its input
    is all-gathered, and its output all-gathered over tp before the block)."""
    return Gemm(shard.tokens, spec.hidden_size / shard.tp, 2 * spec.hidden_size, gathered=COLUMN)


def mtp_own_params_per_device(spec: ModelSpec, shard: Shard) -> float:
    """What one MTP module adds on a device besides its block and the shared embedding and head: the
    projection M (split over tp) and the two norms (``mtp_params``)."""
    return 2 * spec.hidden_size * spec.hidden_size / shard.tp + 2 * _norm_params(spec)


def mtp_own_activation_bytes(spec: ModelSpec, shard: Shard) -> float:
    """What one MTP module keeps besides its block's and its head's: the two norms' inputs (the hidden
    state and the next token's embedding) and the projection's concatenated input (2h), each on this
    device's (sequence-split) tokens."""
    return shard.dtype_bytes * shard.tokens * 4 * spec.hidden_size / shard.sp_div


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


# ---------------------------------------------------------------- GEMMs and FLOPs
def _kv_per_device(spec: ModelSpec, tp: int) -> float:
    """K (or V) channels per device: kv heads split over tp, replicated when tp > kv heads; where the
    key and value heads differ (MLA: nope + rope and v), their mean, so that twice it is K and V together."""
    return math.ceil(spec.num_kv_heads / tp) * (spec.head_dim + spec.value_head_dim) / 2


COLUMN, ROW = "input", "output_grad"  # what sequence parallelism gathers for a column- / row-parallel layer


def _latent_gemms(spec: ModelSpec, shard: Shard) -> list[Gemm]:
    """MLA's projections besides the query (or query up-) projection and the output projection.
    Megatron-core's MLASelfAttention (megatron/core/transformer/multi_latent_attention.py) runs the
    down-projections replicated on every tp rank (TELinear ``parallel_mode="duplicated"``) over its own
    tokens (1/tp of them with sequence parallelism), and the up-projections column-parallel over the
    heads, their latent input gathered under sequence parallelism; none without MLA."""
    if not spec.is_mla:
        return []
    t, h, T = shard.tp, spec.hidden_size, shard.tokens
    own = T / shard.sp_div
    nope = spec.head_dim - spec.qk_rope_head_dim
    gemms = [Gemm(own, spec.q_lora_rank, h)] if spec.q_lora_rank else []  # q_down
    return gemms + [
        Gemm(own, spec.kv_lora_rank + spec.qk_rope_head_dim, h),  # kv_down
        Gemm(T, spec.num_heads / t * (nope + spec.value_head_dim), spec.kv_lora_rank, gathered=COLUMN),
    ]  # kv_up


def _attention_gemms(spec: ModelSpec, shard: Shard) -> list[Gemm]:
    """The attention's column-parallel input projection (QKV; MLA: the query or query up-projection)
    and its row-parallel output projection."""
    t, h, T = shard.tp, spec.hidden_size, shard.tokens
    if spec.is_mla:
        q_in = spec.q_lora_rank or h
        column = Gemm(T, spec.q_channels / t, q_in, gathered=COLUMN)
    else:
        column = Gemm(T, spec.q_channels / t + 2 * _kv_per_device(spec, t), h, gathered=COLUMN)
    return [column, Gemm(T, h, spec.num_heads * spec.value_head_dim / t, gathered=ROW)]


def _mixer_gemms(spec: ModelSpec, layer: int, shard: Shard) -> list[Gemm]:
    """The projections of block ``layer``'s mixer, its column- and row-parallel pair first: the
    attention's, a Mamba mixer's (model/ssm.py ``projection_shapes``), none without a mixer."""
    mixer = spec.mixer_of(layer)
    if mixer == "attention":
        return _attention_gemms(spec, shard)
    if mixer == "none":
        return []
    split = {"column": COLUMN, "row": ROW, "local": ""}
    return [
        Gemm(shard.tokens, n, k, gathered=split[how])
        for n, k, how in ssm.projection_shapes(spec.mamba, spec.hidden_size, shard.tp)
    ]


def block_gemms(spec: ModelSpec, layer: int, shard: Shard) -> list[Gemm]:
    """Forward GEMMs of one block on one device (Megatron column/row-parallel split): the attention's
    input and output projections first, then the MLP's (dense: its column/row pair), then MLA's
    further projections (``_latent_gemms``)."""
    t, h, T = shard.tp, spec.hidden_size, shard.tokens
    gemms = _mixer_gemms(spec, layer, shard)
    if not spec.has_ffn(layer):
        return gemms
    up = 2 if spec.gated_mlp else 1
    if not spec.is_moe_layer(layer):
        f = spec.ffn_hidden_size / t
        return gemms + [Gemm(T, up * f, h, gathered=COLUMN), Gemm(T, h, f, gathered=ROW)] + _latent_gemms(spec, shard)
    gemms.append(Gemm(T, spec.num_experts, h))  # router
    local_experts = spec.num_experts / shard.expert_parallel
    # token copies per expert (balanced routing): the expert-parallel group's tokens, ep x tp / etp ranks
    # of T / tp tokens each (sequence-parallel shares), top-k copies each over E experts, gathered over
    # the etp ranks of an expert's shard; without folding (etp = tp) the ep ranks' T tokens each
    rows = T * shard.ep * spec.experts_per_token / spec.num_experts * shard.capacity
    f = spec.moe_ffn_hidden_size / shard.expert_tp
    gemms += [Gemm(rows, up * f, h, local_experts), Gemm(rows, h, f, local_experts)]
    if spec.num_shared_experts:
        fs = spec.shared_expert_ffn_hidden_size / t
        gemms += [Gemm(T, up * fs, h, spec.num_shared_experts, COLUMN), Gemm(T, h, fs, spec.num_shared_experts, ROW)]
    return gemms + _latent_gemms(spec, shard)


def attention_keys(spec: ModelSpec, layer: int | None, seq_len: int) -> int:
    """Keys the attention of ``layer`` spans for a query: its sliding window, at most the
    sequence, in a windowed layer; its chunk, at most the sequence, in a chunked layer (Llama 4:
    the keys of the query's own chunk); the whole sequence otherwise (and for ``layer`` None)."""
    span = None if layer is None else (spec.window_of(layer) or spec.chunk_of(layer))
    return seq_len if span is None else min(span, seq_len)


def attention_core_gemms(spec: ModelSpec, shard: Shard, layer: int | None = None) -> list[Gemm]:
    """Scores Q K^T and the weighted sum with V, per head on one device, over the rectangle of
    queries x ``attention_keys`` (a full-attention layer when ``layer`` is None). Of that rectangle a
    causal kernel computes ``attended_fraction``: :func:`attention_core_flops`."""
    heads = shard.micro_batch * spec.num_heads / shard.tp
    s_q = shard.seq_len / shard.cp
    s_k = attention_keys(spec, layer, shard.seq_len)
    return [Gemm(s_q, s_k, spec.head_dim, heads), Gemm(s_q, spec.value_head_dim, s_k, heads)]


def attended_fraction(spec: ModelSpec, layer: int | None, seq_len: int) -> float:
    """Fraction of the queries x ``attention_keys`` rectangle a flash kernel computes.

    Non-causal: all of it. Causal with a span of w keys over s queries (w = s for full attention):
    query i attends to min(i + 1, w) keys (FlashAttention-2's local attention, ``window_size=(w - 1, 0)``;
    Mistral 7B, Jiang et al. 2023, arXiv 2310.06825 section 2: "each token can attend to at most W
    tokens"), w s - w^2 / 2 pairs in all (block granularity aside), a fraction 1 - w / (2 s) of s x w:
    the causal half at w = s, nearly all of a window much shorter than the sequence.

    Causal within chunks of c keys (Llama 4's chunked layers, HF modeling_llama4: a query sees the
    keys from the start of its chunk to itself): c^2 / 2 pairs per full chunk (on average c / 2 keys
    a query), r^2 / 2 for a last partial chunk of r = s mod c tokens, of the s x c rectangle.
    """
    if not spec.causal:
        return 1.0
    keys = attention_keys(spec, layer, seq_len)
    if layer is not None and spec.chunk_of(layer) is not None:
        rest = seq_len % keys
        return ((seq_len - rest) * keys + rest * rest) / (2.0 * seq_len * keys)
    return 1.0 - keys / (2.0 * seq_len)


def attention_core_flops(spec: ModelSpec, shard: Shard, layer: int | None = None) -> float:
    """Forward FLOPs a flash kernel computes for the attention core of ``layer`` on one device."""
    gemms = attention_core_gemms(spec, shard, layer)
    return attended_fraction(spec, layer, shard.seq_len) * sum(g.flops for g in gemms)


def block_model_flops(spec: ModelSpec, layer: int, tokens: float, seq_len: int) -> float:
    """Forward model FLOPs of one block for ``tokens`` tokens (no parallelism, the full s x s
    attention rectangle; s x w in a layer with a sliding window of w < s keys).

    Narayanan et al. SC'21 eq. 3 counts 24 b s h^2 + 4 b s^2 h per GPT layer; this is the
    same count generalised to GQA, gated MLPs, top-k experts and local attention.
    """
    per_token = sum(g.flops for g in block_gemms(spec, layer, Shard(seq_len=seq_len, micro_batch=1))) / seq_len
    return tokens * (per_token + _core_model_flops(spec, layer, seq_len))


def _core_model_flops(spec: ModelSpec, layer: int, seq_len: int) -> float:
    """Forward model FLOPs per token of block ``layer``'s mixer core: the attention's
    (``attention_model_flops``), a Mamba mixer's scan (model/ssm.py ``scan_flops``), none without a mixer."""
    mixer = spec.mixer_of(layer)
    if mixer == "attention":
        return attention_model_flops(spec, layer, seq_len)
    return ssm.scan_flops(spec.mamba, 1) if mixer == "mamba" else 0.0


def attention_model_flops(spec: ModelSpec, layer: int | None, seq_len: int) -> float:
    """Forward model FLOPs per token of the attention core: Q K^T over the query/key head and scores
    x V over the value head, for every query head over the rectangle's ``attention_keys``: 4 s h
    per token for GPT (Narayanan et al. SC'21 eq. 3), 2 s a (d_qk + d_v) with MLA's heads."""
    keys = attention_keys(spec, layer, seq_len)
    return 2.0 * keys * spec.num_heads * (spec.head_dim + spec.value_head_dim)


def head_gemm(spec: ModelSpec, shard: Shard) -> Gemm:
    """The output projection onto the (vocab-parallel) vocabulary."""
    return Gemm(shard.tokens, spec.vocab_size / shard.tp, spec.hidden_size)


def head_model_flops(spec: ModelSpec, tokens: float) -> float:
    return 2.0 * tokens * spec.hidden_size * spec.vocab_size


def mtp_model_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward model FLOPs of a sequence's MTP modules: each a block like the last, its projection M
    (2h x h per token) and the output head again (Megatron-LM counts them in its reported FLOPs,
    training.py ``num_floating_point_operations``)."""
    module = (
        block_model_flops(spec, spec.num_layers - 1, seq_len, seq_len)
        + head_model_flops(spec, seq_len)
        + 2.0 * seq_len * 2 * spec.hidden_size * spec.hidden_size
    )
    return spec.mtp_layers * module


# ---------------------------------------------------------------- activations
def score_elements(spec: ModelSpec, shard: Shard) -> float:
    """Elements of one s x s attention-score tensor on one device: a b s^2 / (t cp). A sliding
    window does not shrink it: attention that is not fused computes the full s x s scores and then
    masks those outside the window (HF modeling_mistral ``eager_attention_forward``: Q K^T + mask)."""
    return spec.num_heads / shard.tp * shard.micro_batch * (shard.seq_len / shard.cp) * shard.seq_len


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
