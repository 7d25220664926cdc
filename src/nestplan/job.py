"""The training job: what is trained, independent of how it is split."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from nestplan.errors import ConfigError, brief, printable
from nestplan.units import DTYPE_BYTES

MAX_GLOBAL_BATCH_SIZE = 2**24   # sequences per step (published pre-training batches reach 2^14)
MAX_SEQ_LEN = 2**21             # tokens per sequence (long-context training reaches 2^20)
DEFAULT_SEQ_LEN_CAP = 8192      # a typical pre-training length


def check_count(value: object, field: str, limit: int) -> int:
    """``value`` itself when it is an integer in 1..limit; a ConfigError naming ``field`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise ConfigError(f"{field} must be a positive integer up to {limit:,}, got {brief(value)}",
                          field=field, value=value, limit=f"1..{limit}")
    return value


class Optimizer(str, Enum):
    """Optimizer, by the per-parameter state it keeps in fp32 (beside the fp32 master copy)."""

    ADAM = "adam"   # master weights + first and second moments: 12 bytes/param
    SGD = "sgd"     # master weights only: 4 bytes/param


@dataclass(frozen=True)
class Job:
    """A training job.

    global_batch_size: sequences per optimizer step.
    grad_dtype: dtype of the accumulated gradients; Megatron-LM accumulates and
        all-reduces gradients in fp32 by default (``--accumulate-allreduce-grads-in-fp32``),
        which makes mixed-precision Adam 18 bytes per parameter (Korthikanti et al. 2022, Figure 1).
    flash_attention: attention runs as a fused kernel (Dao et al. 2022): the s x s
        score tensors are neither stored nor written to HBM.
    """

    global_batch_size: int
    seq_len: int
    dtype: str = "bf16"
    grad_dtype: str = "fp32"
    optimizer: Optimizer = Optimizer.ADAM
    flash_attention: bool = True

    def __post_init__(self) -> None:
        check_count(self.global_batch_size, "global_batch_size", MAX_GLOBAL_BATCH_SIZE)
        check_count(self.seq_len, "seq_len", MAX_SEQ_LEN)
        for field_name in ("dtype", "grad_dtype"):
            value = getattr(self, field_name)
            if value not in DTYPE_BYTES:
                raise ConfigError(f"{field_name} '{value}' is not one of {', '.join(DTYPE_BYTES)}",
                                  field=field_name, value=value, limit=list(DTYPE_BYTES))
        allowed = [o.value for o in Optimizer]
        if self.optimizer not in allowed:
            raise ConfigError(f"optimizer {brief(self.optimizer)} is not one of {', '.join(allowed)}",
                              field="optimizer", value=self.optimizer, limit=allowed)
        object.__setattr__(self, "optimizer", Optimizer(self.optimizer))
        if not isinstance(self.flash_attention, bool):
            raise ConfigError(f"flash_attention must be true or false, got {brief(self.flash_attention)}",
                              field="flash_attention", value=self.flash_attention, limit=[True, False])

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def optimizer_state_bytes(self) -> int:
        """fp32 bytes per parameter kept by the optimizer (master copy included)."""
        return 12 if self.optimizer is Optimizer.ADAM else 4


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
        raise ConfigError(f"seq-len {seq_len} exceeds the {limit} positions {printable(model.name)} has learned "
                          f"(learned absolute position embeddings); at most {limit}", field="seq_len",
                          value=seq_len, limit=limit, unit="tokens")


def make_job(model: Positions, global_batch_size: int, seq_len: int | None = None, *, dtype: str = "bf16",
             grad_dtype: str = "fp32", optimizer: Optimizer = Optimizer.ADAM,
             flash_attention: bool = True) -> Job:
    """A Job for ``model``; ``seq_len`` None means :func:`default_seq_len` (0 is refused, not a default)."""
    job = Job(global_batch_size, default_seq_len(model) if seq_len is None else seq_len, dtype=dtype,
              grad_dtype=grad_dtype, optimizer=optimizer, flash_attention=flash_attention)
    check_context(model, job.seq_len)
    return job
