"""Run settings: how a job runs, as opposed to what it trains (``job.Job``), in one field table.

Every setting is declared once, as a field of :class:`RunSettings` made by :func:`setting`: its type
(the field's annotation), its default, its bounds or choices, its command-line flag and help, and
the source that defines it (the framework flag it stands for). The CLI options of ``evaluate`` and
``plan``, the plan JSON's job object, the runs file's columns, the reference table in
docs/formats.md and the exporters' declarations (``export.SETTINGS_HANDLED``) are derived from
this table; tests fail when one of them forgets a setting.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import Any

from nestplan.errors import ConfigError, brief, did_you_mean


class Framework(str, Enum):
    """The software that runs the job: its preset of run settings (``FRAMEWORK_PRESETS``) and its kernels
    (cost/kernels.py). The names are the exporters'."""

    MEGATRON = "megatron"  # Megatron-LM / Megatron-Core with Transformer Engine
    NEMO = "nemo"  # NeMo and Megatron-Bridge recipes: Megatron-Core with Transformer Engine
    TORCHTITAN = "torchtitan"  # PyTorch-native: FSDP2, DTensor tensor parallelism, SDPA attention
    DEEPSPEED = "deepspeed"  # DeepSpeed ZeRO with Megatron-DeepSpeed's model
    FSDP = "fsdp"  # plain PyTorch FSDP with eager kernels (Hugging Face Accelerate/Trainer, Composer)


class AttentionKernel(str, Enum):
    """The fused attention kernel (cost/kernels.py states each one's speed by accelerator generation)."""

    CUDNN = "cudnn"  # cuDNN's fused attention, Transformer Engine's default (FlashAttention-3 class on Hopper)
    FLASH3 = "flash3"  # FlashAttention-3 (Shah et al. 2024): Hopper only
    FLASH2 = "flash2"  # FlashAttention-2 (Dao 2023); PyTorch's SDPA flash backend
    FLASH1 = "flash1"  # FlashAttention (Dao et al. 2022), flash-attn 1.x


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


class CpCommType(str, Enum):
    """How context parallelism exchanges keys and values (Megatron-LM ``--cp-comm-type``, Transformer
    Engine's attention with context parallelism)."""

    P2P = "p2p"  # ring: K/V passed cp - 1 steps, overlapped with attention (Liu et al. 2023)
    A2A = "a2a"  # Ulysses: all-to-alls trade sequence for heads around attention (Jacobs et al. 2023)
    ALLGATHER = "allgather"  # K/V all-gathered before attention (Llama 3, Dubey et al. 2024, section 3.3.2)
    A2A_P2P = "a2a+p2p"  # all-to-all inside groups of cp_a2a_size ranks, a ring across them


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


# the dtypes gradients are accumulated and reduced in: Megatron-Core's DDP (grad_reduce_in_fp32, else the params'
# bf16/fp16), PyTorch FSDP MixedPrecision.reduce_dtype; tf32 is a matmul mode, not a storage dtype, and no
# framework reduces gradients in fp8
REDUCTION_DTYPES = ("fp32", "bf16", "fp16")
MAX_CP_A2A_SIZE = 2**20  # the bound of any parallel degree
# --moe-expert-capacity-factor: below 1 most tokens would be dropped; above 16 nearly every expert pads
# to many times its share (published runs use 1.0 to 2.0: Megatron-Core MoE README, Switch Transformer)
MIN_CAPACITY_FACTOR, MAX_CAPACITY_FACTOR = 0.5, 16.0


