"""One accelerator type and its achievable-efficiency model.

Input fields carry units (``peak_bf16_TFLOPS``, ``hbm_GiB``, ``hbm_bandwidth_TBps``);
they are checked and converted once, in :func:`accelerator_from_dict`, into SI fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping

from nestplan import units
from nestplan.catalog import data_file
from nestplan.errors import ConfigError, UnknownNameError, printable
from nestplan.inputs import Fields, load_object


class Architecture(str, Enum):
    """An accelerator's generation, which decides the kernels it runs (cost/kernels.py)."""

    VOLTA = "volta"
    AMPERE = "ampere"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    OTHER = "other"  # any other (AMD CDNA, TPU): every kernel at the accelerator's own figures


@dataclass(frozen=True)
class Calibration:
    """The profile an accelerator's figures were calibrated with (nestplan.profile): its name, the framework
    whose runs it was fitted on, and how well it predicts runs it was not fitted on (the leave-one-model-out
    |error|: median and max, over ``rows`` runs of ``models`` models): the trust band of its predictions."""

    name: str
    framework: str
    median_error: float
    max_error: float
    rows: int
    models: int


_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

# Closed ranges of an accelerator table's figures: far beyond any chip on both sides, so that every time
# (work / rate) and byte count the cost model derives stays a finite number.
PEAK_TFLOPS_RANGE = (1e-3, 1e6)  # 1 GFLOP/s to 1 EFLOP/s per device: a B200 has 4,500 dense FP8 TFLOPS
HBM_GiB_RANGE = (2.0**-10, 2.0**16)  # 1 MiB to 64 TiB per device: the largest HBM stacks today hold 288 GB
HBM_BANDWIDTH_TBps_RANGE = (1e-6, 1e3)  # 1 MB/s to 1 PB/s: a B200 streams 8 TB/s
EFFICIENCY_RANGE = (1e-3, 1.0)  # matmul and memory efficiency: fractions of peak (the catalog's: 0.8)
MATMUL_HALF_DIM_RANGE = (1e-3, 2.0**16)  # a GEMM dimension (the catalog's tile quantum: 64)
ATTENTION_FACTOR_RANGE = (0.05, 4.0)  # a calibrated attention kernel's speed over its published figure
RESERVED_GiB_RANGE = (0.0, HBM_GiB_RANGE[1])  # and below the device's memory (the catalog's: 2 GiB)
BOARD_POWER_W_RANGE = (1.0, 1e5)  # a board's power limit: an H100 SXM's is 700 W
MAX_NAME_CHARS = 200  # an accelerator's name labels plans and tables
_STRING_FIELDS = ("source", "name", "notes")


