"""The axis vocabulary: the five parallel axes and the two named rank-grid orders, stated once.

An order lists the axes fastest-varying first (rank = sum of coordinate x stride, the first
axis with stride 1). ``strategy.placement`` re-exports every name here; import them from there.
"""

from __future__ import annotations

from enum import StrEnum


class Axis(StrEnum):
    """A parallel axis. A member is its string: ``Axis.TP == "tp"`` with the same hash and repr, so
    tuples of strings (plan JSON, ``--axis-order``) and tuples of members are interchangeable as
    values, dictionary keys and cache keys, and print the same."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    PP = "pp"
    DP = "dp"

    __hash__ = str.__hash__
    __repr__ = str.__repr__


AXES: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.EP, Axis.PP, Axis.DP)  # ParallelDims' order of the degrees

STAGE_MAJOR: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.EP, Axis.DP, Axis.PP)  # Megatron-LM's default: stage slowest
REPLICA_MAJOR: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.EP, Axis.PP, Axis.DP)  # each replica's pipeline contiguous
NAMED_ORDERS = (STAGE_MAJOR, REPLICA_MAJOR)  # the orders the placement answers arithmetically (and the search explores)
DEFAULT_AXIS_ORDER = REPLICA_MAJOR
