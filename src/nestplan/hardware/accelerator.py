"""One accelerator type and its achievable-efficiency model.

Input fields carry units (``peak_bf16_TFLOPS``, ``hbm_GiB``, ``hbm_bandwidth_TBps``);
they are checked and converted once, in :func:`accelerator_from_dict`, into SI fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from nestplan import units
from nestplan.catalog import data_file
from nestplan.errors import ConfigError, UnknownNameError, brief, printable
from nestplan.inputs import check_string, load_object

_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

# Closed ranges of an accelerator table's figures: far beyond any chip on both sides, so that every time
# (work / rate) and byte count the cost model derives stays a finite number.
PEAK_TFLOPS_RANGE = (1e-3, 1e6)  # 1 GFLOP/s to 1 EFLOP/s per device: a B200 has 4,500 dense FP8 TFLOPS
HBM_GiB_RANGE = (2.0**-10, 2.0**16)  # 1 MiB to 64 TiB per device: the largest HBM stacks today hold 288 GB
HBM_BANDWIDTH_TBps_RANGE = (1e-6, 1e3)  # 1 MB/s to 1 PB/s: a B200 streams 8 TB/s
EFFICIENCY_RANGE = (1e-3, 1.0)  # matmul and memory efficiency: fractions of peak (the catalog's: 0.8)
MATMUL_HALF_DIM_RANGE = (1e-3, 2.0**16)  # a GEMM dimension (the catalog's tile quantum: 64)
RESERVED_GiB_RANGE = (0.0, HBM_GiB_RANGE[1])  # and below the device's memory (the catalog's: 2 GiB)
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


def _where(name: str) -> str:
    return f"accelerator '{printable(name)}'"


def _number(entry: Mapping[str, Any], key: str, name: str, bounds: tuple[float, float]) -> float:
    """``entry[key]``: a number in the closed range ``bounds``; a missing key is an error."""
    if key not in entry:
        raise ConfigError(f"{_where(name)}: missing field '{key}'", field=key, limit="a number")
    value = entry[key]
    low, high = bounds
    allowed = f"[{low:g}, {high:g}]"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not low <= value <= high:  # NaN fails too
        shown = brief(value) if is_number else type(value).__name__
        raise ConfigError(
            f"{_where(name)}: field '{key}' must be a number in {allowed}, got {shown}",
            field=key,
            value=shown,
            limit=allowed,
        )
    return float(value)


def _checked_name(name: Any) -> str:
    """A non-empty string of at most ``MAX_NAME_CHARS`` characters, no control character."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f"accelerator: name must be a non-empty string, got {printable(brief(name))}",
            field="name",
            value=printable(brief(name)),
            limit="a non-empty string",
        )
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(
            f"accelerator: name is {len(name)} characters long; at most {MAX_NAME_CHARS} allowed",
            field="name",
            value=len(name),
            limit=MAX_NAME_CHARS,
            unit="characters",
        )
    return check_string(name, "name", "accelerator")


def _check_fields(entry: Mapping[str, Any], name: str) -> None:
    """Only known fields; text fields are strings; exactly one of hbm_GiB and hbm_GB."""
    known = {f"peak_{d}_TFLOPS" for d in _DTYPES} | {
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
        *_STRING_FIELDS,
    }
    unknown = sorted(set(entry) - known, key=str)
    if unknown:
        raise ConfigError(
            f"{_where(name)}: unknown field '{printable(str(unknown[0]))}'; allowed: {', '.join(sorted(known))}",
            field=str(unknown[0]),
            limit=sorted(known),
        )
    for key in _STRING_FIELDS:
        if key in entry and not isinstance(entry[key], str):
            raise ConfigError(
                f"{_where(name)}: field '{key}' must be a string, got {type(entry[key]).__name__}",
                field=key,
                value=type(entry[key]).__name__,
                limit="a string",
            )
    if not isinstance(entry.get("mx_block_scaling", False), bool):
        raise ConfigError(
            f"{_where(name)}: field 'mx_block_scaling' must be true or false, got "
            f"{printable(brief(entry['mx_block_scaling']))}",
            field="mx_block_scaling",
            value=printable(brief(entry["mx_block_scaling"])),
            limit=[True, False],
        )
    if ("attention_efficiency" in entry) != ("attention_backward_efficiency" in entry):
        raise ConfigError(
            f"{_where(name)}: give both attention_efficiency and attention_backward_efficiency, or neither",
            field="attention_efficiency",
            limit="both or neither",
        )
    if ("hbm_GiB" in entry) == ("hbm_GB" in entry):
        raise ConfigError(
            f"{_where(name)}: give exactly one of hbm_GiB and hbm_GB", field="hbm_GiB", limit="hbm_GiB or hbm_GB"
        )


