"""The training job: what is trained, independent of how it is split."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from nestplan.errors import ConfigError, brief, printable
from nestplan.units import DTYPE_BYTES

MAX_GLOBAL_BATCH_SIZE = 2**24  # sequences per step (published pre-training batches reach 2^14)
MAX_SEQ_LEN = 2**21  # tokens per sequence (long-context training reaches 2^20)
DEFAULT_SEQ_LEN_CAP = 8192  # a typical pre-training length


def check_count(value: object, field: str, limit: int) -> int:
    """``value`` itself when it is an integer in 1..limit; a ConfigError naming ``field`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise ConfigError(
            f"{field} must be a positive integer up to {limit:,}, got {brief(value)}",
            field=field,
            value=value,
            limit=f"1..{limit}",
        )
    return value


class Optimizer(str, Enum):
    """Optimizer, by the per-parameter state it keeps (``OptimizerState`` says in what dtype)."""

    ADAM = "adam"  # master weights + first and second moments: 12 bytes/param in fp32
    SGD = "sgd"  # master weights only: 4 bytes/param


class OptimizerState(str, Enum):
    """How the optimizer keeps its master weights and Adam's moments, per parameter."""

    FP32 = "fp32"  # fp32 master copy and moments (Megatron-LM's default)
    # the master copy's low 16 bits only, the bf16 parameter holding its high 16 (Apex
    # DistributedFusedAdam store_param_remainders, NeMo 1.x's choice for bf16 parameters under its
    # distributed Adam; Megatron-Core's --use-precision-aware-optimizer, store_param_remainders)
    REMAINDERS = "remainders"
    # moments in bf16 and no master copy beside bf16 parameters, a bf16 one beside FP8 parameters (Apex
    # DistributedFusedAdam with dtype bf16, NeMo ``optim.dtype: bf16``: store_params only under fp8_params)
    BF16 = "bf16"


MASTER_BYTES = {OptimizerState.FP32: 4, OptimizerState.REMAINDERS: 2, OptimizerState.BF16: 2}
MOMENT_BYTES = {OptimizerState.FP32: 4, OptimizerState.REMAINDERS: 4, OptimizerState.BF16: 2}


class CpCommType(str, Enum):
    """How context parallelism exchanges keys and values (Megatron-LM ``--cp-comm-type``, Transformer
    Engine's attention with context parallelism)."""

    P2P = "p2p"  # ring: K/V passed cp - 1 steps, overlapped with attention (Liu et al. 2023)
    A2A = "a2a"  # Ulysses: all-to-alls trade sequence for heads around attention (Jacobs et al. 2023)
    ALLGATHER = "allgather"  # K/V all-gathered before attention (Llama 3, Dubey et al. 2024, section 3.3.2)
    A2A_P2P = "a2a+p2p"  # all-to-all inside groups of cp_a2a_size ranks, a ring across them


MAX_CP_A2A_SIZE = 2**20  # the bound of any parallel degree


class MoeDispatcher(str, Enum):
    """How an MoE layer's token copies reach their experts (Megatron-Core ``--moe-token-dispatcher-type``)."""

    ALLTOALL = "alltoall"  # every copy sent to its expert's rank (MoEAlltoAllTokenDispatcher)
    # each token sent once to every node that holds one of its experts, then forwarded inside the node
    # (DeepEP, Zhao et al. 2025, github.com/deepseek-ai/DeepEP; Megatron-Core's flex dispatcher)
    DEEPEP = "deepep"


class Fp8Recipe(str, Enum):
    """How FP8 GEMMs are scaled (Transformer Engine recipes, ``transformer_engine.common.recipe``)."""

    DELAYED = "delayed"  # per-tensor scale from an amax history (DelayedScaling; Hopper)
    TENSORWISE = "tensorwise"  # per-tensor scale from the current amax (Float8CurrentScaling)
    BLOCKWISE = "blockwise"  # 1 x 128 activation and 128 x 128 weight blocks (Float8BlockScaling)
    MXFP8 = "mxfp8"  # 32-element blocks with E8M0 scales (MXFP8BlockScaling; Blackwell)


# --moe-expert-capacity-factor: below 1 most tokens would be dropped; above 16 nearly every expert pads
# to many times its share (published runs use 1.0 to 2.0: Megatron-Core MoE README, Switch Transformer)
MIN_CAPACITY_FACTOR, MAX_CAPACITY_FACTOR = 0.5, 16.0


@dataclass(frozen=True)
class Job:
    """A training job.

    global_batch_size: sequences per optimizer step.
    grad_dtype: dtype of the accumulated gradients; Megatron-LM accumulates and
        all-reduces gradients in fp32 by default (``--accumulate-allreduce-grads-in-fp32``),
        which makes mixed-precision Adam 18 bytes per parameter (Korthikanti et al. 2022, Figure 1).
        ``--grad-reduce-in-bf16`` (NeMo ``grad_sync_dtype: bf16``) makes the buffer and its traffic bf16.
    flash_attention: attention runs as a fused kernel (Dao et al. 2022): the s x s
        score tensors are neither stored nor written to HBM.
    tp_comm_overlap: tensor-parallel all-gathers and reduce-scatters run under the GEMMs that
        consume or produce them (Transformer Engine userbuffers, Megatron-LM ``--tp-comm-overlap``;
        off by default there).
    overlap_grad_reduce, overlap_param_gather: the data-parallel gradient reduction runs under the
        backward pass and the distributed optimizer's parameter all-gather under the next forward
        (Megatron-LM ``--overlap-grad-reduce`` / ``--overlap-param-gather``, NeMo ``overlap_grad_sync`` /
        ``overlap_param_sync``; on in NeMo's and Megatron-Bridge's recipes).
    fp8_recipe: the transformer blocks' GEMMs run in FP8 with this scaling (Transformer Engine,
        ``--fp8-format hybrid --fp8-recipe ...``); None: no FP8. Attention, norms, the output
        layer and master weights stay in ``dtype``.
    fp8_params: parameters are kept in FP8 instead of ``dtype`` (Transformer Engine ``fp8_model_init``,
        NeMo ``fp8_params``), so the distributed optimizer all-gathers FP8 parameters.
    cp_comm_type, cp_a2a_size: how context parallelism exchanges keys and values (``CpCommType``) and,
        for a2a+p2p, the all-to-all group's size (Megatron-LM ``--hierarchical-context-parallel-sizes
        A P``); 1 otherwise.
    moe_comm_overlap: the expert all-to-alls of one microbatch run under another's compute
        (Megatron-Core's 1F1B A2A overlap, ``--overlap-moe-expert-parallel-comm``: the forward of
        microbatch i + 1 merged with the backward of microbatch i, layer by layer), which holds one
        more microbatch's activations in flight; off by default there.
    moe_dispatcher: ``MoeDispatcher``: with DeepEP a token crosses the network once per node that holds
        one of its experts, which node-limited routing bounds (DeepSeek-V3: 4 nodes for 8 experts).
    moe_capacity_factor: every expert processes this many times its balanced share of the token
        copies, padded (Megatron-Core ``--moe-expert-capacity-factor C --moe-pad-expert-input-to-capacity``):
        the experts' GEMMs, their kept copies and the all-to-alls grow by C. None: dropless routing,
        costed balanced, which the load-balancing loss aims at (an imbalanced step is slower, by its
        busiest expert's excess, than predicted).
    optimizer_state: ``OptimizerState``: fp32 master weights and moments, 16-bit remainders of the
        master weights, or bf16 moments without a master copy (Adam only; beside bf16 parameters).
    """

    global_batch_size: int
    seq_len: int
    dtype: str = "bf16"
    grad_dtype: str = "fp32"
    optimizer: Optimizer = Optimizer.ADAM
    flash_attention: bool = True
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    fp8_recipe: Fp8Recipe | None = None
    fp8_params: bool = False
    cp_comm_type: CpCommType = CpCommType.P2P
    cp_a2a_size: int = 1
    moe_comm_overlap: bool = False
    moe_capacity_factor: float | None = None
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    optimizer_state: OptimizerState = OptimizerState.FP32

    def __post_init__(self) -> None:
        check_count(self.global_batch_size, "global_batch_size", MAX_GLOBAL_BATCH_SIZE)
        check_count(self.seq_len, "seq_len", MAX_SEQ_LEN)
        for field_name in ("dtype", "grad_dtype"):
            value = getattr(self, field_name)
            if value not in DTYPE_BYTES:
                raise ConfigError(
                    f"{field_name} '{value}' is not one of {', '.join(DTYPE_BYTES)}",
                    field=field_name,
                    value=value,
                    limit=list(DTYPE_BYTES),
                )
        allowed = [o.value for o in Optimizer]
        if self.optimizer not in allowed:
            raise ConfigError(
                f"optimizer {brief(self.optimizer)} is not one of {', '.join(allowed)}",
                field="optimizer",
                value=self.optimizer,
                limit=allowed,
            )
        object.__setattr__(self, "optimizer", Optimizer(self.optimizer))
        for flag in (
            "flash_attention",
            "tp_comm_overlap",
            "overlap_grad_reduce",
            "overlap_param_gather",
            "fp8_params",
            "moe_comm_overlap",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(
                    f"{flag} must be true or false, got {brief(getattr(self, flag))}",
                    field=flag,
                    value=getattr(self, flag),
                    limit=[True, False],
                )
        if self.dtype == "fp8":
            raise ConfigError(
                "dtype fp8 would run every tensor in FP8, which no framework trains with; use --fp8 "
                "(FP8 GEMMs in the transformer blocks, everything else in bf16)",
                field="dtype",
                value=self.dtype,
                limit="bf16, fp16 or fp32 (with --fp8 for FP8 GEMMs)",
            )
        recipes = [r.value for r in Fp8Recipe]
        if self.fp8_recipe is not None and self.fp8_recipe not in recipes:
            raise ConfigError(
                f"fp8 recipe {brief(self.fp8_recipe)} is not one of {', '.join(recipes)}",
                field="fp8_recipe",
                value=self.fp8_recipe,
                limit=recipes,
            )
        if self.fp8_recipe is not None:
            object.__setattr__(self, "fp8_recipe", Fp8Recipe(self.fp8_recipe))
        self._check_cp_comm()
        self._check_moe_dispatcher()
        self._check_optimizer_state()
        factor = self.moe_capacity_factor
        if factor is not None and (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not MIN_CAPACITY_FACTOR <= factor <= MAX_CAPACITY_FACTOR
        ):
            raise ConfigError(
                f"moe capacity factor must be a number in [{MIN_CAPACITY_FACTOR}, {MAX_CAPACITY_FACTOR}], "
                f"got {brief(factor)}",
                field="moe_capacity_factor",
                value=factor,
                limit=f"{MIN_CAPACITY_FACTOR}..{MAX_CAPACITY_FACTOR}",
            )
        if self.fp8_params and self.fp8_recipe is None:
            raise ConfigError(
                "fp8_params keeps parameters in FP8 and needs an FP8 recipe (--fp8)",
                field="fp8_params",
                value=True,
                limit="with --fp8",
            )

    def _check_optimizer_state(self) -> None:
        states = [k.value for k in OptimizerState]
        if self.optimizer_state not in states:
            raise ConfigError(
                f"optimizer state {brief(self.optimizer_state)} is not one of {', '.join(states)}",
                field="optimizer_state",
                value=self.optimizer_state,
                limit=states,
            )
        state = OptimizerState(self.optimizer_state)
        object.__setattr__(self, "optimizer_state", state)
        if state is OptimizerState.FP32:
            return
        if self.optimizer is not Optimizer.ADAM:
            raise ConfigError(
                f"optimizer state {state.value} is Adam's (Apex DistributedFusedAdam, Megatron-Core's "
                f"precision-aware Adam), not {self.optimizer.value}'s",
                field="optimizer_state",
                value=state.value,
                limit="fp32 with sgd",
            )
        if self.dtype != "bf16":
            raise ConfigError(
                f"optimizer state {state.value} keeps 16 bits beside bf16 parameters, not {self.dtype} ones",
                field="optimizer_state",
                value=state.value,
                limit="with dtype bf16",
            )
        if state is OptimizerState.REMAINDERS and self.fp8_params:
            raise ConfigError(
                "optimizer state remainders completes bf16 parameters, and fp8_params keeps them in FP8 "
                "(NeMo then stores the whole master copy)",
                field="optimizer_state",
                value=state.value,
                limit="fp32 or bf16 with fp8_params",
            )

    def _check_moe_dispatcher(self) -> None:
        kinds = [k.value for k in MoeDispatcher]
        if self.moe_dispatcher not in kinds:
            raise ConfigError(
                f"moe dispatcher {brief(self.moe_dispatcher)} is not one of {', '.join(kinds)}",
                field="moe_dispatcher",
                value=self.moe_dispatcher,
                limit=kinds,
            )
        object.__setattr__(self, "moe_dispatcher", MoeDispatcher(self.moe_dispatcher))
        if self.moe_dispatcher is MoeDispatcher.DEEPEP and self.moe_capacity_factor is not None:
            raise ConfigError(
                "the deepep dispatcher is dropless: it does not pad experts to a capacity factor "
                "(Megatron-Core refuses moe_pad_expert_input_to_capacity with it)",
                field="moe_capacity_factor",
                value=self.moe_capacity_factor,
                limit="none with deepep",
            )

    def _check_cp_comm(self) -> None:
        types = [t.value for t in CpCommType]
        if self.cp_comm_type not in types:
            raise ConfigError(
                f"cp comm type {brief(self.cp_comm_type)} is not one of {', '.join(types)}",
                field="cp_comm_type",
                value=self.cp_comm_type,
                limit=types,
            )
        object.__setattr__(self, "cp_comm_type", CpCommType(self.cp_comm_type))
        check_count(self.cp_a2a_size, "cp_a2a_size", MAX_CP_A2A_SIZE)
        hierarchical = self.cp_comm_type is CpCommType.A2A_P2P
        if hierarchical and self.cp_a2a_size < 2:
            raise ConfigError(
                "cp comm type a2a+p2p needs its all-to-all group size (cp_a2a_size) of at least 2",
                field="cp_a2a_size",
                value=self.cp_a2a_size,
                limit=">= 2",
            )
        if not hierarchical and self.cp_a2a_size != 1:
            raise ConfigError(
                f"cp_a2a_size {self.cp_a2a_size} is the all-to-all group of cp comm type a2a+p2p, "
                f"not of {self.cp_comm_type.value}",
                field="cp_a2a_size",
                value=self.cp_a2a_size,
                limit=1,
            )

    def cp_comm_conflict(self, cp: int, heads_per_device: int, kv_heads_per_device: int) -> ConfigError | None:
        """Why this job's context-parallel exchange cannot run at degree ``cp`` with these attention
        heads on a device (after tp), or None. The all-to-alls split a device's query and key/value
        heads over the group (Transformer Engine asserts both divisible); a2a+p2p's group divides cp."""
        if cp == 1 or self.cp_comm_type in (CpCommType.P2P, CpCommType.ALLGATHER):
            return None
        group = cp if self.cp_comm_type is CpCommType.A2A else self.cp_a2a_size
        if self.cp_comm_type is CpCommType.A2A_P2P and (cp % group or group >= cp):
            return ConfigError(
                f"cp {cp} is not a multiple of the a2a+p2p all-to-all group {group} times 2 or more",
                field="cp",
                value=cp,
                limit=f"a multiple of {group}, above it",
            )
        for name, heads in (("query", heads_per_device), ("key/value", kv_heads_per_device)):
            if heads % group:
                return ConfigError(
                    f"cp comm type {self.cp_comm_type.value} splits a device's {heads} {name} heads "
                    f"over {group} ranks, which does not divide them",
                    field="cp",
                    value=cp,
                    limit=f"a divisor of {heads}",
                )
        return None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def param_bytes(self) -> int:
        """Bytes of a parameter as the model holds and all-gathers it: FP8 under fp8_params."""
        return DTYPE_BYTES["fp8"] if self.fp8_params else self.dtype_bytes

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def fp8(self) -> bool:
        return self.fp8_recipe is not None

    @property
    def gemm_dtype(self) -> str:
        """The dtype the transformer blocks' GEMMs run in."""
        return "fp8" if self.fp8 else self.dtype

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def master_bytes(self) -> int:
        """Bytes per parameter of the optimizer's master copy: none where the bf16 parameters are
        themselves updated (``OptimizerState.BF16`` without fp8_params)."""
        if self.optimizer_state is OptimizerState.BF16 and not self.fp8_params:
            return 0
        return MASTER_BYTES[self.optimizer_state]

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter kept by the optimizer: the master copy, and Adam's two moments."""
        moments = 2 * MOMENT_BYTES[self.optimizer_state] if self.optimizer is Optimizer.ADAM else 0
        return self.master_bytes + moments


class Positions(Protocol):
    """What a job needs to know of its model (``ModelSpec`` has it): the name, the context length,
    and the learned absolute positions it cannot run beyond (None: rotary, no table to run out of)."""

    @property
    def name(self) -> str: ...

    @property
    def max_position_embeddings(self) -> int: ...

    @property
    def max_seq_len(self) -> int | None: ...


def default_seq_len(model: Positions) -> int:
    """The model's context length, capped at DEFAULT_SEQ_LEN_CAP."""
    return min(model.max_position_embeddings, DEFAULT_SEQ_LEN_CAP)


def preferred_dtype(dtypes: Collection[str]) -> str:
    """bf16 where the accelerator computes in it (``dtypes``: those it has a peak for), else fp16 (V100)."""
    return "bf16" if "bf16" in dtypes else "fp16"


def check_context(model: Positions, seq_len: int) -> None:
    """Refuse a sequence length outside 1..MAX_SEQ_LEN or beyond the model's learned absolute
    position table (``ModelSpec.max_seq_len``: gpt2 and bert families; rotary models have none)."""
    check_count(seq_len, "seq_len", MAX_SEQ_LEN)
    limit = model.max_seq_len
    if limit is not None and seq_len > limit:
        raise ConfigError(
            f"seq-len {seq_len} exceeds the {limit} positions {printable(model.name)} has learned "
            f"(learned absolute position embeddings); at most {limit}",
            field="seq_len",
            value=seq_len,
            limit=limit,
            unit="tokens",
        )


def make_job(model: Positions, global_batch_size: int, seq_len: int | None = None, **settings) -> Job:
    """A Job for ``model``; ``seq_len`` None means :func:`default_seq_len` (0 is refused, not a default).
    ``settings``: any other Job field (dtype, grad_dtype, optimizer, flash_attention, ...)."""
    job = Job(global_batch_size, default_seq_len(model) if seq_len is None else seq_len, **settings)
    check_context(model, job.seq_len)
    return job


def default_fp8_recipe(dtypes: Collection[str], mx_block_scaling: bool) -> Fp8Recipe:
    """Transformer Engine's usual recipe per generation: MXFP8 blocks where the tensor cores scale
    32-element blocks themselves (Blackwell), per-tensor current scaling before (Hopper).
    ``dtypes``: those the accelerator has a peak for (FP8 needs fp8)."""
    check_fp8(dtypes)
    return Fp8Recipe.MXFP8 if mx_block_scaling else Fp8Recipe.TENSORWISE


def check_fp8(dtypes: Collection[str]) -> None:
    """Refuse FP8 on an accelerator without FP8 tensor cores (``dtypes``: those it has a peak for)."""
    if "fp8" not in dtypes:
        raise ConfigError(
            "the accelerator has no FP8 tensor cores; --fp8 needs Hopper or later",
            field="fp8",
            value=True,
            limit="an accelerator with a peak_fp8_TFLOPS",
        )
