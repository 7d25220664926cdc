"""Per-layer GEMM shapes and FLOPs on one device (Megatron's column/row-parallel split under tp, tokens
split by cp, experts by ep), the attention core's rectangle, and the model FLOPs of a block, the head
and the MTP modules (``nestplan.model.layers``)."""

from __future__ import annotations

import math

from nestplan.model import ssm
from nestplan.model.layers.shard import COLUMN, ROW, Gemm, Shard
from nestplan.model.spec import ModelSpec


def mtp_projection_gemm(spec: ModelSpec, shard: Shard) -> Gemm:
    """One MTP module's projection M of the concatenated normed embedding and hidden state (2h) onto
    h, column-parallel over tp (Megatron-Core multi_token_prediction.py ``eh_proj``; under sp its input
    is all-gathered, and its output all-gathered over tp before the block)."""
    return Gemm(shard.tokens, spec.hidden_size / shard.tp, 2 * spec.hidden_size, gathered=COLUMN)


def _kv_per_device(spec: ModelSpec, tp: int) -> float:
    """K (or V) channels per device: kv heads split over tp, replicated when tp > kv heads; where the
    key and value heads differ (MLA: nope + rope and v), their mean, so that twice it is K and V together."""
    return math.ceil(spec.num_kv_heads / tp) * (spec.head_dim + spec.value_head_dim) / 2


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
    heads = shard.micro_batch_size * spec.num_heads / shard.tp
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


def block_model_flops(spec: ModelSpec, layer: int, tokens: float, seq_len: int, attended: bool = False) -> float:
    """Forward model FLOPs of one block for ``tokens`` tokens (no parallelism, the full s x s
    attention rectangle; s x w in a layer with a sliding window of w < s keys).

    Narayanan et al. SC'21 eq. 3 counts 24 b s h^2 + 4 b s^2 h per GPT layer; this is the
    same count generalised to GQA, gated MLPs, top-k experts and local attention. ``attended``: only
    the part of the rectangle a causal model attends (``attended_fraction``: the causal half of the
    square), as Megatron-LM counts the FLOPs it reports (training.py ``num_floating_point_operations``:
    "causal mask (only half of the mask is non-zero)"): the convention of nestplan's MFU.
    """
    per_token = sum(g.flops for g in block_gemms(spec, layer, Shard(seq_len=seq_len))) / seq_len
    return tokens * (per_token + _core_model_flops(spec, layer, seq_len, attended))


def _core_model_flops(spec: ModelSpec, layer: int, seq_len: int, attended: bool) -> float:
    """Forward model FLOPs per token of block ``layer``'s mixer core: the attention's
    (``attention_model_flops``, of its attended part where ``attended``), a Mamba mixer's scan
    (model/ssm.py ``scan_flops``), none without a mixer."""
    mixer = spec.mixer_of(layer)
    if mixer == "attention":
        share = attended_fraction(spec, layer, seq_len) if attended else 1.0
        return share * attention_model_flops(spec, layer, seq_len)
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


def mtp_model_flops(spec: ModelSpec, seq_len: int, attended: bool = False) -> float:
    """Forward model FLOPs of a sequence's MTP modules: each a block like the last (``attended`` as
    ``block_model_flops``), its projection M (2h x h per token) and the output head again (Megatron-LM
    counts them in its reported FLOPs, training.py ``num_floating_point_operations``)."""
    module = (
        block_model_flops(spec, spec.num_layers - 1, seq_len, seq_len, attended)
        + head_model_flops(spec, seq_len)
        + 2.0 * seq_len * 2 * spec.hidden_size * spec.hidden_size
    )
    return spec.mtp_layers * module
