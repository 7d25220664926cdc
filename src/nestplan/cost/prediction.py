"""What an evaluation returns: per-stage costs and the prediction of one plan."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping

from nestplan.strategy.dims import ParallelDims
from nestplan.settings import RunSettings
from nestplan.strategy.describe import describe
from nestplan.strategy.placement import Placement
from nestplan.units import TERA, GiB

BREAKDOWN_TERMS = (
    "forward_compute",
    "backward_compute",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "zero_comm",
    "pp_comm",
    "pipeline_bubble",
    "dp_sync",
    "optimizer",
)


@dataclass(frozen=True)
class StageCost:
    """One pipeline stage of one replica, per device and per microbatch."""

    index: int
    first_layer: int  # transformer blocks [first_layer, last_layer], 0-based
    last_layer: int
    has_embedding: bool
    has_head: bool
    devices: int
    forward_s: float
    backward_s: float
    cycle_s: float  # forward + backward + boundary transfers, per microbatch
    components_s: Mapping[str, float]  # cycle split over BREAKDOWN_TERMS (per microbatch)
    memory_bytes: Mapping[str, float]  # MEMORY_TERMS -> bytes per device
    # per model chunk where an uneven interleaved layout makes them differ (else empty: each chunk
    # takes 1/v of forward_s and backward_s)
    chunk_forward_s: tuple[float, ...] = ()
    chunk_backward_s: tuple[float, ...] = ()
    # per chunk, under a schedule that splits the backward (cost/schedules/walk.py SplitTimes): the
    # weight-gradient part of chunk_backward_s, and the communication part of forward and backward
    chunk_weight_grad_s: tuple[float, ...] = ()
    chunk_forward_comm_s: tuple[float, ...] = ()
    chunk_backward_comm_s: tuple[float, ...] = ()

    @property
    def peak_memory_bytes(self) -> float:
        return float(sum(self.memory_bytes.values()))

    @property
    def layers_text(self) -> str:
        """Its blocks as the stage table writes them: ``E+0-11`` with the embedding, ``84-95+H`` with the head."""
        return (
            ("E+" if self.has_embedding else "")
            + f"{self.first_layer}-{self.last_layer}"
            + ("+H" if self.has_head else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values, and the peak memory per device."""
        return {**plain(self), "peak_memory_bytes": self.peak_memory_bytes}

    def __repr__(self) -> str:
        return (
            f"StageCost({self.index}: blocks {self.layers_text}, cycle {self.cycle_s * 1e3:.2f} ms, "
            f"{self.peak_memory_bytes / GiB:.1f} GiB)"
        )


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
    plan: ParallelDims  # the plan evaluated
    placement: Placement  # its placement on the cluster
    settings: RunSettings  # how it runs (the job's run settings it was evaluated under)

    def to_dict(self) -> dict[str, Any]:
        """Every field and every figure derived from them (DERIVED_FIGURES) as plain JSON values; the
        plan as its degrees and settings, the placement as its groups' spans."""
        own = {f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name != "stages"}
        return {
            **own,
            "stages": [s.to_dict() for s in self.stages],
            **{name: plain(getattr(self, name)) for name in DERIVED_FIGURES},
        }

    def __repr__(self) -> str:
        return (
            f"Prediction({describe(self.plan)}: step {self.step_time_s:.4g} s, {self.tokens_per_s:,.0f} tokens/s, "
            f"MFU {self.mfu:.1%}, memory {self.memory_text}, {'fits' if self.fits else 'does NOT fit'})"
        )

    def _repr_html_(self) -> str:
        """Tables for a notebook: the headline figures, the step time's terms, the memory per stage."""
        return "".join((self.headline_html(), self.breakdown_html(), self.stages_html()))

    def headline_html(self) -> str:
        rows = [
            ("plan", describe(self.plan)),
            ("rank order", rank_order(self.placement)),
            ("devices", f"{self.devices_used:,}"),
            ("microbatches", f"{self.num_microbatches:,}"),
            ("step time", f"{self.step_time_s:.4g} s"),
            ("throughput", f"{self.tokens_per_s:,.0f} tokens/s"),
            ("model TFLOP/s per device", f"{self.model_tflops_per_device:.1f}"),
            ("MFU", f"{self.mfu:.1%}"),
            ("peak memory per device", self.memory_text),
            ("fits", "yes" if self.fits else "NO"),
        ]
        return html_table("prediction", ("", ""), rows)

    def breakdown_html(self) -> str:
        rows = [
            (term, f"{secs * 1e3:,.2f}", f"{secs / self.step_time_s:.1%}")
            for term, secs in self.breakdown_s.items()
            if secs
        ]
        return html_table("step time", ("term", "ms", "share"), rows)

    def stages_html(self) -> str:
        terms = tuple(self.stages[0].memory_bytes)
        rows = [
            (
                s.index,
                s.layers_text,
                f"{s.cycle_s * 1e3:,.2f}",
                f"{s.peak_memory_bytes / GiB:.2f}",
                *(f"{s.memory_bytes[t] / GiB:.2f}" for t in terms),
            )
            for s in self.stages
        ]
        return html_table("memory per device, GiB, by stage", ("stage", "blocks", "cycle ms", "peak", *terms), rows)

    @property
    def memory_text(self) -> str:
        return f"{self.peak_memory_bytes_per_device / GiB:.1f} of {self.memory_capacity_bytes / GiB:.1f} GiB"

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


# the properties of a Prediction that Prediction.to_dict writes beside its fields
DERIVED_FIGURES = (
    "model_tflops_per_device",
    "hardware_tflops_per_device",
    "mfu",
    "peak_memory_bytes_per_device",
    "memory_breakdown_bytes",
    "bubble_free_step_s",
    "fits",
    "memory_excess_bytes",
)


def plain(value: Any) -> Any:
    """``value`` as JSON values: dataclasses and mappings as dicts, tuples as lists, enums as their values."""
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [plain(item) for item in value]
    return value


def rank_order(placement: Placement) -> str:
    """The rank grid's axes, fastest-varying first: ``tp,cp,ep,dp,pp``."""
    return ",".join(str(axis) for axis in placement.axis_order)


def html_table(caption: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A small HTML table, every caption, header and cell escaped."""

    def cells(tag: str, values: Sequence[Any]) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(str(v))}</{tag}>" for v in values) + "</tr>"

    head = cells("th", header) if any(header) else ""
    return (
        f"<table><caption>{html.escape(caption)}</caption>{head}"
        + "".join(cells("td", row) for row in rows)
        + "</table>"
    )
