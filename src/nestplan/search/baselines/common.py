"""What every baseline returns, and helpers they share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from nestplan.cluster import Cluster
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.prediction import Prediction
from nestplan.job import Job
from nestplan.model.spec import ModelSpec
from nestplan.strategy.placement import STAGE_MAJOR
from nestplan.search.space import even_split as even_split  # re-exported for the baselines
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import model_conflict, tp_conflict


@dataclass(frozen=True)
class BaselineResult:
    """A baseline's plan (None: it found nothing that fits, the paper's dash)."""

    name: str
    prediction: Prediction | None
    solve_time_s: float
    evaluations: int

    @property
    def feasible(self) -> bool:
        return self.prediction is not None

    @property
    def tokens_per_s(self) -> float:
        return self.prediction.tokens_per_s if self.prediction is not None else 0.0


class Evaluator:
    """Counts evaluations; returns None for plans the rules of a framework refuse."""

    def __init__(self, model: ModelSpec, cluster: Cluster, job: Job) -> None:
        self.model, self.cluster, self.job = model, cluster, job
        self.count = 0
        self.start = time.perf_counter()

    def __call__(self, dims: ParallelDims, order: tuple[str, ...] = STAGE_MAJOR) -> Prediction | None:
        self.count += 1
        job = self.job
        refused = model_conflict(dims, self.model, job.seq_len) or dims.batch_conflict(job.global_batch_size)
        if refused is not None or dims.devices > self.cluster.devices:
            return None
        return evaluate_plan(self.model, self.cluster, dims, job, order)

    def result(self, name: str, best: Prediction | None) -> BaselineResult:
        return BaselineResult(name, best, time.perf_counter() - self.start, self.count)


def largest_dp(devices: int, per_replica: int, global_batch: int, per_sample: int) -> int:
    """The most replicas that fit the devices and divide the batch (0 if none)."""
    for d in range(devices // per_replica, 0, -1):
        if global_batch % (d * per_sample) == 0:
            return d
    return 0


def tp_candidates(model: ModelSpec, limit: int) -> list[int]:
    """Powers of two up to ``limit`` that the model allows as tp (largest first)."""
    out, t = [], 1
    while t <= limit:
        if tp_conflict(model, t) is None:
            out.append(t)
        t *= 2
    return out[::-1]


Best = Callable[[Prediction | None, Prediction | None], Prediction | None]


def faster(a: Prediction | None, b: Prediction | None) -> Prediction | None:
    """The faster of two fitting predictions (None counts as nothing)."""
    if a is None or not a.fits:
        return b if b is not None and b.fits else None
    if b is None or not b.fits:
        return a
    return a if a.step_time_s <= b.step_time_s else b