def _hbm_bytes(entry: Mapping[str, Any], name: str) -> float:
    if "hbm_GiB" in entry:
        return units.GiB_to_bytes(_number(entry, "hbm_GiB", name, HBM_GiB_RANGE))
    return units.GB_to_bytes(_number(entry, "hbm_GB", name, tuple(x * units.GiB / units.GB for x in HBM_GiB_RANGE)))


def _reserved_bytes(entry: Mapping[str, Any], name: str, hbm_bytes: float) -> float:
    """``reserved_GiB`` (default 0): at least 0 and below the device's memory."""
    if "reserved_GiB" not in entry:
        return 0.0
    reserved = units.GiB_to_bytes(_number(entry, "reserved_GiB", name, RESERVED_GiB_RANGE))
    if reserved >= hbm_bytes:
        raise ConfigError(
            f"{_where(name)}: reserved_GiB {reserved / units.GiB:g} must be below the device memory "
            f"({hbm_bytes / units.GiB:g} GiB)",
            field="reserved_GiB",
            value=reserved / units.GiB,
            limit=f"< {hbm_bytes / units.GiB:g}",
            unit="GiB",
        )
    return reserved


def accelerator_from_dict(name: str, entry: Mapping[str, Any]) -> Accelerator:
    """Build an Accelerator from a table with unit-suffixed fields (the only conversion point).

    Every figure is a number in its closed ``*_RANGE`` (peaks, memory and bandwidth above 0,
    efficiencies at most 1), ``reserved_GiB`` at least 0 and below the memory."""
    name = _checked_name(name)
    _check_fields(entry, name)
    peaks = {
        d: units.TFLOPS_to_FLOPS(_number(entry, f"peak_{d}_TFLOPS", name, PEAK_TFLOPS_RANGE))
        for d in _DTYPES
        if f"peak_{d}_TFLOPS" in entry
    }
    if not peaks:
        raise ConfigError(
            f"{_where(name)}: needs at least one peak_<dtype>_TFLOPS field",
            field="peak_bf16_TFLOPS",
            limit=[f"peak_{d}_TFLOPS" for d in _DTYPES],
        )
    hbm = _hbm_bytes(entry, name)
    return Accelerator(
        name=name,
        peak_flops=MappingProxyType(peaks),
        hbm_bytes=hbm,
        hbm_bandwidth_Bps=units.TBps_to_Bps(_number(entry, "hbm_bandwidth_TBps", name, HBM_BANDWIDTH_TBps_RANGE)),
        matmul_efficiency=_number(entry, "matmul_efficiency", name, EFFICIENCY_RANGE),
        matmul_half_dim=_number(entry, "matmul_half_dim", name, MATMUL_HALF_DIM_RANGE),
        memory_efficiency=_number(entry, "memory_efficiency", name, EFFICIENCY_RANGE),
        reserved_bytes=_reserved_bytes(entry, name, hbm),
        source=entry.get("source", ""),
        mx_block_scaling=entry.get("mx_block_scaling", False),
        fp8_matmul_efficiency=_optional(entry, "fp8_matmul_efficiency", name),
        attention_efficiency=_optional(entry, "attention_efficiency", name),
        attention_backward_efficiency=_optional(entry, "attention_backward_efficiency", name),
    )


def _optional(entry: Mapping[str, Any], key: str, name: str) -> float | None:
    """An optional efficiency (a fraction in EFFICIENCY_RANGE), None when absent."""
    return _number(entry, key, name, EFFICIENCY_RANGE) if key in entry else None


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
