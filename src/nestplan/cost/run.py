"""A whole training run from one plan's step: steps, wall-clock days, GPU-hours, energy and cost.

- steps = ceil(tokens / (global batch x sequence length)), or as given;
- compute time = steps x step time; wall-clock = compute time / goodput (cost/reliability.py:
  checkpoints, lost work and restarts);
- GPU-hours = (devices + spare hosts x accelerators per host) x wall-clock, hosts as the cluster
  counts them (``Cluster.host_devices``: launchers' and schedulers' nodes, not NVLink domains);
- energy = devices x (board power + the host's and the network's share per accelerator) x PUE x
  wall-clock: every board at its power limit (an upper bound; Llama 3 section 3.3.4 reports the
  cluster's power swinging by tens of megawatts with the step), spares idle and not counted;
- cost = GPU-hours x price per GPU-hour + energy x price per kWh (each where given).

A run's floor (``run_floor``) bounds every plan's run on N devices from below without planning: no
step is shorter than the blocks' and the head's GEMM FLOPs (forward, data and weight gradients: 3x the
forward, Narayanan et al. SC'21 section 5.1) spread evenly over N devices at the accelerator's highest
GEMM ceiling (cost/compute.py times each GEMM at no more than peak x ceiling, and a device runs its
GEMMs one after another), with goodput at most 1 and no spares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nestplan.cluster import Cluster
from nestplan.cost.prediction import Prediction
from nestplan.cost.reliability import Reliability, StateBytes, run_reliability
from nestplan.errors import ConfigError
from nestplan.hardware.facility import DAY, HOURS, KWH
from nestplan.cost.terms import shard_of
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.subgraph import SubGraph
from nestplan.strategy.enums import ZeroStage

MAX_TOKENS = 1e18  # a run's tokens: Llama 3 405B trained on 1.56e13
MAX_STEPS = 10**12


def ranks_per_host(cluster: Cluster, devices: int) -> int:
    """Accelerators per host that a job of ``devices`` uses: the cluster's hosts (``Cluster.host_devices``:
    a DGX H100 of 8, a GB200 compute tray of 4 within its 72-GPU rack), all of a job's devices when it
    takes part of one host."""
    return min(cluster.host_devices, devices)


@dataclass(frozen=True)
class RunLength:
    """How long the run is: tokens (converted to whole steps) or steps; exactly one is given."""

    tokens: float | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.steps is None):
            raise ConfigError("give the run's length as tokens or as steps, not both", field="tokens")
        if self.tokens is not None and not (isinstance(self.tokens, (int, float)) and 1 <= self.tokens <= MAX_TOKENS):
            raise ConfigError(
                f"tokens must be a number in [1, {MAX_TOKENS:g}], got {self.tokens!r}",
                field="tokens",
                value=self.tokens,
                limit=f"[1, {MAX_TOKENS:g}]",
            )
        if self.steps is not None and not (isinstance(self.steps, int) and 1 <= self.steps <= MAX_STEPS):
            raise ConfigError(
                f"steps must be an integer in 1..{MAX_STEPS}, got {self.steps!r}",
                field="steps",
                value=self.steps,
                limit=f"1..{MAX_STEPS}",
            )

    def steps_for(self, tokens_per_step: int) -> int:
        return self.steps if self.steps is not None else math.ceil(self.tokens / tokens_per_step)


class _RunUnits:
    """Days and MWh of a run's (or a floor's) wall-clock seconds and joules."""

    wall_s: float
    energy_J: float | None

    @property
    def days(self) -> float:
        return self.wall_s / DAY

    @property
    def energy_MWh(self) -> float | None:
        return None if self.energy_J is None else self.energy_J / KWH / 1000.0


@dataclass(frozen=True)
class RunEstimate(_RunUnits):
    """A run's figures (SI units; None where an input they need is not given)."""

    steps: int
    tokens: float
    step_time_s: float
    devices: int
    spare_devices: int
    compute_s: float
    wall_s: float
    interruptions: float
    gpu_hours: float
    energy_J: float | None
    cost_usd: float | None
    reliability: Reliability


def state_bytes(dims: ParallelDims, stage_memory: list[dict[str, float]]) -> StateBytes:
    """What each rank persists, from its stages' memory breakdowns (bytes per device by term)."""
    return StateBytes(
        weights=tuple(m["weights"] for m in stage_memory),
        optimizer=tuple(m["optimizer"] for m in stage_memory),
        weight_replicas=1 if dims.zero is ZeroStage.PARAMETERS else dims.dp,
        stage_ranks=dims.stage_devices * dims.dp,
    )


