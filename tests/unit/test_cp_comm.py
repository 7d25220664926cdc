"""Context parallelism's four exchanges (issue 16, item 3): p2p ring, Ulysses all-to-all, K/V all-gather
and the hierarchical a2a+p2p; their costs, legality, memory, plan JSON and exports."""

from __future__ import annotations

import json

import pytest

from nestplan import api
from nestplan.cost import comm
from nestplan.cost.evaluator import evaluate_plan
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model.layers import Shard
from nestplan.network import collectives as coll
from nestplan.plan import Plan
from nestplan.strategy.legality import cp_exchange_conflict
from nestplan.settings import CpCommType, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute
from nestplan.strategy.placement import GroupSpan

CLUSTER = api.resolve_cluster("dgx-h100", 32)
TOPO = CLUSTER.topology
LLAMA = api.resolve_model("llama3-8b")
SEQ = 65536
PLAN = ParallelDims(tp=1, pp=1, dp=1, cp=32)


def _job(kind: str, a2a: int = 1) -> Job:
    return api.job_for(LLAMA, CLUSTER, 8, SEQ, cp_comm_type=kind, cp_a2a_size=a2a)


def _cp_group(fanout: tuple[int, ...]) -> GroupSpan:
    return GroupSpan(size=int(__import__("math").prod(fanout)), fanout=fanout, level=TOPO.span_level(fanout))


def test_job_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="at least 2"):
        Job(8, SEQ, settings=RunSettings(cp_comm_type="a2a+p2p"))
    with pytest.raises(ConfigError, match="not of p2p"):
        Job(8, SEQ, settings=RunSettings(cp_a2a_size=4))
    with pytest.raises(ConfigError, match="not one of p2p, a2a, allgather, a2a\\+p2p"):
        Job(8, SEQ, settings=RunSettings(cp_comm_type="ring"))
    assert Job(8, SEQ, settings=RunSettings(cp_comm_type="a2a")).settings.cp_comm_type is CpCommType.A2A


def test_all_to_alls_need_heads_divisible_by_their_group() -> None:
    """Llama 3 8B has 32 query and 8 key/value heads: Ulysses runs at cp 8, not 16 (Transformer Engine
    asserts the heads divisible); a2a+p2p needs its group to divide the heads and cp."""
    a2a = Job(8, SEQ, settings=RunSettings(cp_comm_type="a2a"))
    assert cp_exchange_conflict(a2a.settings, 8, 32, 8) is None
    assert "8 key/value heads over 16" in str(cp_exchange_conflict(a2a.settings, 16, 32, 8))
    hybrid = Job(8, SEQ, settings=RunSettings(cp_comm_type="a2a+p2p", cp_a2a_size=8))
    assert cp_exchange_conflict(hybrid.settings, 32, 32, 8) is None
    assert cp_exchange_conflict(hybrid.settings, 12, 32, 8) is not None  # 8 does not divide 12
    assert cp_exchange_conflict(hybrid.settings, 8, 32, 8) is not None  # the ring needs 2 groups or more
    assert cp_exchange_conflict(Job(8, SEQ, settings=RunSettings(cp_comm_type="allgather")).settings, 64, 32, 8) is None
    with pytest.raises(ConfigError, match="key/value heads"):
        api.evaluate(LLAMA, CLUSTER, ParallelDims(tp=1, pp=1, dp=1, cp=16), _job("a2a"))


def test_split_fanout_takes_the_lowest_levels_first() -> None:
    assert comm.split_fanout((8, 4, 1), 4) == ((4, 1, 1), (2, 4, 1))
    assert comm.split_fanout((8, 4, 1), 16) == ((8, 2, 1), (1, 2, 1))
    assert comm.split_fanout((8, 4, 1), 32) == ((8, 4, 1), (1, 1, 1))


def test_each_exchange_moves_what_its_algorithm_moves() -> None:
    shard = Shard(tp=1, cp=32, seq_len=SEQ)
    cp = _cp_group((8, 4, 1))
    kv = 2 * shard.tokens * 2 * 1024  # bf16 K and V of this rank's tokens (8 kv heads x 128)
    q = 2 * shard.tokens * 4096
    ulysses = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(CpCommType.A2A), 0.0)
    expected = sum(coll.all_to_all(TOPO, cp.fanout, b) for b in (q, kv / 2, kv / 2, q))
    assert ulysses == pytest.approx((expected, expected))
    gather_f, gather_b = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(CpCommType.ALLGATHER), 0.0)
    assert gather_f == pytest.approx(coll.all_gather(TOPO, cp.fanout, 32 * kv))
    assert gather_b == pytest.approx(gather_f + coll.reduce_scatter(TOPO, cp.fanout, 32 * kv))
    ring_f, ring_b = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(), 0.0)
    assert ring_f == pytest.approx(31 * coll.send_recv(TOPO, 1, kv)) and ring_b == pytest.approx(2 * ring_f)
    hidden = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(), attention_forward_s=1.0)
    assert hidden == (0.0, 0.0)  # the ring hides under a long enough attention; the all-to-alls never do
    hybrid = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(CpCommType.A2A_P2P, 8), 1.0)
    inner = sum(coll.all_to_all(TOPO, (8, 1, 1), b) for b in (q, kv / 2, kv / 2, q))
    assert hybrid == pytest.approx((inner, inner))


