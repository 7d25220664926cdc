"""Failures, checkpoints and restarts of a whole run, costed from its plan.

- The job is interrupted when any of its accelerators, hosts or links fails: failures are
  independent and exponential, so their rates add (a series system; Kokolis et al. 2024, the MTTF
  model): rate = devices x device rate + hosts x host rate + links x link rate, one scale-out link
  per accelerator. The mean time between interruptions is its inverse.
- A checkpoint holds what each rank persists: its weights and optimizer state as the plan's memory
  model shards them (cost/memory.py). Each replicated tensor is written once, its writes spread
  over its data-parallel replicas (Megatron-Core's distributed checkpoint with fully parallel
  save), so a rank writes its optimizer state and 1/replicas of its weights.
- Writing takes the slower of a host's share (its ranks' bytes over the host's storage bandwidth)
  and the job's (all bytes over the storage system's aggregate bandwidth); a restart reads every
  rank's full state the same way. An asynchronous save blocks training only while it copies to
  host memory; until its write completes a failure rolls back to the checkpoint before it.
- The interval between checkpoints minimises lost time (Young 1974, "A first order approximation
  to the optimum checkpoint interval", and Daly 2006, "A higher order estimate of the optimum
  checkpoint interval for restart dumps", eq. 37), rounded to whole steps.
- Goodput, the useful fraction of wall-clock time, is Daly 2006's expected time to complete an
  interval under exponential failures, restarts included (his eq. 20):
  T(tau) = M e^(R/M) (e^((tau + delta)/M) - 1) for tau of work, delta of checkpoint, R of restart.
- Hot spares: a failed host waits for repair unless a spare is free; the hosts in repair when a
  failure arrives are Poisson with mean rate x repair time (arrivals see time averages), so a
  failure waits the repair time with the probability that all spares are taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nestplan.hardware.facility import Facility

SPARE_RISK = 0.001  # the most spares tried leave at most this chance that a failure waits for a repair


@dataclass(frozen=True)
class StateBytes:
    """What a plan's ranks persist, per rank of each pipeline stage, from its memory model."""

    weights: tuple[float, ...]  # bytes per rank, by stage
    optimizer: tuple[float, ...]
    weight_replicas: int  # ranks holding a copy of each weight shard (data-parallel replicas; 1 under ZeRO-3)
    stage_ranks: int  # ranks per stage in the whole job (tp x cp x ep x dp)


@dataclass(frozen=True)
class Checkpoint:
    held_bytes_per_rank: float  # the largest rank's weights and optimizer state
    written_bytes_per_rank: float  # the largest rank's share of a save
    job_bytes: float  # one save of the whole job
    write_s: float
    read_s: float
    blocking_s: float  # what stays on the training's critical path per save


@dataclass(frozen=True)
class Reliability:
    failure_rate_per_s: float  # the job's interruptions per second
    checkpoint: Checkpoint
    interval_steps: int
    interval_s: float
    restart_s: float  # per interruption: overhead, reading the state, waiting for a host, the save in flight
    spare_hosts: int
    spare_wait_s: float
    goodput: float

    @property
    def mtbi_s(self) -> float | None:
        """Mean time between interruptions; None without failures."""
        return 1.0 / self.failure_rate_per_s if self.failure_rate_per_s > 0 else None


def job_failure_rate(devices: int, hosts: int, facility: Facility) -> float:
    """Interruptions per second of a job on ``devices`` accelerators in ``hosts`` hosts (series system)."""
    per_devices = devices * (facility.device_failure_rate + facility.link_failure_rate)
    return per_devices + hosts * facility.host_failure_rate


def checkpoint_costs(state: StateBytes, ranks_per_host: int, facility: Facility) -> Checkpoint:
    """One save's and one load's bytes and times (see the module docstring)."""
    held = [w + o for w, o in zip(state.weights, state.optimizer)]
    written = [w / state.weight_replicas + o for w, o in zip(state.weights, state.optimizer)]
    job_written = sum(written) * state.stage_ranks
    job_held = sum(held) * state.stage_ranks
    write_s = max(
        max(written) * ranks_per_host / facility.storage_write_Bps, job_written / facility.storage_aggregate_write_Bps
    )
    read_s = max(max(held) * ranks_per_host / facility.storage_read_Bps, job_held / facility.storage_aggregate_read_Bps)
    copy_s = max(written) / facility.checkpoint_copy_Bps
    return Checkpoint(
        held_bytes_per_rank=max(held),
        written_bytes_per_rank=max(written),
        job_bytes=job_written,
        write_s=write_s,
        read_s=read_s,
        blocking_s=copy_s if facility.checkpoint_async else write_s,
    )


