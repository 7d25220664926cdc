"""ModelSpec: the architecture of a transformer, read from a Hugging Face style config.json."""

from __future__ import annotations

from dataclasses import dataclass, field

from nestplan.model.ssm import MambaShape

# QK-norm variants (``ModelSpec.qk_norm``): none; one norm of head_dim weights shared by every query
# (and one by every key) head (Qwen3, Gemma 3); one norm over the full query (and key) projection
# width (OLMo 2, whose q_norm is RMSNorm(num_heads * head_dim)); an L2 norm of each head without
# weights, on the layers with rotary positions only (Llama 4, HF modeling_llama4 Llama4TextL2Norm)
QK_NORM_KINDS = ("none", "head", "full", "l2")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder (or encoder) transformer stack, everything the cost model needs.

    Sizes are element counts; byte sizes are derived with the job's dtype.
    A layer is MoE when ``num_experts > 0`` and its index is in ``moe_layers``; a layer attends
    to a sliding window of ``sliding_window`` keys when its index is in ``sliding_window_layers``.
    """

    name: str
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int  # dense MLP intermediate size
    gated_mlp: bool  # SwiGLU/GeGLU: gate and up projections
    vocab_size: int
    tied_embeddings: bool
    max_position_embeddings: int
    learned_position_embeddings: bool  # gpt2, bert: a position table of max_position_embeddings x hidden
    norm: str  # "layernorm" or "rmsnorm"
    linear_bias: bool  # biases on attention and MLP projections
    dropout: bool  # dropout masks are stored (Korthikanti et al. 2022 counts them)
    causal: bool = True
    num_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    moe_layers: tuple[int, ...] = field(default_factory=tuple)
    type_vocab_size: int = 0  # bert token-type embeddings
    # local attention: each query attends to at most the ``sliding_window`` latest keys (itself
    # included) in the layers listed; None (and no layers): every layer attends to the whole sequence
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] = field(default_factory=tuple)
    qkv_bias: bool = False  # biases on the Q, K and V projections only (Qwen2); see linear_bias
    qk_norm: str = "none"  # one of QK_NORM_KINDS
    block_norms: int = 2  # norms per block: 2 (pre- or post-norms), 4 (Gemma 2/3: pre and post)
    # fraction of each query and key head that rotary position embeddings rotate (Nemotron's
    # partial_rotary_factor: 0.5); 1.0 for the other rotary families, unused with learned positions
    rotary_fraction: float = 1.0
    # multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 section 2.1), when kv_lora_rank > 0:
    # queries through a rank-q_lora_rank latent (0: a plain q projection), keys and values through a
    # rank-kv_lora_rank latent, plus one rotary key of qk_rope_head_dim shared by the heads; head_dim is
    # the query/key head (nope + rope), value_head_dim the value head (0: head_dim)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # node-limited routing (DeepSeek-V3, arXiv 2412.19437 section 2.1.2): experts in routing_groups
    # groups, each token routed within routing_groups_per_token of them (1, 1: unrestricted)
    routing_groups: int = 1
    routing_groups_per_token: int = 1
    router_bias: bool = False  # a bias per expert on the router (gpt-oss; DeepSeek-V3's correction bias)
    # the router scores every expert and takes its top-k of those (a softmax over all experts, kept
    # un-renormalised: Qwen2-MoE, DeepSeek-V2; or sigmoid scores: DeepSeek-V3, Llama 4, Nemotron-H;
    # Megatron-Core moe_router_pre_softmax / score_function sigmoid), rather than scoring the top-k logits
    # alone (Mixtral, Qwen3-MoE, gpt-oss: a softmax over the top-k)
    router_scores_all_experts: bool = False
    moe_probs_on_input: bool = False  # the routing probabilities scale the experts' input (top-1: Llama 4)
    shared_expert_gate: bool = False  # a sigmoid gate scales the shared experts' output (Qwen2-MoE)
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3 section 2.2): not in num_layers
    # chunked local attention (Llama 4): a query attends to the keys of its own chunk of
    # attention_chunk_size tokens, in the layers listed; None (and no layers): no chunking
    attention_chunk_size: int | None = None
    chunked_attention_layers: tuple[int, ...] = field(default_factory=tuple)
    nope_layers: tuple[int, ...] = field(default_factory=tuple)  # layers without rotary positions (Llama 4)
    attention_sinks: bool = False  # one learned logit per head added to the softmax (gpt-oss)
    parallel_block: bool = False  # attention and MLP read the same input, summed (Falcon, GPT-J)
    # measured / closed-form ratios of a block's FLOPs and saved bytes (``nestplan plan --trace``);
    # the cost model scales block compute and activation memory by them (1: the formulas as they are)
    traced_flops_scale: float = 1.0
    traced_activation_scale: float = 1.0
    # hybrid stacks (Nemotron-H, Jamba): a block is a mixer (attention, a Mamba mixer in ``mamba_layers``,
    # or none in ``mixerless_layers``) and an FFN (none in ``ffn_free_layers``); empty: every block is
    # attention + FFN. ``mamba``: the Mamba mixers' sizes (Mamba-2 or Mamba-1; None without Mamba layers)
    mamba: MambaShape | None = None
    mamba_layers: tuple[int, ...] = field(default_factory=tuple)
    mixerless_layers: tuple[int, ...] = field(default_factory=tuple)
    ffn_free_layers: tuple[int, ...] = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and len(self.moe_layers) > 0

    @property
    def max_seq_len(self) -> int | None:
        """The longest sequence the model can take: the length of its learned absolute position
        table (gpt2, bert); None for rotary models, whose positions have no hard limit."""
        return self.max_position_embeddings if self.learned_position_embeddings else None

    @property
    def kv_channels(self) -> int:
        """Width of the keys: kv heads x head dim (the values' too, unless ``value_head_dim`` differs)."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        """Width of one value head: ``v_head_dim`` where set (MLA), else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    @property
    def v_channels(self) -> int:
        """Width of the values, and of the attention output the output projection reads per query head."""
        return self.num_kv_heads * self.value_head_dim

    @property
    def q_channels(self) -> int:
        return self.num_heads * self.head_dim

    def is_moe_layer(self, index: int) -> bool:
        return self.num_experts > 0 and index in self.moe_layers

    def window_of(self, index: int) -> int | None:
        """The sliding window of layer ``index`` in keys, or None when it attends to the whole sequence."""
        return self.sliding_window if index in self.sliding_window_layers else None

    def chunk_of(self, index: int) -> int | None:
        """The attention chunk of layer ``index`` in tokens, or None when it is not chunked."""
        return self.attention_chunk_size if index in self.chunked_attention_layers else None

    def has_qk_norm(self, index: int) -> bool:
        """Whether layer ``index`` normalises its queries and keys (Llama 4's L2 norm: rotary layers only)."""
        return self.qk_norm != "none" and not (self.qk_norm == "l2" and index in self.nope_layers)

    @property
    def is_hybrid(self) -> bool:
        """Whether some block is not attention + FFN (Nemotron-H's Mamba, MLP-only or attention-only layers)."""
        return bool(self.mamba_layers or self.mixerless_layers or self.ffn_free_layers)

    def mixer_of(self, index: int) -> str:
        """The mixer of block ``index``: "attention", "mamba" (``mamba``'s kind) or "none"."""
        if index in self.mamba_layers:
            return "mamba"
        return "none" if index in self.mixerless_layers else "attention"

    def has_ffn(self, index: int) -> bool:
        """Whether block ``index`` has an FFN (dense MLP or MoE) after its mixer."""
        return index not in self.ffn_free_layers

    def block_kind(self, index: int) -> tuple:
        """What makes blocks cost differently: (is an MoE block, its sliding window), and where the model
        has chunked attention or layers without rotary positions, its chunk and whether it has rotary
        positions, and in a hybrid stack its mixer and whether it has an FFN; blocks of one kind have the
        same parameters, FLOPs and stored bytes."""
        kind: tuple = (self.is_moe_layer(index), self.window_of(index))
        if self.chunked_attention_layers or self.nope_layers:
            kind += (self.chunk_of(index), index in self.nope_layers)
        if self.is_hybrid:
            kind += (self.mixer_of(index), self.has_ffn(index))
        return kind