@dataclass(frozen=True)
class Setting:
    """What the field table states of one run setting beside its type and default.

    flag: the command-line option (a boolean's ``--x/--no-x`` pair is derived from it).
    help: the option's help, which docs/formats.md's table repeats.
    source: the framework's own name for it (the flag or config key it stands for).
    kind: ``bool``, ``int``, ``float``, ``dtype`` (one of REDUCTION_DTYPES) or an Enum class.
    bounds: (low, high) of an int or float.
    optional: None is a value (no FP8 recipe; dropless routing): the annotation admits None.
    searched: ``plan`` tries its values where the model and the framework allow; the option then
        narrows what is tried (a choice: only that one; a boolean: false forbids it).
    """

    name: str
    flag: str
    help: str
    source: str
    kind: Any
    default: Any
    bounds: tuple[float, float] | None = None
    optional: bool = False
    searched: bool = False

    @property
    def label(self) -> str:
        """The name as error messages write it: ``moe capacity factor``."""
        return self.name.replace("_", " ")

    @property
    def choices(self) -> list[str]:
        """The values a choice takes, as strings ([] for a number or a boolean)."""
        if self.kind == "dtype":
            return list(REDUCTION_DTYPES)
        if isinstance(self.kind, type) and issubclass(self.kind, Enum):
            return [member.value for member in self.kind]
        return []

    def check(self, value: Any) -> Any:
        """``value`` as this setting holds it (a choice's string as its Enum member), or a ConfigError
        naming the setting, the value and what is allowed (a choice's closest names first: "did you mean").
        The one check of a setting's value: the CLI's options parse with it, and the job file, the runs
        file, the plan JSON and ``evaluate --set`` read through it."""
        if value is None and self.optional:
            return None
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(
                    f"{self.name} must be true or false, got {brief(value)}",
                    field=self.name,
                    value=value,
                    limit=[True, False],
                )
            return value
        if self.kind is int or self.kind is float:
            return self._number(value)
        allowed = self.choices
        if value not in allowed:
            quoted = f"'{value}'" if self.kind == "dtype" else brief(value)
            label = self.name if self.kind == "dtype" else self.label
            mean = did_you_mean(value, allowed) if isinstance(value, str) else ""
            raise ConfigError(
                f"{label} {quoted} is not one of {', '.join(allowed)}{mean}",
                field=self.name,
                value=value,
                limit=allowed,
            )
        return value if self.kind == "dtype" else self.kind(value)

    def _number(self, value: Any) -> Any:
        low, high = self.bounds or (1, 2**63)
        integer = self.kind is int
        wrong_type = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
        if wrong_type or not low <= value <= high:
            if integer:
                message = f"{self.name} must be a positive integer up to {int(high):,}, got {brief(value)}"
                limit: str = f"{int(low)}..{int(high)}"
            else:
                message = f"{self.label} must be a number in [{low}, {high}], got {brief(value)}"
                limit = f"{low}..{high}"
            raise ConfigError(message, field=self.name, value=value, limit=limit)
        return value


def setting(default: Any, *, flag: str, help: str, source: str, **table: Any) -> Any:
    """A RunSettings field whose metadata declares its :class:`Setting` (the table adds the field's name,
    and its kind from the annotation unless ``table`` gives one)."""
    return field(default=default, metadata={"setting": dict(flag=flag, help=help, source=source, **table)})


