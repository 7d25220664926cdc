"""Unit conversions: the only place where conversion factors live.

Input files carry units in their field names (``bandwidth_GBps``, ``hbm_GiB``,
``latency_us``); they are converted once, where the input is read, into SI
fields (``bandwidth_Bps``, ``hbm_bytes``, ``latency_s``).
"""

from __future__ import annotations

GB = 1e9
TB = 1e12
MiB = 2.0**20
GiB = 2.0**30

US = 1e-6

TERA = 1e12


def GBps_to_Bps(value: float) -> float:
    """Gigabytes per second (1e9 B/s) to bytes per second."""
    return float(value) * GB


def TBps_to_Bps(value: float) -> float:
    return float(value) * TB


def GiB_to_bytes(value: float) -> float:
    return float(value) * GiB


def GB_to_bytes(value: float) -> float:
    return float(value) * GB


def us_to_s(value: float) -> float:
    return float(value) * US


def TFLOPS_to_FLOPS(value: float) -> float:
    return float(value) * TERA


def bytes_to_GiB(value: float) -> float:
    return float(value) / GiB


DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