def test_ulysses_layout_copies_overlap_the_next_all_to_all() -> None:
    """Each traded tensor is copied three times (read and written) around its all-to-all; Transformer
    Engine runs a tensor's copies while the next one's all-to-all is in flight: each tensor costs the
    longer of the two, plus one tensor's copies to fill and drain the pipeline."""
    shard = Shard(tp=1, cp=8, seq_len=SEQ)
    cp = _cp_group((8, 1, 1))
    sizes = [2 * shard.tokens * c for c in (4096, 1024, 1024, 4096)]  # Q, K, V, output (bf16)
    slow = 1e-9  # a copy far slower than NVLink's all-to-all
    exposed, _ = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(CpCommType.A2A, 1, slow), 0.0)
    copies = [2 * comm.A2A_LAYOUT_COPIES * n * slow for n in sizes]
    assert exposed == pytest.approx(sum(copies) + max(copies))
    fast = 1e-15
    exposed, _ = comm.context_exchange(TOPO, LLAMA, shard, cp, comm.CpComm(CpCommType.A2A, 1, fast), 0.0)
    assert exposed == pytest.approx(sum(coll.all_to_all(TOPO, cp.fanout, n) for n in sizes), rel=1e-3)


def test_every_exchange_evaluates_and_all_gather_holds_the_whole_sequence() -> None:
    preds = {
        kind: api.evaluate(LLAMA, CLUSTER, ParallelDims(tp=1, pp=1, dp=4, cp=8), _job(kind, a2a))
        for kind, a2a in (("p2p", 1), ("a2a", 1), ("allgather", 1), ("a2a+p2p", 2))
    }
    assert len({p.step_time_s for p in preds.values()}) == 4
    transient = {k: p.stages[0].memory_bytes["transient"] for k, p in preds.items()}
    assert transient["allgather"] - transient["p2p"] == pytest.approx(8 * 2 * (SEQ // 8) * 2 * 1024)


def test_the_planner_never_picks_a_cp_its_exchange_cannot_run() -> None:
    report = api.plan(LLAMA, CLUSTER, _job("a2a"), devices=32)
    for pred in (report.best, *report.runners_up):
        assert 8 % pred.plan.cp == 0


def test_plan_json_and_exports_carry_the_exchange(tmp_path) -> None:
    job = _job("a2a+p2p", 2)
    ev = api.evaluate_full(LLAMA, CLUSTER, ParallelDims(tp=1, pp=1, dp=4, cp=8), job)
    again = Plan.from_dict(json.loads(json.dumps(ev.plan.to_dict())))
    assert (again.job.settings.cp_comm_type, again.job.settings.cp_a2a_size) == (CpCommType.A2A_P2P, 2)
    files, _ = api.export_plan(ev.plan, "megatron", tmp_path / "m")
    script = "\n".join(p.read_text() for p in files)
    assert "--cp-comm-type a2a+p2p" in script and "--hierarchical-context-parallel-sizes 2 4" in script
    files, _ = api.export_plan(ev.plan, "nemo", tmp_path / "b")
    text = "\n".join(p.read_text() for p in files)
    assert 'model.cp_comm_type="a2a+p2p"' in text and "model.hierarchical_context_parallel_sizes=[2,4]" in text
    _, exported = api.export_plan(ev.plan, "torchtitan", tmp_path / "t")
    assert any("no a2a+p2p exchange" in note for note in exported.notes)


def test_cli_takes_the_exchange_and_refuses_an_illegal_one(capsys) -> None:
    from tests.unit.cli_helpers import run_cli

    base = [
        "evaluate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100",
        "--devices",
        "32",
        "--tp",
        "1",
        "--pp",
        "1",
        "--cp",
        "32",
        "--dp",
        "1",
        "--zero",
        "1",
        "--recompute",
        "full",
        "--global-batch-size",
        "4",
        "--seq-len",
        "131072",
        "--json",
    ]
    code, out, _ = run_cli(capsys, base + ["--cp-comm-type", "a2a+p2p", "--cp-a2a-size", "8"])
    assert code == 0 and json.loads(out)["job"]["cp_comm_type"] == "a2a+p2p"
    code, _, err = run_cli(capsys, base + ["--cp-comm-type", "a2a"])
    assert code == 2 and "8 key/value heads over 32 ranks" in err


def test_the_ring_merges_its_partial_results_at_every_step() -> None:
    """Transformer Engine's p2p ring merges each step's partial output into the output (forward: the first
    copied, the others read and added, the output read and written) and adds each step's dQ, dK, dV into
    the accumulated ones (backward): memory-bound, in the activations' dtype; nothing without a ring."""
    from nestplan.cost.compute import ring_merge_time

    spec, acc = api.resolve_model("llama3-8b"), api.resolve_cluster("dgx-h100", 8).accelerator
    shard = Shard(cp=8, seq_len=65536)
    T, B = 65536 // 8, 2
    out, kv = T * 4096, 2 * T * 1024  # 32 query heads of 128; 8 key/value heads of 128, K and V
    forward, backward = ring_merge_time(acc, spec, 0, shard, 8)
    assert forward == pytest.approx(acc.memory_time(B * out * (2 + 3 * 7)))
    assert backward == pytest.approx(acc.memory_time(3 * B * (out + kv) * 7))
    assert ring_merge_time(acc, spec, 0, shard, 1) == (0.0, 0.0)


def test_ulysses_beats_the_ring_at_cp_8_inside_a_node() -> None:
    """The published direction (issue 16: on one 8-GPU node at 64k tokens Ulysses stays near cp = 1 where
    the ring is slower): with the ring's merges costed, the all-to-alls over NVLink cost less."""
    job = Job(global_batch_size=8, seq_len=65536)
    dims = ParallelDims(tp=1, cp=8, dp=1, recompute=Recompute.FULL)
    cluster = api.resolve_cluster("dgx-h100", 8)
    ring = evaluate_plan(api.resolve_model("llama3-8b"), cluster, dims, job)
    ulysses = evaluate_plan(
        api.resolve_model("llama3-8b"), cluster, dims, job.with_settings(cp_comm_type=CpCommType.A2A)
    )
    assert ulysses.step_time_s < ring.step_time_s
