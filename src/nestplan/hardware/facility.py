"""What a cluster's facility adds to its accelerators and network for a whole training run: storage
bandwidth, failure rates, restart and repair times, power beyond the accelerators' boards, PUE and
prices. Read from a cluster file's optional ``[facility]`` table (every field optional, units in
the names, converted once to SI here); each default is stated once, in ``DEFAULTS``, with its source.

The failure rates split one published total by component: Kokolis et al. 2024 ("Revisiting
Reliability in Large-Scale Machine Learning Research Clusters", Meta, arXiv 2410.21680, section on
the MTTF model) fit 6.50 and 2.34 failures per 1,000 node-days on their clusters RSC-1 and RSC-2
(8 A100 per node); their mean, 4.42 per 1,000 node-days, is split by the shares of the Llama 3
paper's table of root causes (Llama Team 2024, arXiv 2407.21783, section 3.3.4, Table 5: of 419
unexpected interruptions, 268 (64.0%) on the GPU: faulty GPU, HBM3, SRAM, system processor, silent
data corruption, thermal; 42 (10.0%) on a link: switch or cable, NIC; 109 (26.0%) on the host and
its software: software bugs, host maintenance, NCCL watchdog, SSD, power supply, chassis, I/O
board, dependencies, CPU, memory). Only the shares come from Llama 3's log, not the total.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from nestplan import units
from nestplan.inputs import Fields

HOURS = 3600.0
DAY = 86400.0
KWH = 3.6e6  # joules

_KOKOLIS_PER_NODE_DAY = (6.50 + 2.34) / 2 / 1000  # Kokolis et al. 2024: RSC-1 and RSC-2, per 1,000 node-days
_GPUS_PER_NODE = 8  # their nodes: 8 A100 each
_SHARE_DEVICE, _SHARE_LINK, _SHARE_HOST = 268 / 419, 42 / 419, 109 / 419  # Llama 3 Table 5 shares


@dataclass(frozen=True)
class Facility:
    """A facility's figures in SI units (rates per second per component, powers in W, bandwidths in
    B/s, prices per GPU-second and per joule); ``None`` where a price is not given."""

    device_failure_rate: float  # per accelerator
    host_failure_rate: float  # per host (its CPU, memory, disks, power, software)
    link_failure_rate: float  # per scale-out link (one NIC and its cable per accelerator)
    restart_overhead_s: float  # detection, re-scheduling, process start-up, communicator set-up
    repair_s: float  # a failed host's time out of the pool (spares cover it)
    spare_hosts: int | None  # None: chosen per run (cost/reliability.py run_reliability)
    storage_write_Bps: float  # per host
    storage_read_Bps: float  # per host
    storage_aggregate_write_Bps: float  # the whole storage system
    storage_aggregate_read_Bps: float
    checkpoint_copy_Bps: float  # device to host memory, per accelerator (an asynchronous save's blocking part)
    checkpoint_async: bool
    host_power_per_device_W: float  # the host's share per accelerator (CPUs, memory, NICs, fans)
    network_power_per_device_W: float  # switches and optics per accelerator
    pue: float  # facility power / IT power
    price_per_gpu_s: float | None
    price_per_J: float | None


# Every default, in the file's units, with its source: the one place they are stated.
DEFAULTS: Mapping[str, tuple[Any, str]] = MappingProxyType(
    {
        "device_failures_per_day": (
            _KOKOLIS_PER_NODE_DAY / _GPUS_PER_NODE * _SHARE_DEVICE,
            "Kokolis et al. 2024 mean of RSC-1/RSC-2 failures per node-day / 8 GPUs, x Llama 3 Table 5 GPU share",
        ),
        "host_failures_per_day": (
            _KOKOLIS_PER_NODE_DAY * _SHARE_HOST,
            "Kokolis et al. 2024 mean failures per node-day x Llama 3 Table 5 host and software share",
        ),
        "link_failures_per_day": (
            _KOKOLIS_PER_NODE_DAY / _GPUS_PER_NODE * _SHARE_LINK,
            "Kokolis et al. 2024 mean failures per node-day / 8 links, x Llama 3 Table 5 switch, cable, NIC share",
        ),
        "restart_overhead_s": (600.0, "assumed: 10 minutes to detect, re-schedule, start and set up communicators"),
        "repair_hours": (24.0, "assumed: a failed host is swapped or repaired within a day"),
        "spare_hosts": (None, "the count that costs the fewest device-hours per unit of work (cost/reliability.py)"),
        "storage_write_GBps": (25.0, "assumed: one 200 Gb/s front-end NIC per host to storage"),
        "storage_read_GBps": (25.0, "assumed: one 200 Gb/s front-end NIC per host to storage"),
        "storage_aggregate_write_GBps": (2000.0, "Llama 3 section 3.3.1: Tectonic sustains 2 TB/s"),
        "storage_aggregate_read_GBps": (2000.0, "Llama 3 section 3.3.1: Tectonic sustains 2 TB/s"),
        "checkpoint_copy_GBps": (25.0, "assumed: about 40% of PCIe Gen5 x16's 64 GB/s per direction"),
        "checkpoint_async": (True, "Megatron-Core's asynchronous save (--async-save): a copy to host memory blocks"),
        "host_power_per_gpu_W": (575.0, "DGX H100 datasheet: 10.2 kW system maximum less 8 x 700 W GPUs, / 8"),
        "network_power_per_gpu_W": (100.0, "assumed: two tiers of 64-port 400G switches (about 1.7 kW) per 32 GPUs"),
        "pue": (1.1, "Google data centers' fleet-wide trailing twelve-month PUE, 1.10 (2023 environmental report)"),
        "price_per_gpu_hour_usd": (None, "none: give it for a cost"),
        "price_per_kwh_usd": (None, "none: give it for the energy's cost"),
    }
)

# Closed ranges of the table's figures: beyond any real facility, so that absurd input is refused.
RATE_RANGE = (0.0, 1.0)  # failures per component per day: an H100's is about 3.5e-4
SECONDS_RANGE = (0.0, 30 * DAY)
HOURS_RANGE = (0.0, 24 * 365.0)
GBps_RANGE = (1e-3, 1e7)
POWER_W_RANGE = (0.0, 1e5)
PUE_RANGE = (1.0, 5.0)
PRICE_PER_GPU_HOUR_RANGE = (0.0, 1e4)
PRICE_PER_KWH_RANGE = (0.0, 1e3)
MAX_SPARE_HOSTS = 1 << 20


def facility_from_dict(data: Mapping[str, Any] | None, origin: str = "cluster") -> Facility:
    """A cluster file's ``[facility]`` table (``None``: every default), every field checked."""
    f = Fields(data or {}, origin, "facility.")
    f.refuse_unknown(tuple(DEFAULTS))

    def value(key: str, low: float, high: float) -> float:
        return f.number(key, low, high, default=DEFAULTS[key][0])

    def rate(key: str) -> float:
        return value(key, *RATE_RANGE) / DAY

    def bandwidth(key: str) -> float:
        return units.GBps_to_Bps(value(key, *GBps_RANGE))

    def optional(key: str, bounds: tuple[float, float], scale: float) -> float | None:
        return f.number(key, *bounds) / scale if f.has(key) else None

    spares = f.integer("spare_hosts", MAX_SPARE_HOSTS, default=None, minimum=0) if f.has("spare_hosts") else None
    return Facility(
        device_failure_rate=rate("device_failures_per_day"),
        host_failure_rate=rate("host_failures_per_day"),
        link_failure_rate=rate("link_failures_per_day"),
        restart_overhead_s=value("restart_overhead_s", *SECONDS_RANGE),
        repair_s=value("repair_hours", *HOURS_RANGE) * HOURS,
        spare_hosts=spares,
        storage_write_Bps=bandwidth("storage_write_GBps"),
        storage_read_Bps=bandwidth("storage_read_GBps"),
        storage_aggregate_write_Bps=bandwidth("storage_aggregate_write_GBps"),
        storage_aggregate_read_Bps=bandwidth("storage_aggregate_read_GBps"),
        checkpoint_copy_Bps=bandwidth("checkpoint_copy_GBps"),
        checkpoint_async=f.flag("checkpoint_async", DEFAULTS["checkpoint_async"][0]),
        host_power_per_device_W=value("host_power_per_gpu_W", *POWER_W_RANGE),
        network_power_per_device_W=value("network_power_per_gpu_W", *POWER_W_RANGE),
        pue=value("pue", *PUE_RANGE),
        price_per_gpu_s=optional("price_per_gpu_hour_usd", PRICE_PER_GPU_HOUR_RANGE, HOURS),
        price_per_J=optional("price_per_kwh_usd", PRICE_PER_KWH_RANGE, KWH),
    )


