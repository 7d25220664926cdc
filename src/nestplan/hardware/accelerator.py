"""One accelerator type and its achievable-efficiency model.

Input fields carry units (``peak_bf16_TFLOPS``, ``hbm_GiB``, ``hbm_bandwidth_TBps``);
they are converted once, in :func:`accelerator_from_dict`, into SI fields.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping

from nestplan import units
from nestplan.catalog import data_file
from nestplan.errors import ConfigError, UnknownNameError

_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


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

    def __reduce__(self):
        """Picklable (a sweep ships accelerators to worker processes): the read-only peak table
        travels as a plain dict and is frozen again on arrival."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["peak_flops"], values["extra"] = dict(self.peak_flops), dict(self.extra)
        return _rebuild, (values,)

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

    def matmul_efficiency_for(self, m: float, n: float, k: float) -> float:
        """Fraction of peak a GEMM of this shape achieves (see class docstring)."""
        d0 = self.matmul_half_dim
        shape_factor = (m / (m + d0)) * (n / (n + d0)) * (k / (k + d0))
        return self.matmul_efficiency * shape_factor

    def matmul_time(self, m: float, n: float, k: float, dtype: str, count: float = 1.0) -> float:
        """Seconds for ``count`` GEMMs of shape (m, k) x (k, n): roofline of compute and HBM traffic."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        flops = 2.0 * m * n * k * count
        compute_s = flops / (self.peak(dtype) * self.matmul_efficiency_for(m, n, k))
        elem = units.DTYPE_BYTES[dtype]
        traffic_bytes = (m * k + k * n + m * n) * elem * count
        return max(compute_s, self.memory_time(traffic_bytes))

    def memory_time(self, nbytes: float) -> float:
        """Seconds to stream ``nbytes`` through HBM at the achievable bandwidth."""
        return nbytes / (self.hbm_bandwidth_Bps * self.memory_efficiency)


def _rebuild(values: dict[str, Any]) -> Accelerator:
    return Accelerator(**{**values, "peak_flops": MappingProxyType(values["peak_flops"])})


def _require(entry: Mapping[str, Any], key: str, name: str) -> Any:
    if key not in entry:
        raise ConfigError(f"accelerator '{name}': missing field '{key}'", field=key)
    return entry[key]


def _positive(value: Any, key: str, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"accelerator '{name}': field '{key}' must be a positive number, got {value!r}",
                          field=key, value=value, limit="> 0")
    return float(value)


def accelerator_from_dict(name: str, entry: Mapping[str, Any]) -> Accelerator:
    """Build an Accelerator from a table with unit-suffixed fields (the only conversion point)."""
    known = {f"peak_{d}_TFLOPS" for d in _DTYPES} | {
        "hbm_GiB", "hbm_GB", "hbm_bandwidth_TBps", "matmul_efficiency", "matmul_half_dim",
        "memory_efficiency", "reserved_GiB", "source", "name", "notes",
    }
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"accelerator '{name}': unknown field '{unknown[0]}'; allowed: {', '.join(sorted(known))}",
                          field=unknown[0])
    peaks = {d: units.TFLOPS_to_FLOPS(_positive(entry[f"peak_{d}_TFLOPS"], f"peak_{d}_TFLOPS", name))
             for d in _DTYPES if f"peak_{d}_TFLOPS" in entry}
    if not peaks:
        raise ConfigError(f"accelerator '{name}': needs at least one peak_<dtype>_TFLOPS field", field="peak_bf16_TFLOPS")
    if "hbm_GiB" in entry:
        hbm = units.GiB_to_bytes(_positive(entry["hbm_GiB"], "hbm_GiB", name))
    else:
        hbm = units.GB_to_bytes(_positive(_require(entry, "hbm_GiB", name) if "hbm_GB" not in entry
                                          else entry["hbm_GB"], "hbm_GB", name))
    return Accelerator(
        name=name,
        peak_flops=MappingProxyType(peaks),
        hbm_bytes=hbm,
        hbm_bandwidth_Bps=units.TBps_to_Bps(_positive(_require(entry, "hbm_bandwidth_TBps", name),
                                                      "hbm_bandwidth_TBps", name)),
        matmul_efficiency=_positive(_require(entry, "matmul_efficiency", name), "matmul_efficiency", name),
        matmul_half_dim=_positive(_require(entry, "matmul_half_dim", name), "matmul_half_dim", name),
        memory_efficiency=_positive(_require(entry, "memory_efficiency", name), "memory_efficiency", name),
        reserved_bytes=units.GiB_to_bytes(float(entry.get("reserved_GiB", 0.0))),
        source=str(entry.get("source", "")),
    )


def _catalog() -> dict[str, Any]:
    with open(data_file("accelerators.toml"), "rb") as fh:
        return tomllib.load(fh)


def accelerator_names() -> list[str]:
    return sorted(_catalog())


def load_accelerator(name: str) -> Accelerator:
    """A catalog accelerator by name (case-insensitive)."""
    table = _catalog()
    key = name.strip().lower()
    if key not in table:
        raise UnknownNameError("accelerator", name, sorted(table))
    return accelerator_from_dict(key, table[key])
