"""ParallelDims: the parallel degrees of a plan, one validated value object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from nestplan.errors import ConfigError
from nestplan.strategy.axes import AXES
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.strategy.subgraph import SubGraph, require_positive
from nestplan.strategy.subgraph import config_error as _err


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of every parallel axis and the graph-global choices.

    Devices = tp * cp * ep * pp * dp. Expert parallelism is carved out of data
    parallelism as in Megatron-LM: the ep ranks of a stage hold different experts
    but run the dense parts as data-parallel replicas, so a step processes
    dp * ep * micro_batch_size * num_microbatches sequences.
    ``layers_per_stage`` gives uneven transformer-layer counts: pp entries, one per stage (with
    v > 1 each divides by v and a stage's v chunks share its work evenly, its embedding or head
    included), or, when v > 1, pp x v entries, one per virtual stage in model order (chunk c of
    stage s is virtual stage c * pp + s, as Megatron-LM's interleaved schedule and its
    --pipeline-model-parallel-layout place them; the embedding rides with virtual stage 0, the
    head with the last). Given per virtual stage, a layout whose chunks are equal within every
    stage is stored per stage (the same plan), so that one plan has one value.

    The sub-graph part (tp, sp, cp, ep, etp, micro_batch_size, recompute) is given flat, as every
    caller and the plan JSON name it, and held as one ``SubGraph`` (``subgraph``), which validates it
    and states its derived sizes; ``etp`` (parallel folding) is described there.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    zero: ZeroStage = ZeroStage.NONE
    recompute: Recompute = Recompute.NONE
    micro_batch_size: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    layers_per_stage: tuple[int, ...] | None = None
    etp: int | None = None

    def __post_init__(self) -> None:
        sub = SubGraph(self.tp, self.sp, self.cp, self.ep, self.etp, self.micro_batch_size, self.recompute)
        for name in ("pp", "dp", "virtual_stages"):
            require_positive(name, getattr(self, name))
        object.__setattr__(self, "_subgraph", sub)
        object.__setattr__(self, "recompute", sub.recompute)
        object.__setattr__(self, "etp", sub.etp)  # etp = tp stored as None
        object.__setattr__(self, "zero", ZeroStage(self.zero))
        object.__setattr__(self, "schedule", Schedule(self.schedule))
        self._check_schedule()
        if self.layers_per_stage is not None:
            counts = tuple(int(x) for x in self.layers_per_stage)
            problem = layout_problem(counts, self.pp, self.virtual_stages)
            if problem is not None:
                raise _err(f"layers-per-stage {problem}", "layers_per_stage", _brief(counts), problem)
            object.__setattr__(self, "layers_per_stage", _per_stage_when_even(counts, self.pp, self.virtual_stages))

    @classmethod
    def of(cls, subgraph: SubGraph, **graph_global: Any) -> ParallelDims:
        """The plan of sub-graph strategy ``subgraph`` with the graph-global choices ``graph_global``
        (pp, dp, zero, schedule, virtual_stages, layers_per_stage; the defaults where not given)."""
        return cls(**vars(subgraph), **graph_global)

    @property
    def subgraph(self) -> SubGraph:
        """The sub-graph strategy: tp, sp, cp, ep, etp, microbatch size and recomputation."""
        return self._subgraph  # set by __post_init__; no dataclass field, so plan JSON and equality see the degrees

    def _check_schedule(self) -> None:
        """The schedule's chunks per stage (``Schedule.chunks``) against the virtual stages and pp."""
        v, schedule, chunks = self.virtual_stages, self.schedule, self.schedule.chunks
        if chunks is not None and chunks > 1 and v != chunks:
            raise _err(
                f"the {schedule.value} schedule runs {chunks} chunks per stage (virtual stages {chunks}), got {v}",
                "virtual_stages",
                v,
                chunks,
            )
        if chunks == 1 and v > 1:
            raise _err(
                f"virtual stages {v} need the interleaved schedule, got {schedule.value}",
                "virtual_stages",
                v,
                "interleaved",
            )
        if chunks != 1 and self.pp == 1:
            raise _err(f"the {schedule.value} schedule needs pp > 1, got pp 1", "schedule", schedule.value, "pp > 1")
        if schedule.v_shaped and self.layers_per_stage is not None and len(self.layers_per_stage) != self.pp:
            raise _err(
                f"the {schedule.value} schedule takes layers per stage ({self.pp} entries, each split in "
                f"half between its two chunks), got {len(self.layers_per_stage)} entries",
                "layers_per_stage",
                len(self.layers_per_stage),
                self.pp,
            )

    # -- derived sizes ---------------------------------------------------------
    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.ep * self.pp * self.dp

    @property
    def stage_devices(self) -> int:
        """Devices of one stage of one replica: tp * cp * ep."""
        return self.subgraph.stage_devices

    @property
    def expert_tp(self) -> int:
        """Ranks that split one expert (expert tensor parallelism): etp, tp unless folded."""
        return self.subgraph.expert_tp

    @property
    def expert_parallel(self) -> int:
        """Ranks that hold different experts: ep x tp / etp (ep unless folded)."""
        return self.subgraph.expert_parallel

    @property
    def batch_replicas(self) -> int:
        """Ranks that consume distinct sequences: dp * ep."""
        return self.dp * self.ep

    @property
    def sp_active(self) -> bool:
        return self.subgraph.sp_active

    def degree(self, axis: str) -> int:
        assert axis in AXES, axis
        return int(getattr(self, axis))

    def num_microbatches(self, global_batch_size: int) -> int:
        """Microbatches per replica per step; raises when the batch does not divide."""
        problem = self.batch_conflict(global_batch_size)
        if problem is not None:
            raise problem
        return global_batch_size // (self.batch_replicas * self.micro_batch_size)

    def batch_conflict(self, global_batch_size: int) -> ConfigError | None:
        """Why the batch does not divide into this plan's microbatches (an error to raise), or None."""
        per_step = self.batch_replicas * self.micro_batch_size
        if global_batch_size % per_step:
            return _err(
                f"global batch size {global_batch_size} is not divisible by dp x ep x micro-batch size "
                f"= {self.dp} x {self.ep} x {self.micro_batch_size} = {per_step}",
                "global_batch_size",
                global_batch_size,
                per_step,
            )
        m = global_batch_size // per_step
        if self.schedule is Schedule.INTERLEAVED and m % self.pp:
            return _err(
                f"the interleaved schedule needs the {m} microbatches to be a multiple of pp {self.pp}",
                "global_batch_size",
                global_batch_size,
                self.pp,
            )
        if self.schedule.v_shaped and m < 2 * self.pp:
            # torchtitan's DualPipeV refuses fewer microbatches than its 2 pp virtual stages; ZB-V fills its
            # V only from 2 pp - 1 on (Qi et al. 2024, arXiv 2405.15362, section 3)
            return _err(
                f"the {self.schedule.value} schedule needs at least 2 x pp = {2 * self.pp} microbatches, got {m}",
                "global_batch_size",
                global_batch_size,
                2 * self.pp * per_step,
            )
        return None

    @property
    def per_virtual_stage(self) -> bool:
        """``layers_per_stage`` gives every virtual stage (pp x v entries), not every stage."""
        return self.layers_per_stage is not None and len(self.layers_per_stage) != self.pp

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of each pipeline stage, all its chunks together (even split unless given)."""
        problem = self.layers_conflict(num_layers)
        if problem is not None:
            raise problem
        if self.per_virtual_stage:
            chunks = self.virtual_stage_layers(num_layers)  # per-virtual-stage entries: interleaved only
            return tuple(sum(chunks[s :: self.pp]) for s in range(self.pp))
        if self.layers_per_stage is not None:
            return self.layers_per_stage
        return (num_layers // self.pp,) * self.pp

    def virtual_stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of each of the pp x v virtual stages in model order (the stage and
        chunk of entry i: :meth:`virtual_stage_position`); without interleaving, the stages'."""
        if self.per_virtual_stage:
            problem = self.layers_conflict(num_layers)
            if problem is not None:
                raise problem
            assert self.layers_per_stage is not None
            return self.layers_per_stage
        v = self.virtual_stages
        per_stage = self.stage_layers(num_layers)
        return tuple(per_stage[self.virtual_stage_position(i)[0]] // v for i in range(self.pp * v))

    def virtual_stage_position(self, index: int) -> tuple[int, int]:
        """(stage, chunk) of virtual stage ``index`` (model order): interleaved, chunk c of stage s
        is virtual stage c pp + s (Megatron-LM's interleaved schedule); V-shaped schedules run
        virtual stages 0 .. pp - 1 down the stages and pp .. 2 pp - 1 back up (torch.distributed.
        pipelining's "v" stage-to-rank style: stage s holds virtual stages s and 2 pp - 1 - s)."""
        pp = self.pp
        assert 0 <= index < pp * self.virtual_stages, index
        chunk, offset = divmod(index, pp)
        if self.schedule.v_shaped and chunk == 1:
            return pp - 1 - offset, 1
        return offset, chunk

    def layers_conflict(self, num_layers: int) -> ConfigError | None:
        """Why the layers do not split into this plan's stages (an error to raise), or None."""
        if self.layers_per_stage is not None:
            if sum(self.layers_per_stage) != num_layers:
                return _err(
                    f"layers-per-stage sums to {sum(self.layers_per_stage)} but the model has {num_layers} layers",
                    "layers_per_stage",
                    self.layers_per_stage,
                    num_layers,
                )
            parts = self.layers_per_stage
        else:
            if self.pp > num_layers:
                return _err(f"pp {self.pp} exceeds the model's {num_layers} layers", "pp", self.pp, num_layers)
            if num_layers % self.pp:
                return _err(
                    f"pp {self.pp} does not divide the model's {num_layers} layers; "
                    "give --layers-per-stage for an uneven split",
                    "pp",
                    self.pp,
                    num_layers,
                )
            parts = (num_layers // self.pp,) * self.pp
        if self.virtual_stages > 1 and not self.per_virtual_stage:
            bad = [n for n in parts if n % self.virtual_stages]
            if bad:
                return _err(
                    f"a stage of {bad[0]} layers does not split into {self.virtual_stages} virtual stages",
                    "virtual_stages",
                    self.virtual_stages,
                    bad[0],
                )
        return None


def virtual_stage_index(schedule: Schedule, stage: int, chunk: int, pp: int) -> int:
    """The model-order virtual stage that ``chunk`` of ``stage`` runs (the inverse of
    :meth:`ParallelDims.virtual_stage_position`): c pp + s, or under a V schedule 2 pp - 1 - s for chunk 1."""
    return 2 * pp - 1 - stage if schedule.v_shaped and chunk == 1 else chunk * pp + stage


def layout_problem(counts: Sequence[int], pp: int, virtual_stages: int) -> str | None:
    """What is wrong with transformer-layer counts given per stage (pp entries) or, with v > 1, per
    virtual stage (pp x v entries), or None.

    Every (virtual) stage holds at least one layer, except that, per virtual stage, the first may
    hold only the embedding and the last only the head (Megatron-LM's --pipeline-model-parallel-layout
    allows the stages 'E' and 'L': megatron/core/transformer/pipeline_parallel_layer_layout.py; the
    Llama 3 paper, section 3.3.2, runs its first and last chunk so)."""
    v = virtual_stages
    lengths = (pp, pp * v) if v > 1 else (pp,)
    if len(counts) not in lengths:
        wanted = f"pp {pp} or pp x v = {pp * v}" if v > 1 else f"pp {pp} (pp x v entries need v > 1)"
        return f"has {len(counts)} entries; allowed: {wanted}"
    if min(counts, default=0) < 0:
        return f"has a negative count {min(counts)}"
    if len(counts) == pp and min(counts) < 1:
        return "gives a stage no layer; every stage needs one (per virtual stage, the first and last may hold none)"
    if len(counts) != pp and min(counts[1:-1], default=1) < 1:
        return (
            "gives a virtual stage between the first and the last no layer; only the first (embedding) and "
            "the last (head) may hold none"
        )
    return None


def _per_stage_when_even(counts: tuple[int, ...], pp: int, v: int) -> tuple[int, ...]:
    """Counts per virtual stage whose chunks are equal within every stage, as counts per stage."""
    if len(counts) == pp:
        return counts
    chunks = [counts[s::pp] for s in range(pp)]
    if all(len(set(c)) == 1 for c in chunks):
        return tuple(sum(c) for c in chunks)
    return counts


def _brief(counts: Sequence[int]) -> str:
    """Counts as one short text for an error message."""
    text = ",".join(map(str, counts))
    return text if len(text) <= 60 else text[:60] + "..."
