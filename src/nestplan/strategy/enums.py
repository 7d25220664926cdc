"""Categorical plan choices."""

from __future__ import annotations

from enum import Enum, IntEnum


class ZeroStage(IntEnum):
    """ZeRO (Rajbhandari et al. 2020): what is sharded over the data-parallel group."""

    NONE = 0  # nothing
    OPTIMIZER = 1  # optimizer state (and fp32 master weights)
    GRADIENTS = 2  # + gradients
    PARAMETERS = 3  # + parameters (gathered per layer in forward and backward)


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022, section 4)."""

    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core only
    FULL = "full"  # store each layer's input, re-run its forward in backward


class Schedule(str, Enum):
    """Pipeline schedule."""

    ONE_F_ONE_B = "1f1b"  # PipeDream-Flush (Narayanan et al. 2021)
    GPIPE = "gpipe"  # all forwards, then all backwards (Huang et al. 2019)
    INTERLEAVED = "interleaved"  # interleaved 1F1B with virtual stages (Narayanan et al. SC'21)
    ZB_H1 = "zb-h1"  # 1F1B with the backward split into B and W, W deferred (Qi et al. ICLR 2024)
    ZBV = "zbv"  # zero bubble on two chunks per stage in a V (Qi et al. 2024, arXiv 2405.15362)
    DUALPIPEV = "dualpipev"  # DualPipe cut in half: V chunks, F and B of two microbatches overlapped
    # (DeepSeek-AI 2024, arXiv 2412.19437 section 3.2.1; torchtitan DualPipeV)

    @property
    def chunks(self) -> int | None:
        """Model chunks per stage (virtual stages) the schedule runs: 2 for the V-shaped ones, any
        number (None) for interleaved, 1 otherwise. The plan's legality (ParallelDims) reads it, the
        schedule's class (cost/schedules) everything it runs."""
        if self.v_shaped:
            return 2
        return None if self is Schedule.INTERLEAVED else 1

    def runs_moe_a2a_overlap(self, pp: int) -> bool:
        """Megatron-core's MoE all-to-all overlap merges a forward with a full backward of 1F1B's order:
        under 1F1B (or GPipe) without a pipeline, under interleaved at any depth, never under the schedules
        that split the backward (megatron/core/transformer/transformer_config.py)."""
        return self is Schedule.INTERLEAVED or (pp == 1 and not self.splits_backward)

    @property
    def splits_backward(self) -> bool:
        """The backward runs as B (input gradients) and W (weight gradients), scheduled apart."""
        return self in (Schedule.ZB_H1, Schedule.ZBV, Schedule.DUALPIPEV)

    @property
    def v_shaped(self) -> bool:
        """Two chunks per stage, virtual stages 0 .. p - 1 down the stages and p .. 2p - 1 back up,
        so stage s holds virtual stages s and 2p - 1 - s (the first also the head)."""
        return self in (Schedule.ZBV, Schedule.DUALPIPEV)
