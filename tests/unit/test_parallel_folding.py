"""MoE parallel folding (expert tensor parallelism etp below tp, Megatron-Core's etp-ep-edp grid; Liu et
al. 2025, arXiv 2504.14960) and Megatron-Core's 1F1B all-to-all overlap (--moe-comm-overlap): degrees,
groups, costs, memory, search and exports."""

from __future__ import annotations

import json

import pytest

from nestplan import api
from nestplan.cost import comm
from nestplan.errors import ConfigError
from nestplan.job import Job
from nestplan.model.layers import Shard, block_gemms, block_params_per_device
from nestplan.plan import Plan
from nestplan.search.space import SearchSpace
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.legality import check_against_model
from nestplan.strategy.placement import place
from nestplan.settings import RunSettings

QWEN3 = api.resolve_model("qwen3-235b-a22b")
GROK = api.resolve_model("grok-1")
H100 = api.resolve_cluster("dgx-h100")


# ---------------------------------------------------------------- degrees
def test_etp_divides_tp_and_needs_sequence_parallelism() -> None:
    with pytest.raises(ConfigError, match="etp 3 must divide tp 4") as err:
        ParallelDims(tp=4, sp=True, etp=3)
    assert err.value.field == "etp"
    with pytest.raises(ConfigError, match="needs sequence parallelism") as err:
        ParallelDims(tp=4, etp=1)
    assert err.value.field == "sp"
    assert ParallelDims(tp=4, sp=True, etp=4) == ParallelDims(tp=4, sp=True)  # etp = tp is the default, one value


def test_folded_expert_parallelism_must_divide_the_experts() -> None:
    """Mixtral's 8 experts: ep 4 x tp 4 / etp 1 = 16 ranks cannot each hold different experts."""
    mixtral = api.resolve_model("mixtral-8x7b")
    with pytest.raises(ConfigError, match=r"expert parallelism 16 \(ep 4 x tp 4 / etp 1\) does not divide"):
        check_against_model(ParallelDims(tp=4, sp=True, ep=4, etp=1), mixtral, 4096)
    with pytest.raises(ConfigError, match="etp 1 needs a mixture-of-experts model") as err:
        check_against_model(ParallelDims(tp=2, sp=True, etp=1), api.resolve_model("llama3-8b"), 4096)
    assert err.value.field == "etp"


def test_cli_refuses_an_etp_that_does_not_divide_tp_in_one_line(capsys) -> None:
    from cli_helpers import run_cli

    code, out, err = run_cli(
        capsys,
        [
            "evaluate",
            "--model",
            "grok-1",
            "--cluster",
            "dgx-h100",
            "--devices",
            "64",
            "--tp",
            "4",
            "--sp",
            "--etp",
            "3",
            "--ep",
            "2",
            "--dp",
            "8",
            "--global-batch-size",
            "256",
        ],
    )
    assert code == 2 and out == "" and err.count("\n") == 1 and "etp 3 must divide tp 4" in err


# ---------------------------------------------------------------- groups
def test_folded_expert_group_takes_the_tp_ranks_inside_the_node() -> None:
    """tp 4, etp 1, ep 2 on DGX H100 nodes of 8: the 8 ranks of a node hold different experts (the
    all-to-all stays on NVLink); etp 2: 4 of them, each expert split over 2 consecutive ranks."""
    folded = place(ParallelDims(tp=4, sp=True, ep=2, dp=8, etp=1), H100.topology)
    assert folded.groups["expert"].size == 8 and folded.groups["expert"].level == 0
    assert folded.groups["etp"].size == 1
    half = place(ParallelDims(tp=4, sp=True, ep=2, dp=8, etp=2), H100.topology)
    assert (half.groups["expert"].size, half.groups["etp"].size) == (4, 2)
    plain = place(ParallelDims(tp=4, sp=True, ep=2, dp=8), H100.topology)
    assert plain.groups["expert"] == plain.groups["ep"] and plain.groups["etp"] == plain.groups["tp"]


