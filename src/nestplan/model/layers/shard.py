"""How one layer runs on one device (``Shard``: the sub-graph strategy plus the job's facts), and what the
per-layer formulas of ``nestplan.model.layers`` return: GEMM shapes (``Gemm``) and parameter counts
(``ParamCount``)."""

from __future__ import annotations

from dataclasses import dataclass

from nestplan.strategy.subgraph import SubGraph

MASK_BYTES = 1  # dropout masks are stored as bytes (Korthikanti et al. 2022, section 4.1)


FP8_INPUT_BYTES = 1  # an FP8 element: what an FP8 GEMM keeps of its input (Shard.gemm_input_bytes)


@dataclass(frozen=True)
class Shard(SubGraph):
    """How a layer runs on one device for one microbatch: the sub-graph strategy (its fields, validation
    and derived sizes are SubGraph's) with the job's facts that shape a layer. cost/terms.py ``shard_of``
    builds it from a plan's sub-graph and a job."""

    seq_len: int = 2048
    dtype_bytes: int = 2
    flash: bool = True
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
    def tokens(self) -> int:
        """Tokens of one microbatch on one device: b * s / cp."""
        return self.micro_batch_size * self.seq_len // self.cp

    @property
    def sp_div(self) -> int:
        """Divisor of the activations that sequence parallelism splits over tp."""
        return self.tp if self.sp_active else 1


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


COLUMN, ROW = "input", "output_grad"  # what sequence parallelism gathers for a column- / row-parallel layer