@dataclass(frozen=True)
class Accelerator:
    """An accelerator type, in SI units.

    Compute time of a GEMM (m x k times k x n) follows a roofline with a
    shape-dependent efficiency (small GEMMs run slower: wave quantisation and
    tile under-use, Narayanan et al. SC'21 section 5.6):
        eff(m, n, k) = matmul_efficiency * prod_d d / (d + matmul_half_dim)
    """

    name: str
    peak_flops: Mapping[str, float]
    hbm_bytes: float
    hbm_bandwidth_Bps: float
    matmul_efficiency: float
    matmul_half_dim: float
    memory_efficiency: float
    reserved_bytes: float
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    mx_block_scaling: bool = False  # tensor cores scale 32-element blocks themselves (MXFP8; Blackwell)
    fp8_matmul_efficiency: float | None = None  # the FP8 GEMMs' ceiling; None: matmul_efficiency
    # a fused attention kernel's forward and backward, fractions of the dtype's peak at long sequences;
    # None: attention runs at the GEMM efficiency of its shapes
    attention_efficiency: float | None = None
    attention_backward_efficiency: float | None = None
    architecture: Architecture = Architecture.OTHER
    # a calibrated multiplier of every attention kernel's speed (nestplan.profile's ``attention`` factor)
    attention_factor: float = 1.0
    calibration: Calibration | None = None  # the profile applied, if any
    board_power_W: float | None = None  # the board's power limit (TDP), for a run's energy; None: not known

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``."""
        if dtype not in self.peak_flops:
            raise ConfigError(
                f"accelerator {self.name} has no peak for dtype '{dtype}'; known: {', '.join(self.peak_flops)}",
                field="dtype",
                value=dtype,
                limit=list(self.peak_flops),
            )
        return self.peak_flops[dtype]

    def shape_factor(self, *dims: float) -> float:
        """prod_d d / (d + matmul_half_dim): how much of its ceiling a kernel with these tile
        dimensions reaches (small dimensions waste tiles and waves)."""
        d0 = self.matmul_half_dim
        return math.prod(d / (d + d0) for d in dims)

    def matmul_efficiency_for(self, m: float, n: float, k: float, dtype: str = "bf16") -> float:
        """Fraction of ``dtype``'s peak a GEMM of this shape achieves (see class docstring)."""
        ceiling = (
            self.fp8_matmul_efficiency if dtype == "fp8" and self.fp8_matmul_efficiency else self.matmul_efficiency
        )
        return ceiling * self.shape_factor(m, n, k)

    def matmul_time(self, m: float, n: float, k: float, dtype: str, count: float = 1.0) -> float:
        """Seconds for ``count`` GEMMs of shape (m, k) x (k, n): roofline of compute and HBM traffic."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        flops = 2.0 * m * n * k * count
        compute_s = flops / (self.peak(dtype) * self.matmul_efficiency_for(m, n, k, dtype))
        elem = units.DTYPE_BYTES[dtype]
        traffic_bytes = (m * k + k * n + m * n) * elem * count
        return max(compute_s, self.memory_time(traffic_bytes))

    def memory_time(self, nbytes: float) -> float:
        """Seconds to stream ``nbytes`` through HBM at the achievable bandwidth."""
        return nbytes / (self.hbm_bandwidth_Bps * self.memory_efficiency)


_KNOWN = (
    *(f"peak_{d}_TFLOPS" for d in _DTYPES),
    "hbm_GiB",
    "hbm_GB",
    "hbm_bandwidth_TBps",
    "matmul_efficiency",
    "matmul_half_dim",
    "memory_efficiency",
    "reserved_GiB",
    "mx_block_scaling",
    "fp8_matmul_efficiency",
    "attention_efficiency",
    "attention_backward_efficiency",
    "architecture",
    "attention_factor",
    "calibration",
    "board_power_W",
    *_STRING_FIELDS,
)


def _check_fields(f: Fields) -> None:
    """Only known fields; text fields are strings; both attention efficiencies or neither; exactly one of
    hbm_GiB and hbm_GB."""
    f.refuse_unknown(sorted(_KNOWN))
    for key in _STRING_FIELDS:
        f.string(key, "", blank=True)
    if f.has("attention_efficiency") != f.has("attention_backward_efficiency"):
        raise f.error(
            "give both attention_efficiency and attention_backward_efficiency, or neither",
            "attention_efficiency",
            limit="both or neither",
        )
    if f.has("hbm_GiB") == f.has("hbm_GB"):
        raise f.error("give exactly one of hbm_GiB and hbm_GB", "hbm_GiB", limit="hbm_GiB or hbm_GB")


def _hbm_bytes(f: Fields) -> float:
    if f.has("hbm_GiB"):
        return units.GiB_to_bytes(f.number("hbm_GiB", *HBM_GiB_RANGE))
    return units.GB_to_bytes(f.number("hbm_GB", *(x * units.GiB / units.GB for x in HBM_GiB_RANGE)))


def _reserved_bytes(f: Fields, hbm_bytes: float) -> float:
    """``reserved_GiB`` (default 0): at least 0 and below the device's memory."""
    reserved = units.GiB_to_bytes(f.number("reserved_GiB", *RESERVED_GiB_RANGE, default=0.0))
    if reserved >= hbm_bytes:
        raise f.error(
            f"reserved_GiB {reserved / units.GiB:g} must be below the device memory ({hbm_bytes / units.GiB:g} GiB)",
            "reserved_GiB",
            reserved / units.GiB,
            f"< {hbm_bytes / units.GiB:g}",
            "GiB",
        )
    return reserved