# ---------------------------------------------------------------- cost
def test_folding_keeps_each_device_s_expert_weights_and_widens_its_experts() -> None:
    """Same grid, etp 1 instead of 4: a device holds the same expert bytes (1 / (tp ep) of them), as
    4 times fewer experts of the whole FFN width, over as many token copies each."""
    unfolded, folded = Shard(tp=4, sp=True, ep=2, seq_len=4096), Shard(tp=4, sp=True, ep=2, seq_len=4096, etp=1)
    assert block_params_per_device(QWEN3, 0, folded) == block_params_per_device(QWEN3, 0, unfolded)
    experts_u, experts_f = block_gemms(QWEN3, 0, unfolded)[-2], block_gemms(QWEN3, 0, folded)[-2]
    assert experts_f.count == experts_u.count / 4 and experts_f.n == 4 * experts_u.n and experts_f.m == experts_u.m


def test_etp_1_moves_no_routed_tokens_over_tp() -> None:
    """The routed copies' all-gather / reduce-scatter runs over the etp group: none at etp 1; the
    dispatch all-to-all then spans the ep x tp / etp ranks."""
    spans = place(ParallelDims(tp=4, sp=True, ep=2, dp=8, etp=1), H100.topology).groups
    shard = Shard(tp=4, sp=True, ep=2, seq_len=4096, etp=1)
    unfolded = Shard(tp=4, sp=True, ep=2, seq_len=4096)
    plain = place(ParallelDims(tp=4, sp=True, ep=2, dp=8), H100.topology).groups
    mixtral = api.resolve_model("mixtral-8x7b")
    attention_only = comm.tp_collectives(H100.topology, spans["tp"], shard, mixtral.hidden_size, 1)
    folded = comm.block_comm(H100.topology, mixtral, 0, shard, dict(spans), 0.0)
    assert folded.tp_forward == pytest.approx(attention_only)
    assert comm.block_comm(H100.topology, mixtral, 0, unfolded, dict(plain), 0.0).tp_forward > 2 * attention_only
    assert folded.ep_forward > 0


def test_grok_1_on_512_h100_with_attention_tp_4_and_expert_tp_1() -> None:
    """The issue's case: NVIDIA's Grok-1 recipe on 512 H100 (tp 4, cp 2, pp 8 x v 8, Megatron's ep 8)
    with expert-TP 1: ep 8 = tp 4 x 2 data-parallel ranks."""
    dims = ParallelDims(tp=4, sp=True, cp=2, pp=8, virtual_stages=8, schedule="interleaved", ep=2, dp=4, etp=1, zero=1)
    job = Job(global_batch_size=1024, seq_len=8192, settings=RunSettings(grad_dtype="bf16"))
    pred = api.evaluate_full(GROK, H100, dims, job).prediction
    assert dims.expert_parallel == 8 and pred.fits
    assert pred.breakdown_s["ep_comm"] > 0


def test_qwen3_235b_with_ep_32_over_tp_2_and_dp_16() -> None:
    dims = ParallelDims(
        tp=2,
        sp=True,
        ep=16,
        pp=8,
        etp=1,
        zero=1,
        recompute="selective",
        layers_per_stage=(12, 12, 12, 12, 12, 12, 11, 11),
    )
    evaluation = api.evaluate_full(QWEN3, H100, dims, Job(global_batch_size=1024, seq_len=4096), devices=256)
    assert dims.expert_parallel == 32 and evaluation.prediction.fits
    assert "ep 16 (etp 1: experts over 32 ranks)" in _plan_line(evaluation)


def _plan_line(evaluation) -> str:
    from io import StringIO

    from rich.console import Console

    from nestplan.report.text import render_plan

    buffer = StringIO()
    render_plan(Console(file=buffer, width=400), evaluation.plan)
    return buffer.getvalue()


# ---------------------------------------------------------------- search and plan files
def test_the_planner_folds_experts_where_that_is_faster() -> None:
    """Qwen3-235B on 576 GB200 NVL72: the plan folds tp into expert parallelism (etp 1) and keeps the
    expert group inside an NVLink rack; restricted to etp = tp it is slower."""
    report = api.plan(QWEN3, "gb200-nvl72", devices=576, global_batch_size=2048, seq_len=4096, top=0)
    best = report.best
    assert best.plan.etp == 1 and best.placement.groups["expert"].level == 0
    unfolded = api.plan(
        QWEN3, "gb200-nvl72", devices=576, global_batch_size=2048, seq_len=4096, top=0, space=SearchSpace(etp=(None,))
    )
    assert unfolded.best.plan.etp is None and unfolded.best.step_time_s > best.step_time_s