DEFAULT_FACILITY = facility_from_dict(None)


def in_unit(value: float, convert: Callable[[float], float], guess: float) -> float:
    """The float near ``guess`` that ``convert`` (the reader's conversion) turns back into exactly
    ``value``, where one lies within two steps of it (so that a table read and written is unchanged)."""
    candidates = [guess]
    for direction in (math.inf, -math.inf):
        step = guess
        for _ in range(2):
            step = math.nextafter(step, direction)
            candidates.append(step)
    return next((c for c in candidates if convert(c) == value), guess)


def _per_day(rate: float) -> float:
    return in_unit(rate, lambda x: x / DAY, rate * DAY)


def _GBps(value: float) -> float:
    return in_unit(value, units.GBps_to_Bps, value / units.GB)


def facility_to_dict(facility: Facility) -> dict[str, Any]:
    """The inverse of :func:`facility_from_dict`: the table in the file's units (prices and spares
    only where given)."""
    table: dict[str, Any] = {
        "device_failures_per_day": _per_day(facility.device_failure_rate),
        "host_failures_per_day": _per_day(facility.host_failure_rate),
        "link_failures_per_day": _per_day(facility.link_failure_rate),
        "restart_overhead_s": facility.restart_overhead_s,
        "repair_hours": in_unit(facility.repair_s, lambda x: x * HOURS, facility.repair_s / HOURS),
        "storage_write_GBps": _GBps(facility.storage_write_Bps),
        "storage_read_GBps": _GBps(facility.storage_read_Bps),
        "storage_aggregate_write_GBps": _GBps(facility.storage_aggregate_write_Bps),
        "storage_aggregate_read_GBps": _GBps(facility.storage_aggregate_read_Bps),
        "checkpoint_copy_GBps": _GBps(facility.checkpoint_copy_Bps),
        "checkpoint_async": facility.checkpoint_async,
        "host_power_per_gpu_W": facility.host_power_per_device_W,
        "network_power_per_gpu_W": facility.network_power_per_device_W,
        "pue": facility.pue,
    }
    gpu, joule = facility.price_per_gpu_s, facility.price_per_J
    optional = {
        "spare_hosts": facility.spare_hosts,
        "price_per_gpu_hour_usd": None if gpu is None else in_unit(gpu, lambda x: x / HOURS, gpu * HOURS),
        "price_per_kwh_usd": None if joule is None else in_unit(joule, lambda x: x / KWH, joule * KWH),
    }
    return table | {key: value for key, value in optional.items() if value is not None}


def with_overrides(facility: Facility, given: Mapping[str, Any]) -> Facility:
    """``facility`` with the fields of ``given`` (file names and units, e.g. from command-line
    options; None values ignored) replaced, each checked as the file's are."""
    return facility_from_dict(facility_to_dict(facility) | {k: v for k, v in given.items() if v is not None}, "options")
