"""The end of a step: data-parallel gradient synchronisation, ZeRO gathers, tied-embedding
sync and the optimizer step, and how much of it a real framework hides.

Overlap (Megatron-LM --overlap-grad-reduce / --overlap-param-gather, DeepSpeed overlap_comm):
a stage's gradient buckets are reduced while its last backward runs and while the stages
before it drain the pipeline, so only sync - (backward + drain) is exposed; ZeRO 1/2's
parameter all-gather hides behind the next step's first forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from nestplan.cost import comm
from nestplan.hardware.accelerator import Accelerator
from nestplan.job import Job
from nestplan.model import layers as L
from nestplan.model.spec import ModelSpec
from nestplan.network import collectives as coll
from nestplan.network.topology import Topology
from nestplan.strategy.enums import ZeroStage
from nestplan.strategy.placement import GroupSpan

MAIN_GRAD_BYTES = 4  # the fp32 gradient the optimizer reads (Megatron's main_grad, Apex's fp32 shard)


def optimizer_traffic_bytes(job: Job) -> float:
    """HBM bytes an optimizer step moves per parameter: its state read and written, the gradient read,
    the parameter written, and read too where no master copy stands for it."""
    weight = job.param_bytes * (2 if job.master_bytes == 0 else 1)
    return 2 * job.optimizer_state_bytes + MAIN_GRAD_BYTES + weight


@dataclass(frozen=True)
class SyncContext:
    topo: Topology
    accelerator: Accelerator
    job: Job
    zero: ZeroStage
    dense_group: GroupSpan  # ranks holding the same dense parameters: cp x ep x dp
    expert_group: GroupSpan  # ranks holding the same experts: cp x dp

    # seconds already computed, by (quantity, parameters): a search asks for the same stages often
    _known: dict = field(default_factory=dict, compare=False, repr=False)

    def _pairs(self, params: L.ParamCount) -> tuple[tuple[GroupSpan, float], ...]:
        return ((self.dense_group, params.dense), (self.expert_group, params.expert))

    def _remembered(self, name: str, params: L.ParamCount) -> float:
        key = (name, params)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = getattr(self, name)(params)
        return found

    def sync(self, params: L.ParamCount) -> float:
        """Gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1/2) of one stage."""
        return self._remembered("_sync", params)

    def gather(self, params: L.ParamCount) -> float:
        """Parameter all-gather after the optimizer step (ZeRO 1/2)."""
        return self._remembered("_gather", params)

    def optimizer(self, params: L.ParamCount) -> float:
        """Seconds of the (memory-bound) optimizer step over this device's share of the stage."""
        return self._remembered("_optimizer", params)

    def _sync(self, params: L.ParamCount) -> float:
        j = self.job
        return sum(
            comm.grad_sync_time(self.topo, g, n * j.grad_bytes, n * j.dtype_bytes, self.zero)
            for g, n in self._pairs(params)
        )

    def _gather(self, params: L.ParamCount) -> float:
        return sum(
            comm.param_gather_time(self.topo, g, n * self.job.param_bytes, self.zero) for g, n in self._pairs(params)
        )

    def _optimizer(self, params: L.ParamCount) -> float:
        if self.zero is ZeroStage.NONE:
            local = params.total
        else:
            local = params.dense / self.dense_group.size + params.expert / self.expert_group.size
        return self.accelerator.memory_time(local * optimizer_traffic_bytes(self.job))


@dataclass(frozen=True)
class StepEnd:
    """The step's end is set by the stage that finishes last: its exposed sync, then its
    optimizer step (each stage updates its own parameters once its gradients are reduced)."""

    exposed_s: float  # exposed sync + gather of the stage that finishes last
    optimizer_s: float  # that stage's optimizer step

    @property
    def total_s(self) -> float:
        return self.exposed_s + self.optimizer_s


def stage_end(
    ctx: SyncContext, params: L.ParamCount, forward: float, backward: float, drain: float
) -> tuple[float, float]:
    """(exposed sync + gather, optimizer) of one stage; ``drain`` is the time the stages before it
    still run after its last backward (their backwards and transfers)."""
    job = ctx.job
    hides_sync = backward + drain if job.settings.overlap_grad_reduce else 0.0
    hides_gather = forward if job.settings.overlap_param_gather else 0.0
    exposed = max(0.0, ctx.sync(params) - hides_sync) + max(0.0, ctx.gather(params) - hides_gather)
    return exposed, ctx.optimizer(params)


def step_end(
    ctx: SyncContext,
    params: Sequence[L.ParamCount],
    forward: Sequence[float],
    backward: Sequence[float],
    boundaries: Sequence[float],
) -> StepEnd:
    """Per-stage lists are first stage first; ``boundaries[i]`` is the transfer between stage i and i + 1."""
    drain = 0.0
    exposed, optimizer = [], []
    for i, prm in enumerate(params):
        exp, opt = stage_end(ctx, prm, forward[i], backward[i], drain)
        exposed.append(exp)
        optimizer.append(opt)
        drain += backward[i] + (boundaries[i] if i < len(boundaries) else 0.0)
    last = max(range(len(params)), key=lambda i: exposed[i] + optimizer[i])
    return StepEnd(exposed[last], optimizer[last])


def tied_embedding_sync(model: ModelSpec, topo: Topology, tp: int, job: Job, ends: GroupSpan) -> float:
    """Megatron all-reduces the gradients of the embedding's two copies between the first and last
    stage, where the output layer is tied to it or MTP modules read it there (Megatron-Core
    finalize_model_grads, _allreduce_word_embedding_grads): ``ends`` is that group
    (``Placement.pp_ends``: one member, so nothing to reduce, when pp = 1)."""
    if not (model.tied_embeddings or model.mtp_layers):
        return 0.0
    return coll.all_reduce(topo, ends.fanout, model.vocab_size * model.hidden_size / tp * job.grad_bytes)