def young_interval(blocking_s: float, mtbi_s: float) -> float:
    """Young 1974: the work between checkpoints that minimises lost time, sqrt(2 delta M)."""
    return math.sqrt(2.0 * blocking_s * mtbi_s)


def daly_interval(blocking_s: float, mtbi_s: float) -> float:
    """Daly 2006, eq. 37: sqrt(2 delta M) [1 + (delta / 2M)^(1/2) / 3 + (delta / 2M) / 9] - delta for
    delta < 2M, else M."""
    if blocking_s >= 2.0 * mtbi_s:
        return mtbi_s
    ratio = blocking_s / (2.0 * mtbi_s)
    return young_interval(blocking_s, mtbi_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - blocking_s


def goodput(interval_s: float, blocking_s: float, restart_s: float, failure_rate_per_s: float) -> float:
    """Useful work / wall-clock time: Daly 2006 eq. 20's expected time for ``interval_s`` of work
    and its checkpoint, M e^(R/M) (e^((tau + delta)/M) - 1), restarts that fail again included."""
    segment = interval_s + blocking_s
    if failure_rate_per_s == 0.0:
        return interval_s / segment
    expected = math.exp(restart_s * failure_rate_per_s) * math.expm1(segment * failure_rate_per_s) / failure_rate_per_s
    return interval_s / expected


def _poisson_tail(mean: float, at_least: int) -> float:
    """P(N >= at_least) for N Poisson with ``mean``."""
    if mean == 0.0:
        return 0.0 if at_least > 0 else 1.0
    below = sum(math.exp(k * math.log(mean) - mean - math.lgamma(k + 1)) for k in range(at_least))
    return max(0.0, 1.0 - below)


def spares_needed(host_failures_per_s: float, repair_s: float, risk: float = SPARE_RISK) -> int:
    """The fewest spare hosts that leave at most ``risk`` that a failure finds them all in repair."""
    mean = host_failures_per_s * repair_s
    spares = 0
    while _poisson_tail(mean, spares) > risk:
        spares += 1
    return spares


def spare_wait_s(host_failures_per_s: float, repair_s: float, spares: int) -> float:
    """A failure's expected wait for a host: the repair time when every spare is in repair."""
    return repair_s * _poisson_tail(host_failures_per_s * repair_s, spares)


def checkpoint_interval_steps(step_s: float, checkpoint: Checkpoint, failure_rate: float, run_steps: int) -> int:
    """Daly's interval in whole steps (at least one, and for an asynchronous save at least its write,
    which must finish before the next begins); the whole run without failures."""
    if failure_rate == 0.0:
        return max(1, run_steps)
    best = round(daly_interval(checkpoint.blocking_s, 1.0 / failure_rate) / step_s)
    return max(1, best, math.ceil(checkpoint.write_s / step_s) if checkpoint.blocking_s < checkpoint.write_s else 1)


def _with_spares(
    spares: int, rate: float, checkpoint: Checkpoint, steps: int, step_s: float, facility: Facility
) -> Reliability:
    wait_s = spare_wait_s(rate, facility.repair_s, spares)
    in_flight_s = checkpoint.write_s if checkpoint.blocking_s < checkpoint.write_s else 0.0
    restart_s = facility.restart_overhead_s + checkpoint.read_s + wait_s + in_flight_s
    interval_s = steps * step_s
    return Reliability(
        failure_rate_per_s=rate,
        checkpoint=checkpoint,
        interval_steps=steps,
        interval_s=interval_s,
        restart_s=restart_s,
        spare_hosts=spares,
        spare_wait_s=wait_s,
        goodput=goodput(interval_s, checkpoint.blocking_s, restart_s, rate),
    )


def run_reliability(
    state: StateBytes, step_s: float, run_steps: int, devices: int, ranks_per_host: int, facility: Facility
) -> Reliability:
    """Failures, checkpoints, restarts and goodput of ``run_steps`` steps of ``step_s`` on ``devices``;
    without a spare count given, the count up to ``spares_needed`` that costs the fewest device-seconds
    per unit of work: (devices + spares x ranks per host) / goodput."""
    hosts = math.ceil(devices / ranks_per_host)
    rate = job_failure_rate(devices, hosts, facility)
    checkpoint = checkpoint_costs(state, ranks_per_host, facility)
    steps = checkpoint_interval_steps(step_s, checkpoint, rate, run_steps)
    if facility.spare_hosts is not None:
        return _with_spares(facility.spare_hosts, rate, checkpoint, steps, step_s, facility)
    options = [
        _with_spares(spares, rate, checkpoint, steps, step_s, facility)
        for spares in range(spares_needed(rate, facility.repair_s) + 1)
    ]
    return min(options, key=lambda r: (devices + r.spare_hosts * ranks_per_host) / r.goodput)