def test_plan_json_round_trips_etp_and_checks_expert_parallel() -> None:
    dims = ParallelDims(tp=4, sp=True, ep=2, dp=8, etp=1, zero=1)
    plan = api.evaluate_full(GROK, H100, dims, Job(global_batch_size=256, seq_len=4096), devices=64).plan
    data = plan.to_dict()
    assert (data["parallel"]["etp"], data["parallel"]["expert_parallel"]) == (1, 8)
    assert Plan.from_dict(json.loads(json.dumps(data))).dims == plan.dims and plan.dims.etp == 1
    data["parallel"]["expert_parallel"] = 4
    with pytest.raises(ConfigError, match="expert_parallel must be ep x tp / etp"):
        Plan.from_dict(data)


def test_exports_name_the_folded_degrees_or_refuse(tmp_path) -> None:
    dims = ParallelDims(tp=4, sp=True, ep=2, dp=8, etp=1, zero=1)
    plan = api.evaluate_full(GROK, H100, dims, Job(global_batch_size=256, seq_len=4096), devices=64).plan
    _, megatron = api.export_plan(plan, "megatron", tmp_path / "m")
    text = (tmp_path / "m" / "launch_megatron.sh").read_text()
    assert "--expert-model-parallel-size 8" in text and "--expert-tensor-parallel-size 1" in text
    with pytest.raises(ConfigError, match="folded over tp"):
        api.export_plan(plan, "deepspeed", tmp_path / "d")


# ---------------------------------------------------------------- the all-to-all overlap
def test_moe_comm_overlap_hides_the_all_to_all_and_holds_one_more_microbatch() -> None:
    """Grok-1 on 512 H100 as NVIDIA's recipe runs it (interleaved): the expert all-to-alls hide under
    the other microbatch's compute; each stage holds one more model chunk of activations."""
    dims = ParallelDims(tp=4, sp=True, cp=2, pp=8, virtual_stages=8, schedule="interleaved", ep=8, zero=1)
    job = Job(global_batch_size=1024, seq_len=8192, settings=RunSettings(grad_dtype="bf16"))
    plain = api.evaluate_full(GROK, H100, dims, job).prediction
    overlapped = api.evaluate_full(GROK, H100, dims, job.with_settings(moe_comm_overlap=True)).prediction
    assert plain.breakdown_s["ep_comm"] > 0 and overlapped.breakdown_s["ep_comm"] < plain.breakdown_s["ep_comm"]
    assert overlapped.step_time_s < plain.step_time_s
    assert overlapped.peak_memory_bytes_per_device > plain.peak_memory_bytes_per_device


@pytest.mark.parametrize(
    "dims,field",
    [
        (ParallelDims(tp=4, sp=True, dp=16), "ep"),  # no expert parallelism
        (ParallelDims(tp=4, sp=True, ep=2, pp=2, dp=4), "schedule"),  # 1F1B with pp > 1
        (ParallelDims(tp=4, sp=True, ep=2, dp=8, recompute="full"), "recompute"),
    ],
)
def test_moe_comm_overlap_is_refused_where_megatron_cannot_run_it(dims, field) -> None:
    job = Job(global_batch_size=256, seq_len=4096, settings=RunSettings(moe_comm_overlap=True))
    with pytest.raises(ConfigError, match="all-to-all overlap") as err:
        api.evaluate_full(GROK, H100, dims, job, devices=64)
    assert err.value.field == field


def test_megatron_export_sets_the_overlap(tmp_path) -> None:
    dims = ParallelDims(tp=4, sp=True, ep=2, dp=8, zero=1)
    job = Job(global_batch_size=256, seq_len=4096, settings=RunSettings(moe_comm_overlap=True))
    plan = api.evaluate_full(GROK, H100, dims, job, devices=64).plan
    api.export_plan(plan, "megatron", tmp_path)
    assert "--overlap-moe-expert-parallel-comm" in (tmp_path / "launch_megatron.sh").read_text()
    assert Plan.from_dict(plan.to_dict()).job.settings.moe_comm_overlap


