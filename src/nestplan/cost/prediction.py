"""What an evaluation returns: per-stage costs and the prediction of one plan."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.placement import Placement
from nestplan.units import TERA

BREAKDOWN_TERMS = (
    "forward_compute", "backward_compute", "recompute", "tp_comm", "cp_comm", "ep_comm",
    "zero_comm", "pp_comm", "pipeline_bubble", "dp_sync", "optimizer",
)


@dataclass(frozen=True)
class StageCost:
    """One pipeline stage of one replica, per device and per microbatch."""

    index: int
    first_layer: int          # transformer blocks [first_layer, last_layer], 0-based
    last_layer: int
    has_embedding: bool
    has_head: bool
    devices: int
    forward_s: float
    backward_s: float
    cycle_s: float            # forward + backward + boundary transfers, per microbatch
    components_s: Mapping[str, float]   # cycle split over BREAKDOWN_TERMS (per microbatch)
    memory_bytes: Mapping[str, float]   # MEMORY_TERMS -> bytes per device
    # per model chunk where an uneven interleaved layout makes them differ (else empty: each chunk
    # takes 1/v of forward_s and backward_s)
    chunk_forward_s: tuple[float, ...] = ()
    chunk_backward_s: tuple[float, ...] = ()

    @property
    def peak_memory_bytes(self) -> float:
        return float(sum(self.memory_bytes.values()))


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    breakdown_s: Mapping[str, float]
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    devices_used: int
    peak_flops_per_device: float
    memory_capacity_bytes: float
    num_microbatches: int
    stages: tuple[StageCost, ...]
    bottleneck_stage: int
    plan: ParallelDims        # the plan evaluated
    placement: Placement      # its placement on the cluster

    @property
    def model_tflops_per_device(self) -> float:
        return self.model_flops_per_step / self.step_time_s / self.devices_used / TERA

    @property
    def hardware_tflops_per_device(self) -> float:
        return self.hardware_flops_per_step / self.step_time_s / self.devices_used / TERA

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, appendix B)."""
        return self.model_tflops_per_device * TERA / self.peak_flops_per_device

    @property
    def peak_stage(self) -> StageCost:
        return max(self.stages, key=lambda s: s.peak_memory_bytes)

    @property
    def peak_memory_bytes_per_device(self) -> float:
        return self.peak_stage.peak_memory_bytes

    @property
    def memory_breakdown_bytes(self) -> Mapping[str, float]:
        return MappingProxyType(dict(self.peak_stage.memory_bytes))

    @property
    def bubble_free_step_s(self) -> float:
        """The step without its pipeline bubble: no schedule of the same split is faster. Every
        stage still runs all m microbatches, so the bottleneck stage alone takes m times its cycle;
        interleaving only adds transfers to the cycles (cost/stage.py) and leaves the step end as
        it is (cost/stepend.py sees the same parameters, compute and boundaries)."""
        return self.step_time_s - self.breakdown_s["pipeline_bubble"]

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes_per_device <= self.memory_capacity_bytes

    @property
    def memory_excess_bytes(self) -> float:
        return max(0.0, self.peak_memory_bytes_per_device - self.memory_capacity_bytes)