def prediction_state(pred: Prediction) -> StateBytes:
    return state_bytes(pred.plan, [dict(s.memory_bytes) for s in pred.stages])


def estimate_run(
    state: StateBytes, step_time_s: float, job: Job, devices: int, cluster: Cluster, length: RunLength
) -> RunEstimate:
    """The run of ``length`` at ``step_time_s`` per step on ``devices`` of ``cluster`` (its facility)."""
    facility = cluster.facility
    per_host = ranks_per_host(cluster, devices)
    tokens_per_step = job.global_batch_size * job.seq_len
    steps = length.steps_for(tokens_per_step)
    reliability = run_reliability(state, step_time_s, steps, devices, per_host, facility)
    compute_s = steps * step_time_s
    wall_s = compute_s / reliability.goodput
    spare_devices = reliability.spare_hosts * per_host
    gpu_hours = (devices + spare_devices) * wall_s / HOURS
    board = cluster.accelerator.board_power_W
    per_device_W = None if board is None else board + facility.host_power_per_device_W
    energy = None
    if per_device_W is not None:
        energy = devices * (per_device_W + facility.network_power_per_device_W) * facility.pue * wall_s
    cost = None
    if facility.price_per_gpu_s is not None:
        cost = gpu_hours * HOURS * facility.price_per_gpu_s
        if facility.price_per_J is not None and energy is not None:
            cost += energy * facility.price_per_J
    return RunEstimate(
        steps=steps,
        tokens=float(steps * tokens_per_step),
        step_time_s=step_time_s,
        devices=devices,
        spare_devices=spare_devices,
        compute_s=compute_s,
        wall_s=wall_s,
        interruptions=wall_s * reliability.failure_rate_per_s,
        gpu_hours=gpu_hours,
        energy_J=energy,
        cost_usd=cost,
        reliability=reliability,
    )


@dataclass(frozen=True)
class RunFloor(_RunUnits):
    """Lower bounds of every plan's run on ``devices`` (None where the estimate's figure would be None)."""

    devices: int
    step_time_s: float
    wall_s: float
    gpu_hours: float
    energy_J: float | None
    cost_usd: float | None


def gemm_flops_per_step(model: ModelSpec, job: Job) -> float:
    """The GEMM FLOPs of one step over all devices: every block's and the head's forward GEMMs of one
    sequence (no sharding), times 3 (forward, data and weight gradients) and the global batch."""
    shard = shard_of(SubGraph(), job)
    gemms = [g for layer in range(model.num_layers) for g in L.block_gemms(model, layer, shard)]
    gemms.append(L.head_gemm(model, shard))
    forward = sum(2.0 * g.m * g.n * g.k * g.count for g in gemms)
    return 3.0 * forward * job.global_batch_size


def run_floor(gemm_flops: float, job: Job, devices: int, cluster: Cluster, length: RunLength) -> RunFloor:
    """The floor of a run on ``devices`` (module docstring) from ``gemm_flops_per_step``."""
    acc, facility = cluster.accelerator, cluster.facility
    peak = max(acc.peak(job.dtype), acc.peak(job.gemm_dtype))
    ceiling = max(acc.matmul_efficiency, acc.fp8_matmul_efficiency or 0.0)
    step_s = gemm_flops / (devices * peak * ceiling)
    wall_s = length.steps_for(job.global_batch_size * job.seq_len) * step_s
    gpu_hours = devices * wall_s / HOURS
    board = acc.board_power_W
    energy = None
    if board is not None:
        per_device_W = board + facility.host_power_per_device_W + facility.network_power_per_device_W
        energy = devices * per_device_W * facility.pue * wall_s
    cost = None
    if facility.price_per_gpu_s is not None:
        cost = gpu_hours * HOURS * facility.price_per_gpu_s
        if facility.price_per_J is not None and energy is not None:
            cost += energy * facility.price_per_J
    return RunFloor(devices, step_s, wall_s, gpu_hours, energy, cost)


def predicted_run(pred: Prediction, job: Job, cluster: Cluster, length: RunLength) -> RunEstimate:
    """The run of one evaluated plan."""
    return estimate_run(prediction_state(pred), pred.step_time_s, job, pred.devices_used, cluster, length)