# ---------------------------------------------------------------- the capacity factor
def test_capacity_factor_pads_the_experts_work_and_traffic(tmp_path) -> None:
    """Capacity factor 1.25, padded: the routed experts' GEMM rows and the all-to-all bytes grow by 1.25,
    the step slows and uses more memory; Megatron-LM gets the flags; out of range is one error."""
    dims = ParallelDims(tp=4, sp=True, ep=2, dp=8, zero=1)
    plain_job = Job(global_batch_size=256, seq_len=4096)
    padded_job = Job(global_batch_size=256, seq_len=4096, settings=RunSettings(moe_capacity_factor=1.25))
    shard, padded = Shard(tp=4, sp=True, ep=2, seq_len=4096), Shard(tp=4, sp=True, ep=2, seq_len=4096, capacity=1.25)
    assert block_gemms(GROK, 0, padded)[-1].m == pytest.approx(1.25 * block_gemms(GROK, 0, shard)[-1].m)
    plain = api.evaluate_full(GROK, H100, dims, plain_job, devices=64)
    slow = api.evaluate_full(GROK, H100, dims, padded_job, devices=64)
    assert slow.prediction.step_time_s > plain.prediction.step_time_s
    assert slow.prediction.breakdown_s["ep_comm"] > plain.prediction.breakdown_s["ep_comm"]
    assert slow.prediction.peak_memory_bytes_per_device > plain.prediction.peak_memory_bytes_per_device
    api.export_plan(slow.plan, "megatron", tmp_path)
    script = (tmp_path / "launch_megatron.sh").read_text()
    assert "--moe-expert-capacity-factor 1.25" in script and "--moe-pad-expert-input-to-capacity" in script
    assert Plan.from_dict(slow.plan.to_dict()).job.settings.moe_capacity_factor == 1.25
    with pytest.raises(ConfigError, match="moe capacity factor") as err:
        Job(global_batch_size=256, seq_len=4096, settings=RunSettings(moe_capacity_factor=0.1))
    assert err.value.field == "moe_capacity_factor"


# ---------------------------------------------------------------- node-limited routing with DeepEP
def test_deepep_sends_a_token_once_per_node_node_limited_routing_bounds_them() -> None:
    """DeepSeek-V3 (256 experts in 8 groups, top-8 within 4 groups; arXiv 2412.19437 section 2.1.2:
    "each token will be sent to at most M nodes", M = 4) with ep 64 over 8 DGX H100 nodes: a token
    reaches at most 4 nodes, so the all-to-all's traffic between nodes halves against every copy sent;
    inside one node nothing changes."""
    v3 = api.resolve_model("deepseek-v3")
    assert (v3.routing_groups, v3.routing_groups_per_token, v3.experts_per_token) == (8, 4, 8)
    topo = H100.topology
    assert comm.remote_units(v3, topo, (8, 8)) == 4 and comm.remote_units(v3, topo, (8, 1)) == 1
    assert comm.remote_units(api.resolve_model("mixtral-8x7b"), topo, (8, 4)) == 2  # top-2, no groups
    shard = Shard(tp=1, ep=64, seq_len=4096)
    every = comm.expert_all_to_alls(H100.topology, v3, 10, shard, _span(64))
    per_node = comm.expert_all_to_alls(H100.topology, v3, 10, shard, _span(64), per_node=True)
    assert per_node[0] < 0.6 * every[0]
    inside = comm.expert_all_to_alls(H100.topology, v3, 10, shard, _span(8), per_node=True)
    assert inside == comm.expert_all_to_alls(H100.topology, v3, 10, shard, _span(8))


def _span(size: int):
    from nestplan.strategy.placement import GroupSpan

    fanout = (min(size, 8), max(1, size // 8))
    return GroupSpan(size=size, fanout=fanout, level=int(size > 8))


def test_deepep_is_exported_as_megatron_s_flex_dispatcher_and_refuses_padding(tmp_path) -> None:
    dims = ParallelDims(tp=4, sp=True, ep=2, dp=8, zero=1)
    plan = api.evaluate_full(
        GROK,
        H100,
        dims,
        Job(global_batch_size=256, seq_len=4096, settings=RunSettings(moe_dispatcher="deepep")),
        devices=64,
    ).plan
    api.export_plan(plan, "megatron", tmp_path)
    assert "--moe-token-dispatcher-type flex" in (tmp_path / "launch_megatron.sh").read_text()
    assert Plan.from_dict(plan.to_dict()).job.settings.moe_dispatcher.value == "deepep"
    with pytest.raises(ConfigError, match="dropless") as err:
        Job(global_batch_size=256, seq_len=4096, settings=RunSettings(moe_dispatcher="deepep", moe_capacity_factor=1.0))
    assert err.value.field == "moe_capacity_factor"
