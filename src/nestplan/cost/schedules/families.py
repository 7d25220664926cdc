"""One class per pipeline schedule family, each stating what its schedule is: chunks per stage, the
operation order of every stage, the forwards a stage runs before its first backward (the memory's
microbatches in flight), the variants the planner tries from a 1F1B plan, and the facts the
evaluator asks (does it hide communication, can Megatron-core's MoE all-to-all overlap run it).

Legality of a plan's (pp, v, layers per stage) reads the chunks per stage off the enum member
(``Schedule.chunks``; strategy/dims.py ``ParallelDims._check_schedule``: the plan's layer sits
below this one), so it is stated once, there. The registry (cost/schedules/__init__.py) keys one
instance of each class by its ``Schedule``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from nestplan.cost.schedules.operations import (
    FORWARD,
    Op,
    dualpipev_order,
    megatron_order,
    representative_microbatches,
    zb_h1_order,
    zbv_order,
)
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule

INTERLEAVE_CHOICES = (2, 3, 4)  # chunks per stage the planner tries on a plan's own split
ENDS_LAYOUT_MAX_V = 8  # most chunks per stage of the end-balanced layouts (Llama 3 and NeMo's 405B run 8)
Changes = dict[str, Any]  # fields of a plan's ParallelDims to change (dataclasses.replace)


class PipelineSchedule:
    """A pipeline schedule: the defaults are 1F1B's (one chunk per stage, no variants)."""

    # the schedule a plan naming this one with v > 1 chunks per stage means (1F1B: interleaved 1F1B)
    interleaved_form: Schedule | None = None
    # an operation overlaps one microbatch's communication with another's compute (DualPipeV's F&BW)
    hides_communication = False
    # no variant on a plan's own split is faster than that plan without its bubble (Prediction.bubble_free_step_s)
    bounded_by_bubble_free_step = False

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    @property
    def chunks(self) -> int | None:
        """Chunks per stage: fixed, or None where the plan chooses (interleaved)."""
        return self.schedule.chunks

    @property
    def shown_virtual_stages(self) -> int:
        """The chunks per stage a plan's degrees are shown with under this schedule (api's table of
        schedules): its own, or 2 where the plan chooses."""
        return self.chunks or 2

    def warmup_forwards(self, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int) -> np.ndarray:
        """Forwards (of model chunks) a stage runs before its first backward, at most all m v of them;
        ``stage`` and ``pp`` may be arrays (elementwise)."""
        return np.minimum(np.asarray(pp) - np.asarray(stage) - 1, m * virtual)

    def operations(self, stage: int, pp: int, m: int, virtual: int) -> list[Op]:
        """Stage ``stage``'s operations, in order, for ``m`` microbatches over ``pp`` stages of ``virtual`` chunks."""
        return megatron_order(int(self.warmup_forwards(stage, pp, m, virtual)), pp, m, virtual)

    def period(self, pp: int, virtual: int) -> int:
        """Positions after which a stage's steady-state sequence repeats (cost/schedules/periodic.py):
        a forward and a backward per microbatch."""
        return 2

    closed_form: Callable[[np.ndarray, np.ndarray, int], float] | None = None

    def candidates(self, dims: ParallelDims, num_layers: int, splits: Sequence[tuple[int, ...]]) -> list[Changes]:
        """Variants of the 1F1B plan ``dims`` under this schedule for the planner to try, as changes of
        its fields, before the legality checks (``splits``: layers per stage to try, sorted)."""
        return []

    def layouts(self, dims: ParallelDims, num_layers: int) -> list[Changes]:
        """Variants (changes of ``dims``) that set their own layers per virtual stage, whatever the plan's split."""
        return []


class OneFOneB(PipelineSchedule):
    """PipeDream-Flush (Narayanan et al. 2021): stage s runs pp - s - 1 warm-up forwards, then
    alternates (Megatron-LM schedules.py)."""

    interleaved_form = Schedule.INTERLEAVED


class GPipe(PipelineSchedule):
    """All forwards, then all backwards (Huang et al. 2019): all m v forwards before the first backward."""

    def warmup_forwards(self, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int) -> np.ndarray:
        return np.full(np.broadcast(np.asarray(stage), np.asarray(pp)).shape, m * virtual)

    @staticmethod
    def closed_form(fwd_s: np.ndarray, bwd_s: np.ndarray, m: int) -> float:
        """GPipe's makespan in closed form (a flow shop of m identical jobs, forward then backward);
        its forward phase drifts at a different rate on every stage, so it has no common period.

        Forward j ends on stage s at sum_{u <= s} F_u + j max_{u <= s} F_u: the longest staircase path
        spends its j extra jobs on the slowest stage it crosses. Stage t starts its backwards when its
        last forward ends, R_t; backward m - 1 ends on stage s at
        max_{t >= s} R_t + sum_{s <= u <= t} B_u + (m - 1) max_{s <= u <= t} B_u by the same argument
        (checked against the operation-by-operation run in tests/unit/test_schedule.py)."""
        p = len(fwd_s)
        release = np.cumsum(fwd_s) + (m - 1) * np.maximum.accumulate(fwd_s)
        finish = 0.0
        for s in range(p):
            path = np.cumsum(bwd_s[s:]) + (m - 1) * np.maximum.accumulate(bwd_s[s:])
            finish = max(finish, float((release[s:] + path).max()))
        return finish


