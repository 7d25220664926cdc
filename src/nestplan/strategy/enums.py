"""Categorical plan choices."""

from __future__ import annotations

from enum import Enum, IntEnum


class ZeroStage(IntEnum):
    """ZeRO (Rajbhandari et al. 2020): what is sharded over the data-parallel group."""

    NONE = 0        # nothing
    OPTIMIZER = 1   # optimizer state (and fp32 master weights)
    GRADIENTS = 2   # + gradients
    PARAMETERS = 3  # + parameters (gathered per layer in forward and backward)


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022, section 4)."""

    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core only
    FULL = "full"            # store each layer's input, re-run its forward in backward


class Schedule(str, Enum):
    """Pipeline schedule."""

    ONE_F_ONE_B = "1f1b"          # PipeDream-Flush (Narayanan et al. 2021)
    GPIPE = "gpipe"               # all forwards, then all backwards (Huang et al. 2019)
    INTERLEAVED = "interleaved"   # interleaved 1F1B with virtual stages (Narayanan et al. SC'21)
