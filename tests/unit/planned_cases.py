"""Plans the planner itself produces, over the shapes an export must handle (issue 18's property test):
dense and MoE, tp/sp, cp > 1, pp with even, uneven and interleaved splits, ZeRO 0-3, recomputation.

Each case is a real search (``api.plan``) on a catalog model and cluster, some with the search space
narrowed so that the shape appears (a ZeRO stage, a cp degree, a pipeline depth); the plan is
whatever the planner picks there. The tests that use them run the frameworks' own validators on
each export. A case is planned among the pipeline schedules the exporting framework runs (an export
refuses the others, issue 27); ``planned_plans(framework)`` caches the plans of each set of schedules
for the whole test session (about a minute of searches on a 2-core machine), so the tests using it are
marked slow.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from nestplan import api
from nestplan.export import framework_schedules
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.search.space import SearchSpace
from nestplan.settings import Fp8Recipe, OptimizerState
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage


@dataclass(frozen=True)
class Case:
    """One planning problem: model, cluster, devices, batch, sequence and the space searched."""

    name: str
    model: str
    cluster: str
    devices: int
    global_batch_size: int
    seq_len: int
    space: dict = field(default_factory=dict)  # SearchSpace overrides that force the shape wanted
    job: dict = field(default_factory=dict)  # Job settings beyond batch and sequence (FP8, overlap)


def _z(stage: int) -> tuple[ZeroStage, ...]:
    return (ZeroStage(stage),)


CASES: tuple[Case, ...] = (
    # dense, the planner's own choice
    Case("llama3-8b-8", "llama3-8b", "dgx-h100", 8, 128, 8192),
    Case("llama3-8b-64", "llama3-8b", "dgx-h100", 64, 512, 8192),
    Case("llama3-70b-64", "llama3-70b", "dgx-h100", 64, 256, 8192),
    Case("llama3-70b-256", "llama3-70b", "h100-spine-leaf", 256, 4096, 8192),
    Case("gpt3-175b-128", "gpt3-175b", "dgx-a100", 128, 256, 2048),
    Case("gpt3-175b-512", "gpt3-175b", "dgx-h100", 512, 1536, 2048),
    Case("nemotron4-15b-64", "nemotron4-15b", "dgx-h100", 64, 256, 4096),
    Case("nemotron4-340b-256", "nemotron4-340b", "dgx-h100", 256, 512, 4096),
    Case("llama3.1-405b-1024", "llama3.1-405b", "dgx-h100", 1024, 2048, 8192),
    Case("llama2-7b-32", "llama2-7b", "dgx-a100", 32, 256, 4096),
    Case("bert-large-16", "bert-large", "dgx-a100", 16, 256, 512),
    # dense, a shape forced
    Case("llama2-7b-zero0", "llama2-7b", "dgx-a100", 32, 256, 4096, {"zero": _z(0), "tp": (2,)}),
    Case("llama3-8b-zero1", "llama3-8b", "dgx-h100", 16, 256, 4096, {"zero": _z(1), "tp": (1,)}),
    Case("llama3-8b-zero2", "llama3-8b", "dgx-h100", 16, 256, 4096, {"zero": _z(2), "tp": (1,)}),
    Case("llama3-8b-zero3", "llama3-8b", "dgx-h100", 16, 256, 4096, {"zero": _z(3), "tp": (1,)}),
    Case("llama3-70b-zero3", "llama3-70b", "dgx-h100", 64, 256, 4096, {"zero": _z(3), "tp": (1, 2)}),
    Case("llama3-8b-cp2", "llama3-8b", "dgx-h100", 16, 32, 32768, {"cp": (2,)}),
    Case("llama3-8b-cp4", "llama3-8b", "dgx-h100", 32, 32, 65536, {"cp": (4,)}),
    Case("llama3-70b-cp2", "llama3-70b", "dgx-h100", 128, 128, 16384, {"cp": (2,)}),
    Case("llama3-70b-cp8", "llama3-70b", "dgx-h100", 128, 32, 131072, {"cp": (8,)}),
    Case("llama3-70b-pp8", "llama3-70b", "dgx-h100", 128, 512, 8192, {"max_pp": 8, "tp": (4,), "cp": (1,)}),
    Case("gpt3-175b-tp8", "gpt3-175b", "dgx-a100", 256, 512, 2048, {"tp": (8,), "recompute": (Recompute.FULL,)}),
    Case("nemotron4-15b-tp2", "nemotron4-15b", "dgx-h100", 32, 256, 4096, {"tp": (2,)}),
    Case("gpt3-35b-selective", "gpt3-35b", "dgx-a100", 64, 256, 2048, {"recompute": (Recompute.SELECTIVE,)}),
    Case("llama3-70b-mbs2", "llama3-70b", "dgx-h100", 64, 256, 4096, {"micro_batch_sizes": (2,)}),
    # mixture of experts
    Case("mixtral-8x7b-64", "mixtral-8x7b", "dgx-h100", 64, 256, 4096),
    Case("mixtral-8x7b-128", "mixtral-8x7b", "h100-spine-leaf", 128, 4096, 8192),
    Case("mixtral-8x7b-ep8", "mixtral-8x7b", "dgx-h100", 64, 256, 4096, {"ep": (8,)}),
    Case("mixtral-8x7b-ep2", "mixtral-8x7b", "dgx-h100", 32, 256, 4096, {"ep": (2,)}),
    Case("mixtral-8x7b-cp2", "mixtral-8x7b", "dgx-h100", 64, 64, 32768, {"cp": (2,)}),
    Case("mixtral-small-16", "mixtral-small", "dgx-h100", 16, 128, 4096),
    Case("mixtral-8x7b-zero3", "mixtral-8x7b", "dgx-h100", 64, 256, 4096, {"zero": _z(3), "ep": (1,)}),
    Case("mixtral-8x7b-a100", "mixtral-8x7b", "dgx-a100", 128, 512, 4096),
    # FP8 GEMMs (Transformer Engine's delayed scaling), parameters kept in FP8
    Case("llama3-70b-fp8", "llama3-70b", "dgx-h100", 128, 512, 8192, job={"fp8_recipe": Fp8Recipe.DELAYED}),
    Case(
        "mixtral-8x7b-fp8",
        "mixtral-8x7b",
        "dgx-h100",
        64,
        256,
        4096,
        job={"fp8_recipe": Fp8Recipe.DELAYED, "fp8_params": True},
    ),
    # the optimizer's state in 16-bit remainders and bf16 moments (Megatron-core's precision-aware Adam)
    Case("llama3-8b-bf16-state", "llama3-8b", "dgx-h100", 16, 128, 8192, job={"optimizer_state": OptimizerState.BF16}),
)


def planned_plans(framework: str) -> dict[str, Plan]:
    """Each case's best plan among the pipeline schedules ``framework`` runs (its export refuses the
    others), planned once per test session for each set of schedules."""
    return _planned_under(framework_schedules(framework))


@lru_cache(maxsize=None)
def _planned_under(schedules: tuple[Schedule, ...]) -> dict[str, Plan]:
    return {c.name: planned(c, schedules) for c in CASES}


def planned(case: Case, schedules: tuple[Schedule, ...]) -> Plan:
    job = Job.from_flat(case.global_batch_size, case.seq_len, **case.job)
    space = SearchSpace(**case.space)
    space = replace(space, schedules=tuple(s for s in space.schedules if s in schedules))
    report = api.plan(case.model, case.cluster, job, devices=case.devices, top=0, space=space)
    return report.plan


ISSUE_ORDER = ("tp", "cp", "ep", "dp", "pp")


def _schedules_of(framework: str) -> SearchSpace:
    """The full search space with the pipeline schedules ``framework`` runs (its export refuses the others)."""
    return api.search_space(schedules=framework_schedules(framework))


def evaluated(model: str, cluster: str, devices: int, dims: ParallelDims, gbs: int, seq: int) -> Plan:
    job = Job(global_batch_size=gbs, seq_len=seq)
    return api.evaluate_full(model, cluster, dims, job, devices=devices, axis_order=ISSUE_ORDER).plan


@lru_cache(maxsize=None)
def issue_plans() -> dict[str, Plan]:
    """Issue 18's three plans: test_export.py's two fixed shapes and the planner's 405B plan on 2,048."""
    job405 = Job(global_batch_size=2048, seq_len=8192)
    return {
        "llama3-70b-256": evaluated(
            "llama3-70b",
            "h100-spine-leaf",
            256,
            ParallelDims(tp=2, sp=True, cp=4, pp=4, dp=8, zero=1, layers_per_stage=(19, 21, 21, 19)),
            4096,
            8192,
        ),
        "mixtral-8x7b-128": evaluated(
            "mixtral-8x7b",
            "h100-spine-leaf",
            128,
            ParallelDims(tp=1, cp=2, ep=4, pp=4, dp=4, zero=1, schedule="interleaved", virtual_stages=2),
            4096,
            8192,
        ),
        "llama3.1-405b-2048": api.plan(
            "llama3.1-405b", "dgx-h100", job405, devices=2048, top=0, space=_schedules_of("megatron")
        ).plan,
    }