def _optional(f: Fields, key: str) -> float | None:
    """An optional efficiency (a fraction in EFFICIENCY_RANGE), None when absent."""
    return f.number(key, *EFFICIENCY_RANGE) if f.has(key) else None


def accelerator_from_dict(name: str, entry: Mapping[str, Any]) -> Accelerator:
    """Build an Accelerator from a table with unit-suffixed fields (the only conversion point).

    Every figure is a number in its closed ``*_RANGE`` (peaks, memory and bandwidth above 0,
    efficiencies at most 1), ``reserved_GiB`` at least 0 and below the memory."""
    name = Fields({"name": name}, "accelerator").string("name", maximum=MAX_NAME_CHARS)
    f = Fields(entry, f"accelerator '{printable(name)}'")
    _check_fields(f)
    peaks = {
        d: units.TFLOPS_to_FLOPS(f.number(f"peak_{d}_TFLOPS", *PEAK_TFLOPS_RANGE))
        for d in _DTYPES
        if f.has(f"peak_{d}_TFLOPS")
    }
    if not peaks:
        raise f.error(
            "needs at least one peak_<dtype>_TFLOPS field",
            "peak_bf16_TFLOPS",
            limit=[f"peak_{d}_TFLOPS" for d in _DTYPES],
        )
    hbm = _hbm_bytes(f)
    return Accelerator(
        name=name,
        peak_flops=MappingProxyType(peaks),
        hbm_bytes=hbm,
        hbm_bandwidth_Bps=units.TBps_to_Bps(f.number("hbm_bandwidth_TBps", *HBM_BANDWIDTH_TBps_RANGE)),
        matmul_efficiency=f.number("matmul_efficiency", *EFFICIENCY_RANGE),
        matmul_half_dim=f.number("matmul_half_dim", *MATMUL_HALF_DIM_RANGE),
        memory_efficiency=f.number("memory_efficiency", *EFFICIENCY_RANGE),
        reserved_bytes=_reserved_bytes(f, hbm),
        source=f.string("source", "", blank=True),
        mx_block_scaling=f.flag("mx_block_scaling", False),
        fp8_matmul_efficiency=_optional(f, "fp8_matmul_efficiency"),
        attention_efficiency=_optional(f, "attention_efficiency"),
        attention_backward_efficiency=_optional(f, "attention_backward_efficiency"),
        architecture=Architecture(f.choice("architecture", [a.value for a in Architecture], Architecture.OTHER.value)),
        attention_factor=f.number("attention_factor", *ATTENTION_FACTOR_RANGE, default=1.0),
        calibration=_calibration(f.table("calibration")) if f.has("calibration") else None,
        board_power_W=f.number("board_power_W", *BOARD_POWER_W_RANGE) if f.has("board_power_W") else None,
    )


def _calibration(f: Fields) -> Calibration:
    """The ``calibration`` table an accelerator written with a profile applied carries."""
    f.refuse_unknown(("name", "framework", "median_error", "max_error", "rows", "models"))
    return Calibration(
        name=f.string("name", maximum=MAX_NAME_CHARS),
        framework=f.string("framework", maximum=MAX_NAME_CHARS),
        median_error=f.number("median_error", 0.0, 100.0),
        max_error=f.number("max_error", 0.0, 100.0),
        rows=f.integer("rows", 10**6, minimum=0),
        models=f.integer("models", 10**6, minimum=0),
    )


def _catalog() -> dict[str, Any]:
    return load_object(data_file("accelerators.toml"), "accelerator catalog", "toml")


def accelerator_names() -> list[str]:
    return sorted(_catalog())


def load_accelerator(name: str) -> Accelerator:
    """A catalog accelerator by name (case-insensitive)."""
    table = _catalog()
    key = name.strip().lower()
    if key not in table:
        raise UnknownNameError("accelerator", name, sorted(table))
    entry = table[key]
    if not isinstance(entry, Mapping):
        raise ConfigError(f"accelerator catalog: [{key}] must be a table, got {type(entry).__name__}", field=key)
    return accelerator_from_dict(key, entry)
