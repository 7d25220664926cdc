"""Context parallelism's exchange as a searched choice: the planner ranks plans under the job's own
exchange and tries the others on its finalists with cp > 1; --export keeps what the framework runs."""

from __future__ import annotations


import pytest

from nestplan import api
from nestplan.job import Job
from nestplan.model import load_model
from nestplan.search.planner import cp_exchange_jobs
from nestplan.search.space import SearchSpace
from nestplan.settings import CpCommType
from nestplan.strategy.dims import ParallelDims

LONG = Job(global_batch_size=16, seq_len=131072)


def test_exchange_variants_are_the_legal_ones() -> None:
    """Llama 3 8B has 8 KV heads: a2a (Ulysses) needs cp to divide a device's KV heads (8 / tp);
    a2a+p2p runs its all-to-all inside the node the cp group spans first and a ring across."""
    model = load_model("llama3-8b")
    dims = ParallelDims(tp=2, sp=True, cp=8)
    kinds = tuple(CpCommType)
    inside_node = cp_exchange_jobs(model, LONG, dims, (8,), kinds)
    assert {j.settings.cp_comm_type for j in inside_node} == {
        CpCommType.ALLGATHER
    }  # 4 KV heads per device: no a2a at 8
    across = cp_exchange_jobs(model, LONG, dims, (4, 2), kinds)
    assert {(j.settings.cp_comm_type, j.settings.cp_a2a_size) for j in across} == {
        (CpCommType.ALLGATHER, 1),
        (CpCommType.A2A_P2P, 4),
    }
    narrow = cp_exchange_jobs(model, LONG, ParallelDims(cp=4), (4,), kinds)
    assert {j.settings.cp_comm_type for j in narrow} == {CpCommType.A2A, CpCommType.ALLGATHER}


def test_planner_chooses_among_the_exchanges_it_may_use() -> None:
    fixed = api.plan("llama3-8b", "dgx-h100", LONG, devices=16, top=3, space=SearchSpace())
    searched = api.plan(
        "llama3-8b", "dgx-h100", LONG, devices=16, top=3, space=SearchSpace(cp_comm_types=tuple(CpCommType))
    )
    assert searched.best.plan.cp > 1
    assert searched.best.step_time_s <= fixed.best.step_time_s * (1 + 1e-12)
    only = api.plan(
        "llama3-8b",
        "dgx-h100",
        LONG.with_settings(cp_comm_type=CpCommType.ALLGATHER),
        devices=16,
        top=0,
        space=SearchSpace(cp_comm_types=(CpCommType.ALLGATHER,)),
    )
    assert (
        only.job.settings.cp_comm_type is CpCommType.ALLGATHER
        and only.plan.job.settings.cp_comm_type is CpCommType.ALLGATHER
    )


@pytest.mark.parametrize(
    "framework,kinds",
    [("megatron", tuple(CpCommType)), ("deepspeed", (CpCommType.A2A,)), ("torchtitan", (CpCommType.ALLGATHER,))],
)
def test_search_space_keeps_the_exchanges_the_framework_runs(framework, kinds) -> None:
    model = api.resolve_model("llama3-8b")
    assert api.search_space(export=framework, model=model).cp_comm_types == kinds
    assert api.search_space(cp_comm_types=(CpCommType.P2P,), export="deepspeed", model=model).cp_comm_types == (
        CpCommType.A2A,
    )


def test_cli_plan_shows_the_chosen_exchange(capsys) -> None:
    from cli_helpers import run_cli

    args = [
        "plan",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--devices",
        "16",
        "--global-batch-size",
        "16",
        "--seq-len",
        "131072",
        "--top",
        "0",
    ]
    code, out, _ = run_cli(capsys, args + ["--cp-comm-type", "allgather"])
    assert code == 0 and "(allgather)" in out