@dataclass(frozen=True)
class RunSettings:
    """How a job runs: the framework's kernels, overlaps, precision recipe and MoE and context-parallel
    mechanics. The field table (``setting_table``) is these fields' declarations."""

    framework: Framework = setting(
        Framework.MEGATRON,
        flag="--framework",
        help="the software that runs the job: megatron, nemo, torchtitan, deepspeed or fsdp (PyTorch FSDP with eager "
        "kernels); its kernels, and the defaults of the settings not given",
        source="the exporters' names (nestplan export)",
    )
    attention_kernel: AttentionKernel | None = setting(
        None,
        flag="--attention-kernel",
        help="fused attention kernel: cudnn, flash3, flash2 or flash1; default: the framework's on the accelerator",
        source="Transformer Engine NVTE_FUSED_ATTN / NVTE_FLASH_ATTN, PyTorch SDPA backends, flash-attn",
    )
    grad_dtype: str = setting(
        "fp32",
        flag="--grad-reduce-dtype",
        help="gradient buffer and reduction dtype: fp32 (Megatron-LM's default) or bf16 (--grad-reduce-in-bf16, "
        "NeMo grad_sync_dtype)",
        source="Megatron-LM --accumulate-allreduce-grads-in-fp32 / --grad-reduce-in-bf16",
        kind="dtype",
    )
    flash_attention: bool = setting(
        True,
        flag="--flash",
        help="fused (flash) attention",
        source="Megatron-LM --attention-backend flash (Dao et al. 2022)",
    )
    tp_comm_overlap: bool = setting(
        False,
        flag="--tp-comm-overlap",
        help="tensor-parallel collectives under the GEMMs (Transformer Engine userbuffers)",
        source="Megatron-LM --tp-comm-overlap",
    )
    overlap_grad_reduce: bool = setting(
        True,
        flag="--overlap-grad-reduce",
        help="data-parallel gradient reduction under the backward pass",
        source="Megatron-LM --overlap-grad-reduce, NeMo overlap_grad_sync",
    )
    overlap_param_gather: bool = setting(
        True,
        flag="--overlap-param-gather",
        help="distributed optimizer's parameter all-gather under the next forward",
        source="Megatron-LM --overlap-param-gather, NeMo overlap_param_sync",
    )
    fp8_recipe: Fp8Recipe | None = setting(
        None,
        flag="--fp8-recipe",
        help="FP8 scaling (implies --fp8): delayed, tensorwise (Hopper's default), blockwise or mxfp8 "
        "(Blackwell's default)",
        source="Transformer Engine recipes, Megatron-LM --fp8-format hybrid --fp8-recipe",
    )
    fp8_params: bool = setting(
        False,
        flag="--fp8-params",
        help="parameters kept in FP8 (Transformer Engine fp8_model_init, NeMo fp8_params; needs --fp8)",
        source="Megatron-LM --fp8-param-gather, NeMo fp8_params",
    )
    cp_comm_type: CpCommType = setting(
        CpCommType.P2P,
        flag="--cp-comm-type",
        help="context parallelism's K/V exchange: p2p (ring), a2a (Ulysses), allgather (Llama 3) or a2a+p2p "
        "(with --cp-a2a-size)",
        source="Megatron-LM --cp-comm-type",
        searched=True,
    )
    cp_a2a_size: int = setting(
        1,
        flag="--cp-a2a-size",
        help="a2a+p2p's all-to-all group size (the ring runs across cp / size groups); evaluate's default: the widest in an NVLink domain",
        source="Megatron-LM --hierarchical-context-parallel-sizes",
        bounds=(1, MAX_CP_A2A_SIZE),
    )
    moe_comm_overlap: bool = setting(
        False,
        flag="--moe-comm-overlap",
        help="expert all-to-alls of one microbatch under another's compute (Megatron-Core's 1F1B A2A overlap; "
        "one more microbatch in flight)",
        source="Megatron-LM --overlap-moe-expert-parallel-comm",
        searched=True,
    )
    moe_capacity_factor: float | None = setting(
        None,
        flag="--moe-capacity-factor",
        help="each expert padded to this many times its balanced share of tokens (Megatron-Core's "
        "--moe-expert-capacity-factor with padding); default: dropless, costed balanced",
        source="Megatron-LM --moe-expert-capacity-factor --moe-pad-expert-input-to-capacity",
        bounds=(MIN_CAPACITY_FACTOR, MAX_CAPACITY_FACTOR),
    )
    moe_dispatcher: MoeDispatcher = setting(
        MoeDispatcher.ALLTOALL,
        flag="--moe-dispatcher",
        help="alltoall (every token copy sent to its expert's rank) or deepep (each token once per node holding "
        "its experts, bounded by node-limited routing)",
        source="Megatron-LM --moe-token-dispatcher-type alltoall | flex",
    )
    distribute_saved_activations: bool = setting(
        False,
        flag="--distribute-saved-activations",
        help="under full recomputation with tp > 1 and without sequence parallelism, each layer's saved input "
        "split over the tp ranks and all-gathered before its recomputation",
        source="Megatron-LM --distribute-saved-activations (megatron/core/tensor_parallel/random.py CheckpointFunction)",
    )
    optimizer_state: OptimizerState = setting(
        OptimizerState.FP32,
        flag="--optimizer-state",
        help="fp32 (master weights and moments), remainders (the master weights' low 16 bits beside bf16 "
        "parameters: NeMo's distributed Adam, Megatron's --use-precision-aware-optimizer) or bf16 (bf16 "
        "moments, no master copy: NeMo optim.dtype bf16)",
        source="Megatron-LM --use-precision-aware-optimizer --exp-avg-dtype, NeMo optim.dtype",
    )

    def __post_init__(self) -> None:
        for entry in setting_table():
            object.__setattr__(self, entry.name, entry.check(getattr(self, entry.name)))
        self._check_cp_comm()
        if self.moe_dispatcher is MoeDispatcher.DEEPEP and self.moe_capacity_factor is not None:
            raise ConfigError(
                "the deepep dispatcher is dropless: it does not pad experts to a capacity factor "
                "(Megatron-Core refuses moe_pad_expert_input_to_capacity with it)",
                field="moe_capacity_factor",
                value=self.moe_capacity_factor,
                limit="none with deepep",
            )
        if self.fp8_params and self.fp8_recipe is None:
            raise ConfigError(
                "fp8_params keeps parameters in FP8 and needs an FP8 recipe (--fp8)",
                field="fp8_params",
                value=True,
                limit="with --fp8",
            )

    def _check_cp_comm(self) -> None:
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

    @property
    def fp8(self) -> bool:
        return self.fp8_recipe is not None

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, enums as their strings (the plan JSON's and the runs file's form)."""
        return {name: plain_value(getattr(self, name)) for name in SETTING_NAMES}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunSettings:
        """The settings ``values`` gives (by name; the others at its framework's presets, ``FRAMEWORK_PRESETS``,
        else the field defaults), each checked; a name that is not a setting is refused by name."""
        unknown = sorted(set(values) - set(SETTING_NAMES))
        if unknown:
            raise ConfigError(
                f"unknown run setting {brief(unknown[0])}; the settings are {', '.join(SETTING_NAMES)}",
                field=str(unknown[0]),
                value=unknown[0],
                limit=list(SETTING_NAMES),
            )
        framework = _TABLE[0].check(values.get("framework", Framework.MEGATRON.value))
        return cls(**(dict(FRAMEWORK_PRESETS[framework]) | dict(values)))


def plain_value(value: Any) -> Any:
    """An Enum as its string, anything else as it is."""
    return value.value if isinstance(value, Enum) else value


def _entry(f: Field, annotation: Any) -> Setting:
    """The Setting that field ``f`` declares; its kind, unless declared, is its annotation without None."""
    declared = f.metadata["setting"]
    members = [t for t in typing.get_args(annotation) if t is not type(None)] or [annotation]
    assert len(members) == 1 and f.default is not MISSING, f.name
    optional = type(None) in typing.get_args(annotation)
    return Setting(name=f.name, default=f.default, optional=optional, **{"kind": members[0], **declared})


_TABLE: tuple[Setting, ...] = tuple(_entry(f, typing.get_type_hints(RunSettings)[f.name]) for f in fields(RunSettings))
SETTING_NAMES: tuple[str, ...] = tuple(entry.name for entry in _TABLE)


def setting_table() -> tuple[Setting, ...]:
    """The field table: one Setting per RunSettings field, in declaration order."""
    return _TABLE


# What each framework runs unless told otherwise: the settings whose defaults differ from the field table's
# (which are Megatron-LM's as nestplan's Megatron-LM export writes them).
FRAMEWORK_PRESETS: Mapping[Framework, Mapping[str, Any]] = {
    Framework.MEGATRON: {},
    # NeMo's recipes reduce gradients in bf16 (grad_sync_dtype: bf16, nemo/collections/llm/recipes and the
    # DGX Cloud benchmarking recipes' configs) and overlap tensor-parallel collectives with userbuffers
    # (tp_comm_overlap: true in the recipes of the large models)
    Framework.NEMO: {"grad_dtype": "bf16", "tp_comm_overlap": True},
    # torchtitan: FSDP2 reduces in fp32 (training.mixed_precision_reduce = "float32", torchtitan/config
    # job_config.py); async tensor parallelism off by default (parallelism.enable_async_tensor_parallel)
    Framework.TORCHTITAN: {"grad_dtype": "fp32", "tp_comm_overlap": False},
    # DeepSpeed's bf16 optimizer (ZeRO 0 and 1 with bf16) accumulates gradients in a full-size fp32 flat buffer,
    # not partitioned, and reduces them from it (deepspeed/runtime/bf16_optimizer.py: fp32_groups_gradients_flat,
    # grad_acc_dtype float32 by default): 4 bytes per parameter, as fp32 grad_dtype costs them; no userbuffer
    # tensor-parallel overlap
    Framework.DEEPSPEED: {"grad_dtype": "fp32", "tp_comm_overlap": False},
    # PyTorch FSDP's MixedPrecision as Accelerate and Composer set it for bf16: parameters bf16, reduce_dtype
    # float32 (Composer's DEFAULT mode); no tensor-parallel overlap
    Framework.FSDP: {"grad_dtype": "fp32", "tp_comm_overlap": False},
}
