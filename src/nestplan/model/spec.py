"""ModelSpec: the architecture of a transformer, read from a Hugging Face style config.json, and
Block, the typed record of one of its blocks."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cached_property
from typing import Callable

from nestplan.model.facts import Facts
from nestplan.model.ssm import Mamba1Shape, Mamba2Shape, MambaShape


class Mixer(StrEnum):
    """What mixes a block's tokens: softmax attention (MHA, GQA, MQA), multi-head latent attention
    (DeepSeek-V2, arXiv 2405.04434 section 2.1), a Mamba-1 selective SSM (Jamba), a Mamba-2 mixer
    (Nemotron-H), or nothing (Nemotron-H's MLP-only blocks)."""

    ATTENTION = "attention"
    MLA = "mla"
    MAMBA1 = "mamba1"
    MAMBA2 = "mamba2"
    NONE = "none"

    @property
    def category(self) -> str:
        """ "attention" (softmax or latent), "mamba" (either selective SSM) or "none": the cost model's
        three kinds of mixer, whose sizes ``ModelSpec`` holds (``kv_lora_rank`` ..., ``mamba``)."""
        return _MIXER_CATEGORIES[self]


_MIXER_CATEGORIES = {
    Mixer.ATTENTION: "attention",
    Mixer.MLA: "attention",
    Mixer.MAMBA1: "mamba",
    Mixer.MAMBA2: "mamba",
    Mixer.NONE: "none",
}


class FFN(StrEnum):
    """A block's feed-forward part after its mixer: a dense MLP, a mixture of experts, or none."""

    DENSE = "dense"
    MOE = "moe"
    NONE = "none"


class QKNorm(StrEnum):
    """QK-norm variants: none; one norm of head_dim weights shared by every query (and one by every
    key) head (Qwen3, Gemma 3); one norm over the full query (and key) projection width (OLMo 2, whose
    q_norm is RMSNorm(num_heads * head_dim)); an L2 norm of each head without weights, on the layers
    with rotary positions only (Llama 4, HF modeling_llama4 Llama4TextL2Norm)."""

    NONE = "none"
    HEAD = "head"
    FULL = "full"
    L2 = "l2"


# the Mamba mixers and the shape of their sizes (``ModelSpec.mamba``)
_MAMBA_SHAPES = {Mixer.MAMBA1: Mamba1Shape, Mixer.MAMBA2: Mamba2Shape}


@dataclass(frozen=True)
class Block:
    """One block of the stack: its mixer, its FFN, and the attention's variants. Blocks that are equal
    have the same parameters, FLOPs and stored bytes (``ModelSpec.block_kind``)."""

    mixer: Mixer = Mixer.ATTENTION
    ffn: FFN = FFN.DENSE
    # local attention: each query attends to at most the ``window`` latest keys (itself included);
    # None: the whole sequence
    window: int | None = None
    # chunked local attention (Llama 4): a query attends to the keys of its own chunk of ``chunk``
    # tokens; None: no chunking
    chunk: int | None = None
    rope: bool = True  # False: the block's attention has no rotary positions (Llama 4's NoPE layers)
    qk_norm: QKNorm = QKNorm.NONE  # the norm of its queries and keys

    def __repr__(self) -> str:
        """Its mixer and FFN, and the attention's variants where they differ from the defaults."""
        variants = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)[2:] if getattr(self, f.name) != f.default]
        return f"Block({', '.join([f'mixer={self.mixer}', f'ffn={self.ffn}', *variants])})"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder (or encoder) transformer stack, everything the cost model needs.

    Sizes are element counts; byte sizes are derived with the job's dtype. ``blocks`` holds one
    :class:`Block` per layer (what differs between layers: mixer, FFN, window, chunk, RoPE, QK-norm);
    the fields hold the sizes those blocks share.
    """

    name: str
    family: str
    hidden_size: int
    blocks: tuple[Block, ...]
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
    type_vocab_size: int = 0  # bert token-type embeddings
    qkv_bias: bool = False  # biases on the Q, K and V projections only (Qwen2); see linear_bias
    block_norms: int = 2  # norms per block: 2 (pre- or post-norms), 4 (Gemma 2/3: pre and post)
    # fraction of each query and key head that rotary position embeddings rotate (Nemotron's
    # partial_rotary_factor: 0.5); 1.0 for the other rotary families, unused with learned positions
    rotary_fraction: float = 1.0
    # multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 section 2.1), the sizes of Mixer.MLA blocks:
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
    attention_sinks: bool = False  # one learned logit per head added to the softmax (gpt-oss)
    parallel_block: bool = False  # attention and MLP read the same input, summed (Falcon, GPT-J)
    # measured / closed-form ratios of a block's FLOPs and saved bytes (``nestplan plan --trace``);
    # the cost model scales block compute and activation memory by them (1: the formulas as they are)
    traced_flops_scale: float = 1.0
    traced_activation_scale: float = 1.0
    # hybrid stacks (Nemotron-H, Jamba): the Mamba mixers' sizes, a Mamba2Shape for Mixer.MAMBA2 blocks or
    # a Mamba1Shape for Mixer.MAMBA1 ones (None without Mamba layers)
    mamba: MambaShape | None = None
    # what it computes beyond its shapes (norm epsilon, activation, RoPE, router weights): nothing nestplan
    # counts, all that a framework building it from an export must build (nestplan.model.facts)
    facts: Facts = Facts()

    def __post_init__(self) -> None:
        """The blocks' mixers have their sizes: MLA blocks the latent ranks, Mamba blocks ``mamba``'s shape."""
        mixers = {block.mixer for block in self.blocks}
        if (Mixer.MLA in mixers) != (self.kv_lora_rank > 0):
            raise ValueError(f"{self.name}: MLA blocks and kv_lora_rank {self.kv_lora_rank} disagree")
        for mixer in mixers & _MAMBA_SHAPES.keys():
            if not isinstance(self.mamba, _MAMBA_SHAPES[mixer]):
                raise ValueError(f"{self.name}: {mixer} blocks without their sizes ({self.mamba!r})")

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def layers_where(self, test: Callable[[Block], bool]) -> tuple[int, ...]:
        """The indices of the blocks ``test`` accepts."""
        return tuple(i for i, block in enumerate(self.blocks) if test(block))

    @cached_property
    def moe_layers(self) -> tuple[int, ...]:
        return self.layers_where(lambda block: block.ffn is FFN.MOE)

    @cached_property
    def mamba_layers(self) -> tuple[int, ...]:
        return self.layers_where(lambda block: block.mixer.category == "mamba")

    @cached_property
    def sliding_window(self) -> int | None:
        """The window of the windowed blocks in keys (the first one's), None where every block attends to
        the whole sequence."""
        return next((block.window for block in self.blocks if block.window is not None), None)

    @cached_property
    def attention_chunk_size(self) -> int | None:
        """The chunk of the chunked blocks in tokens (the first one's), None where no block is chunked."""
        return next((block.chunk for block in self.blocks if block.chunk is not None), None)

    @cached_property
    def qk_norm(self) -> QKNorm:
        """The model's QK-norm: that of its blocks with one (the first's), NONE where none has one."""
        return next((block.qk_norm for block in self.blocks if block.qk_norm is not QKNorm.NONE), QKNorm.NONE)

    @cached_property
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

    @cached_property
    def is_mla(self) -> bool:
        return any(block.mixer is Mixer.MLA for block in self.blocks)

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
        return self.num_experts > 0 and self.blocks[index].ffn is FFN.MOE

    def window_of(self, index: int) -> int | None:
        """The sliding window of layer ``index`` in keys, or None when it attends to the whole sequence."""
        return self.blocks[index].window

    def chunk_of(self, index: int) -> int | None:
        """The attention chunk of layer ``index`` in tokens, or None when it is not chunked."""
        return self.blocks[index].chunk

    def has_qk_norm(self, index: int) -> bool:
        """Whether layer ``index`` normalises its queries and keys (Llama 4's L2 norm: rotary layers only)."""
        return self.blocks[index].qk_norm is not QKNorm.NONE

    @cached_property
    def is_hybrid(self) -> bool:
        """Whether some block is not attention + FFN (Nemotron-H's Mamba, MLP-only or attention-only layers)."""
        return any(block.mixer.category != "attention" or block.ffn is FFN.NONE for block in self.blocks)

    def mixer_of(self, index: int) -> str:
        """The mixer of block ``index``: "attention" (softmax or latent), "mamba" (``mamba``'s kind) or "none"."""
        return self.blocks[index].mixer.category

    def has_ffn(self, index: int) -> bool:
        """Whether block ``index`` has an FFN (dense MLP or MoE) after its mixer."""
        return self.blocks[index].ffn is not FFN.NONE

    def block_kind(self, index: int) -> Block:
        """What makes blocks cost differently: the block itself; blocks of one kind have the same
        parameters, FLOPs and stored bytes."""
        return self.blocks[index]
