"""The training job: what is trained, independent of how it is split."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nestplan.errors import ConfigError
from nestplan.units import DTYPE_BYTES


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
        for field_name in ("global_batch_size", "seq_len"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{field_name.replace('_', '-')} must be a positive integer, got {value!r}",
                                  field=field_name, value=value, limit=">= 1")
        for field_name in ("dtype", "grad_dtype"):
            value = getattr(self, field_name)
            if value not in DTYPE_BYTES:
                raise ConfigError(f"{field_name} '{value}' is not one of {', '.join(DTYPE_BYTES)}",
                                  field=field_name, value=value, limit=list(DTYPE_BYTES))

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
