"""The training job: what is trained, independent of how it is split."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

from nestplan.errors import ConfigError, brief, printable
from nestplan.settings import Fp8Recipe, OptimizerState, RunSettings
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


MASTER_BYTES = {OptimizerState.FP32: 4, OptimizerState.REMAINDERS: 2, OptimizerState.BF16: 2}
MOMENT_BYTES = {OptimizerState.FP32: 4, OptimizerState.REMAINDERS: 4, OptimizerState.BF16: 2}


@dataclass(frozen=True)
class Job:
    """A training job: what is trained. How it runs is its ``settings`` (``settings.RunSettings``, the
    field table of every run setting: overlaps, FP8, gradient dtype, optimizer state, MoE and
    context-parallel mechanics).

    global_batch_size: sequences per optimizer step.
    seq_len: tokens per sequence.
    dtype: the parameters' and activations' dtype (bf16, fp16 or fp32; FP8 GEMMs are a setting).
    optimizer: ``Optimizer``; its state's dtype is ``settings.optimizer_state``.
    """

    global_batch_size: int
    seq_len: int
    dtype: str = "bf16"
    optimizer: Optimizer = Optimizer.ADAM
    settings: RunSettings = RunSettings()

    def __post_init__(self) -> None:
        check_count(self.global_batch_size, "global_batch_size", MAX_GLOBAL_BATCH_SIZE)
        check_count(self.seq_len, "seq_len", MAX_SEQ_LEN)
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(
                f"dtype '{self.dtype}' is not one of {', '.join(DTYPE_BYTES)}",
                field="dtype",
                value=self.dtype,
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
        if not isinstance(self.settings, RunSettings):
            raise ConfigError(
                f"settings must be RunSettings, got {brief(self.settings)}", field="settings", value=self.settings
            )
        if self.dtype == "fp8":
            raise ConfigError(
                "dtype fp8 would run every tensor in FP8, which no framework trains with; use --fp8 "
                "(FP8 GEMMs in the transformer blocks, everything else in bf16)",
                field="dtype",
                value=self.dtype,
                limit="bf16, fp16 or fp32 (with --fp8 for FP8 GEMMs)",
            )
        self._check_optimizer_state()

    def _check_optimizer_state(self) -> None:
        state, fp8_params = self.settings.optimizer_state, self.settings.fp8_params
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
        if state is OptimizerState.REMAINDERS and fp8_params:
            raise ConfigError(
                "optimizer state remainders completes bf16 parameters, and fp8_params keeps them in FP8 "
                "(NeMo then stores the whole master copy)",
                field="optimizer_state",
                value=state.value,
                limit="fp32 or bf16 with fp8_params",
            )

    def to_dict(self) -> dict[str, Any]:
        """What is trained and every run setting, flat (the plan JSON's ``job`` object)."""
        what = {"global_batch_size": self.global_batch_size, "seq_len": self.seq_len, "dtype": self.dtype}
        return {**what, "optimizer": self.optimizer.value, **self.settings.to_dict()}

    @classmethod
    def from_flat(cls, global_batch_size: int, seq_len: int, **flat: Any) -> Job:
        """A job from its fields and its run settings side by side, as ``to_dict`` writes them (dtype and
        optimizer by name, every other name a run setting; an unknown one refused by name)."""
        what = {key: flat.pop(key) for key in ("dtype", "optimizer") if key in flat}
        return cls(global_batch_size, seq_len, **what, settings=RunSettings.from_mapping(flat))

    def with_settings(self, **changes: Any) -> Job:
        """This job with some run settings changed (each checked)."""
        return replace(self, settings=replace(self.settings, **changes))

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def param_bytes(self) -> int:
        """Bytes of a parameter as the model holds and all-gathers it: FP8 under fp8_params."""
        return DTYPE_BYTES["fp8"] if self.settings.fp8_params else self.dtype_bytes

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.settings.grad_dtype]

    @property
    def fp8(self) -> bool:
        return self.settings.fp8

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
        state = self.settings.optimizer_state
        if state is OptimizerState.BF16 and not self.settings.fp8_params:
            return 0
        return MASTER_BYTES[state]

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter kept by the optimizer: the master copy, and Adam's two moments."""
        moments = 2 * MOMENT_BYTES[self.settings.optimizer_state] if self.optimizer is Optimizer.ADAM else 0
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


def make_job(model: Positions, global_batch_size: int, seq_len: int | None = None, **fields: Any) -> Job:
    """A Job for ``model``; ``seq_len`` None means :func:`default_seq_len` (0 is refused, not a default).
    ``fields``: any other Job field (dtype, optimizer, settings)."""
    job = Job(global_batch_size, default_seq_len(model) if seq_len is None else seq_len, **fields)
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