class Interleaved(PipelineSchedule):
    """Interleaved 1F1B over v model chunks per stage (Narayanan et al. SC'21 section 2.2.2), chunk c
    of stage s virtual stage c pp + s."""

    bounded_by_bubble_free_step = True

    def warmup_forwards(self, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int) -> np.ndarray:
        """Megatron-LM's count (forward_backward_pipelining_with_interleaving): (pp - stage - 1) * 2 +
        (v - 1) * pp, or all m v when m == pp (every forward runs first)."""
        stage, pp = np.asarray(stage), np.asarray(pp)
        total = m * virtual
        return np.minimum(np.where(pp == m, total, (pp - stage - 1) * 2 + (virtual - 1) * pp), total)

    def period(self, pp: int, virtual: int) -> int:
        """Every chunk of p microbatches."""
        return 2 * pp * virtual

    def candidates(self, dims: ParallelDims, num_layers: int, splits: Sequence[tuple[int, ...]]) -> list[Changes]:
        """The plan's stages, v chunks each (v in INTERLEAVE_CHOICES)."""
        return [{"schedule": self.schedule, "virtual_stages": v} for v in INTERLEAVE_CHOICES]

    def layouts(self, dims: ParallelDims, num_layers: int) -> list[Changes]:
        """Virtual stages that balance the embedding and the head (:func:`ends_balanced_layout`),
        v = 2 .. ENDS_LAYOUT_MAX_V."""
        found = ((v, ends_balanced_layout(num_layers, dims.pp, v)) for v in range(2, ENDS_LAYOUT_MAX_V + 1))
        return [
            {"schedule": self.schedule, "virtual_stages": v, "layers_per_stage": layout}
            for v, layout in found
            if layout is not None
        ]


def ends_balanced_layout(num_layers: int, pp: int, v: int) -> tuple[int, ...] | None:
    """Layers per virtual stage (pp x v, model order) with the embedding and the head each counted
    as one layer, where they divide evenly: k = (L + 2) / (pp v) per virtual stage, k - 1 on the
    first and the last (NeMo's account_for_embedding/loss_in_pipeline_split; Llama 3 405B's
    0, 1 x 126, 0 over pp 16 x v 8, Dubey et al. 2024 section 3.3.2; NeMo's 1, 2 x 62, 1 over
    pp 8 x v 8). None where pp v does not divide L + 2."""
    stages = pp * v
    if v < 2 or (num_layers + 2) % stages:
        return None
    k = (num_layers + 2) // stages
    return (k - 1,) + (k,) * (stages - 2) + (k - 1,)


class _SplitBackward(PipelineSchedule):
    """A schedule that runs the backward as B and W apart (cost/schedules/operations.py states its order)."""

    def order(self, stage: int, pp: int, m: int) -> list[Op]:
        raise NotImplementedError

    def operations(self, stage: int, pp: int, m: int, virtual: int) -> list[Op]:
        assert virtual == self.chunks and 0 <= stage < pp and m >= 1, (self.schedule, virtual, stage, pp, m)
        return self.order(stage, pp, m)

    def warmup_forwards(self, stage: int | np.ndarray, pp: int | np.ndarray, m: int, virtual: int) -> np.ndarray:
        """Read off its order as Megatron-LM counts them: the forwards before the first operation of
        another kind, less the one that opens the steady state (all of them where every forward runs first).
        Read off the order of :func:`representative_microbatches`, which has the same count."""

        def count(s: int, p: int) -> int:
            shown = representative_microbatches(p, m)
            kinds = [op.kind for op in self.operations(s, p, shown, virtual)]
            leading = next((i for i, kind in enumerate(kinds) if kind != FORWARD), len(kinds))
            return leading if leading == shown * virtual else leading - 1

        return np.vectorize(count, otypes=[int])(stage, pp)


class ZeroBubbleH1(_SplitBackward):
    """ZB-H1 (Qi et al., ICLR 2024, section 2.1): 1F1B with each stage's W passes deferred."""

    def order(self, stage: int, pp: int, m: int) -> list[Op]:
        return zb_h1_order(stage, pp, m)

    def candidates(self, dims: ParallelDims, num_layers: int, splits: Sequence[tuple[int, ...]]) -> list[Changes]:
        """The plan as it is."""
        return [{"schedule": self.schedule}]


class _VShaped(_SplitBackward):
    """Two chunks per stage in a V: stage s holds virtual stages s and 2 pp - 1 - s."""

    def operations(self, stage: int, pp: int, m: int, virtual: int) -> list[Op]:
        assert m >= 2 * pp, "V schedules need 2 pp microbatches (ParallelDims.batch_conflict)"
        return super().operations(stage, pp, m, virtual)

    def candidates(self, dims: ParallelDims, num_layers: int, splits: Sequence[tuple[int, ...]]) -> list[Changes]:
        """Every split of ``splits`` (each stage's layers halve into its two chunks)."""
        return [{"schedule": self.schedule, "virtual_stages": 2, "layers_per_stage": split} for split in splits]


class ZeroBubbleV(_VShaped):
    """ZB-V (Qi et al. 2024, arXiv 2405.15362)."""

    def order(self, stage: int, pp: int, m: int) -> list[Op]:
        return zbv_order(stage, pp, m)


class DualPipeV(_VShaped):
    """DualPipe cut in half (DeepSeek-V3, arXiv 2412.19437, section 3.2.1): its overlapped F&BW hides
    one microbatch's expert all-to-alls and transfers under the other's compute."""

    hides_communication = True

    def order(self, stage: int, pp: int, m: int) -> list[Op]:
        return dualpipev_order(stage, pp, m)
