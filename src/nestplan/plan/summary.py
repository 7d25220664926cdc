"""What a plan carries of its prediction: per stage and for the whole step (``Plan.predicted``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from nestplan.cost.prediction import Prediction


@dataclass(frozen=True)
class StageSummary:
    """One pipeline stage of one replica, per device and per microbatch."""

    first_layer: int  # transformer blocks [first_layer, last_layer], 0-based
    last_layer: int
    has_embedding: bool
    has_head: bool
    devices: int  # tp x cp x ep
    forward_s: float
    backward_s: float
    cycle_s: float  # forward + backward
    memory_bytes: float  # peak per device
    memory_breakdown_bytes: Mapping[str, float]


@dataclass(frozen=True)
class PredictionSummary:
    """What was predicted for the plan, as the plan JSON carries it."""

    step_time_s: float
    breakdown_s: Mapping[str, float]
    tokens_per_s: float
    model_tflops_per_device: float
    hardware_tflops_per_device: float
    mfu: float
    peak_memory_bytes_per_device: float
    memory_breakdown_bytes: Mapping[str, float]
    memory_capacity_bytes: float
    fits: bool
    memory_excess_bytes: float
    stages: tuple[StageSummary, ...]
    levels_spanned: Mapping[str, int]  # axis -> network level its widest group spans
    pp_boundary_levels: tuple[int, ...]  # level of the link between stage i and i + 1

    @classmethod
    def from_prediction(cls, pred: Prediction) -> PredictionSummary:
        stages = tuple(
            StageSummary(
                s.first_layer,
                s.last_layer,
                s.has_embedding,
                s.has_head,
                s.devices,
                s.forward_s,
                s.backward_s,
                s.cycle_s,
                s.peak_memory_bytes,
                frozen(s.memory_bytes),
            )
            for s in pred.stages
        )
        return cls(
            pred.step_time_s,
            frozen(pred.breakdown_s),
            pred.tokens_per_s,
            pred.model_tflops_per_device,
            pred.hardware_tflops_per_device,
            pred.mfu,
            pred.peak_memory_bytes_per_device,
            frozen(pred.memory_breakdown_bytes),
            pred.memory_capacity_bytes,
            pred.fits,
            pred.memory_excess_bytes,
            stages,
            frozen({str(axis): level for axis, level in pred.placement.levels_spanned().items()}),
            tuple(pred.placement.pp_boundary_levels),
        )


def frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))
