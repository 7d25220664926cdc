"""The training job: what is trained, independent of how it is split."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nestplan.errors import ConfigError
from nestplan.units import DTYPE_BYTES

MAX_GLOBAL_BATCH_SIZE = 2**24   # sequences per step (published pre-training batches reach 2^14)
MAX_SEQ_LEN = 2**21             # tokens per sequence (long-context training reaches 2^20)


def check_count(value: object, field: str, limit: int) -> int:
    """``value`` itself when it is an integer in 1..limit; a ConfigError naming ``field`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise ConfigError(f"{field} must be a positive integer up to {limit:,}, got {value!r}",
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
            raise ConfigError(f"optimizer {self.optimizer!r} is not one of {', '.join(allowed)}",
                              field="optimizer", value=self.optimizer, limit=allowed)
        object.__setattr__(self, "optimizer", Optimizer(self.optimizer))
        if not isinstance(self.flash_attention, bool):
            raise ConfigError(f"flash_attention must be true or false, got {self.flash_attention!r}",
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
