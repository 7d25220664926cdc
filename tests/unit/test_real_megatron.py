"""Megatron-LM's own code on nestplan's Megatron-LM exports (issue 18): the exported command line, as
bash splits it out of ``launch_megatron.sh``, through Megatron-LM's ``parse_args`` and ``validate_args``,
``core_transformer_config_from_args`` (the TransformerConfig a run builds), its number-of-microbatches
calculator, its pipeline split (``get_num_layers_to_build``: the layout parser or the first/last stage
layer counts) and ``RankGenerator`` with the sizes and order string ``initialize_model_parallel`` gets
(megatron/training/initialize.py); the parsed meaning must equal the plan and the groups Megatron
builds, placed by the launch script's node order, must be the groups nestplan costed.

Megatron-LM here is megatron-core 0.19.2's wheel from PyPI, which ships ``megatron/training``. It
declares Python >= 3.12 and its wheel is tagged cp312, so it is unpacked, not installed (``pip install
--no-deps --python-version 3.12 --only-binary=:all: --target DIR megatron-core==0.19.2``, DIR on
PYTHONPATH); its Python code runs on 3.11 with one stand-in below. ``triton`` (imported by megatron.core
at import time) is installed from PyPI. Without them every test here skips; the flag-table tests in
test_export.py stay as the fast check.

Stand-ins, for what needs a GPU, a process group or Python 3.12:
- ``typing.override`` (new in Python 3.12, a decorator that only marks a method) is
  ``typing_extensions.override`` where Python lacks it;
- torchrun is a shell function that records the command line and environment the script gives it;
  ``WORLD_SIZE``/``RANK`` are what torchrun would set (nnodes x nproc-per-node from that line, rank 0);
- the GPU's compute capability (``get_device_arch_version``, ``torch.cuda.get_device_capability``) is
  the plan accelerator's (H100 9.0, A100 8.0, B200 10.0: NVIDIA's CUDA GPUs compute capability table);
- Transformer Engine (not installed: it needs CUDA): its version, where Megatron asks for one
  (``is_te_min_version``/``get_te_version`` in arguments.py and transformer_config.py), answers as TE 2.9
  would, and its fused RoPE kernel (``rope_utils.fused_apply_rotary_pos_emb``, whose presence
  TransformerConfig checks for the default --apply-rope-fusion) is a function never called here;
- the process groups: none is made. ``RankGenerator`` is called with the sizes and order
  ``initialize_model_parallel`` passes it, and the pipeline split reads the pipeline rank and virtual
  pipeline size that module's setters (``set_pipeline_model_parallel_rank``, ...) would hold on that rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import typing_extensions
from packaging.version import Version as PkgVersion
from planned_cases import CASES, planned_plans
from planned_cases import evaluated as _evaluated
from planned_cases import issue_plans as planned_issue_plans

from nestplan import api
from nestplan.export import megatron, rank_order
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.settings import OptimizerState
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule
from nestplan.strategy.placement import AXES, expert_rank_groups, rank_grid

if not hasattr(typing, "override"):  # stand-in: Python 3.12's typing.override (see the docstring)
    typing.override = typing_extensions.override

arguments = pytest.importorskip(
    "megatron.training.arguments",
    reason="megatron-core 0.19.2 (megatron/training) unpacked on PYTHONPATH, and triton, are needed: see .ci/run",
)
import torch  # noqa: E402  (megatron-core's own dependency)
from megatron.core import num_microbatches_calculator, package_info, parallel_state  # noqa: E402
from megatron.core.models.common.embeddings import rope_utils  # noqa: E402
from megatron.core.transformer import transformer_config  # noqa: E402
from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402

MEGATRON_CORE = "0.19.2"  # the version these tests run and the export's PIN names
COMPUTE_CAPABILITY = {"h100": (9, 0), "h200": (9, 0), "a100": (8, 0), "b200": (10, 0)}  # NVIDIA's CUDA GPUs table
TE_VERSION_STOOD_IN = "2.9.0"
TORCHRUN_STUB = (
    '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n'
    'printf "%s" "${CUDA_DEVICE_MAX_CONNECTIONS-}" > "$ARGV_OUT.connections"\n'
)


@pytest.fixture(scope="module")
def issue_plans() -> dict[str, Plan]:
    """The issue's three plans (planned_cases.issue_plans)."""
    return planned_issue_plans()


# ---------------------------------------------------------------- the exported launch, run by bash
class Launch:
    """What bash hands torchrun on each node: Megatron's argv, the torchrun options, the environment."""

    def __init__(self, plan: Plan, folder: Path) -> None:
        self.plan = plan
        self.export = megatron.export(ExportInput(plan, "test"))
        self.export.write(folder)
        self.folder = folder
        stub = folder / "bin"
        stub.mkdir()
        (stub / "torchrun").write_text(TORCHRUN_STUB)
        (stub / "torchrun").chmod(0o755)
        self.torchrun, self.argv, self.connections = self.run_on_node(0)

    def run_on_node(self, node: int) -> tuple[dict[str, str], list[str], str]:
        """torchrun's options, Megatron's argv (script first) and CUDA_DEVICE_MAX_CONNECTIONS on the
        ``node``-th node of the allocation (SLURM_NODEID), the script run by bash as srun would."""
        out = self.folder / f"argv{node}"
        env = {"PATH": f"{self.folder / 'bin'}:{os.environ['PATH']}", "ARGV_OUT": str(out), "SLURM_NODEID": str(node)}
        subprocess.run(["bash", str(self.folder / "launch_megatron.sh")], env=env, check=True, capture_output=True)
        words = [w.decode() for w in out.read_bytes().split(b"\0")[:-1]]
        script = next(i for i, w in enumerate(words) if w.endswith(".py"))
        options = dict(zip(words[:script:2], words[1:script:2]))
        return options, words[script:], Path(f"{out}.connections").read_text()

    @property
    def world_size(self) -> int:
        return int(self.torchrun["--nnodes"]) * int(self.torchrun["--nproc-per-node"])

    def node_ranks(self) -> list[int]:
        """The torchrun node rank each node of the allocation (in network order) starts with."""
        nodes = int(self.torchrun["--nnodes"])
        return [int(self.run_on_node(k)[0]["--node-rank"]) for k in range(nodes)]


def _capability(plan: Plan) -> tuple[int, int]:
    name = plan.cluster.accelerator.name
    return next(cc for key, cc in COMPUTE_CAPABILITY.items() if name.startswith(key))


def megatron_args(launch: Launch, monkeypatch):
    """Megatron-LM's parse_args + validate_args on the exported command line (stand-ins: see the docstring)."""
    return parsed_and_validated(launch.plan, launch.argv, launch.world_size, launch.connections, monkeypatch)


def parsed_and_validated(plan: Plan, argv: list[str], world_size: int, connections: str, monkeypatch):
    """Megatron-LM's parse_args + validate_args on ``argv`` (script first) in a world of ``world_size``."""
    capability = _capability(plan)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("RANK", "0")
    if connections:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections)
    else:
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: capability[0])
    monkeypatch.setattr(arguments.torch.cuda, "get_device_capability", lambda *a, **k: capability)
    stand_in_transformer_engine(monkeypatch)
    args = arguments.parse_args()
    arguments.validate_args(args)
    return args


def stand_in_transformer_engine(monkeypatch) -> None:
    """Transformer Engine's version and its fused RoPE kernel, as Megatron's checks see them."""
    version = PkgVersion(TE_VERSION_STOOD_IN)

    def at_least(wanted: str, check_equality: bool = True) -> bool:
        return version >= PkgVersion(wanted) if check_equality else version > PkgVersion(wanted)

    def fused_rope_stand_in(*args, **kwargs):
        raise AssertionError("Transformer Engine's fused RoPE is a stand-in: nothing here runs the model")

    for module in (arguments, transformer_config):
        monkeypatch.setattr(module, "is_te_min_version", at_least)
    monkeypatch.setattr(transformer_config, "get_te_version", lambda: version)
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", fused_rope_stand_in)


# ---------------------------------------------------------------- what Megatron parsed, against the plan
def check_degrees_and_batch(args, plan: Plan) -> None:
    d, job = plan.dims, plan.job
    assert (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
        args.expert_model_parallel_size,
    ) == (d.tp, d.pp, d.cp, d.expert_parallel)
    assert args.data_parallel_size == d.dp * d.ep  # Megatron's data parallelism holds the expert axis
    assert args.expert_tensor_parallel_size == d.expert_tp  # folded: etp below tp, the rest in expert parallelism
    assert args.sequence_parallel == d.sp_active
    assert (args.micro_batch_size, args.global_batch_size) == (d.micro_batch_size, job.global_batch_size)
    assert (args.virtual_pipeline_model_parallel_size or 1) == d.virtual_stages
    assert args.seq_length == job.seq_len
    assert _microbatches(args) == plan.num_microbatches


def _microbatches(args) -> int:
    """Megatron's own count of microbatches per step (its calculator, as a run initializes it)."""
    num_microbatches_calculator.init_num_microbatches_calculator(
        0, None, args.global_batch_size, args.micro_batch_size, args.data_parallel_size
    )
    try:
        return num_microbatches_calculator.get_num_microbatches()
    finally:
        num_microbatches_calculator.unset_num_microbatches_calculator()


def check_model_and_training(args, config, plan: Plan) -> None:
    m, d, job = plan.model, plan.dims, plan.job
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (
        m.num_layers,
        m.hidden_size,
        m.num_heads,
    )
    assert config.ffn_hidden_size == m.ffn_hidden_size
    assert (config.num_query_groups or m.num_heads) == m.num_kv_heads
    if m.is_mla:  # MLATransformerConfig: the latents' ranks, the query/key head's nope and rope parts, the value head
        assert (
            config.q_lora_rank or 0,
            config.kv_lora_rank,
            config.qk_head_dim + config.qk_pos_emb_head_dim,
            config.qk_pos_emb_head_dim,
            config.v_head_dim,
        ) == (m.q_lora_rank, m.kv_lora_rank, m.head_dim, m.qk_rope_head_dim, m.value_head_dim)
    else:
        assert config.kv_channels == m.head_dim
    assert (
        config.tensor_model_parallel_size,
        config.pipeline_model_parallel_size,
        config.context_parallel_size,
        config.sequence_parallel,
    ) == (d.tp, d.pp, d.cp, d.sp_active)
    assert (config.num_moe_experts or 0) == (m.num_experts if m.is_moe else 0)
    if m.is_moe:
        assert (config.moe_router_topk, config.expert_model_parallel_size) == (m.experts_per_token, d.expert_parallel)
        sigmoid = m.router_bias and not m.linear_bias
        assert config.moe_router_score_function == ("sigmoid" if sigmoid else "softmax")
        assert config.moe_router_pre_softmax == (m.router_scores_all_experts and not sigmoid)
        assert config.moe_token_dispatcher_type == (
            "flex" if plan.job.settings.moe_dispatcher.value == "deepep" else "alltoall"
        )
    expected_recompute = {Recompute.NONE: None, Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}
    assert config.recompute_granularity == expected_recompute[d.recompute]
    assert (config.bf16, config.fp16) == (job.dtype == "bf16", job.dtype == "fp16")
    assert config.fp8 == ("hybrid" if job.settings.fp8_recipe is not None else None)
    if job.settings.fp8_recipe is not None:
        assert config.fp8_recipe == job.settings.fp8_recipe.value
    assert args.fp8_param_gather == job.settings.fp8_params
    assert config.tp_comm_overlap == (job.settings.tp_comm_overlap and d.sp_active)
    assert args.overlap_grad_reduce == job.settings.overlap_grad_reduce
    check_model_shape(args, config, plan)
    assert args.use_distributed_optimizer == (int(d.zero) >= 1)  # Megatron-FSDP runs it too
    assert args.use_megatron_fsdp == (int(d.zero) >= 2)
    aware = job.settings.optimizer_state is not OptimizerState.FP32 and int(d.zero) >= 1
    assert args.use_precision_aware_optimizer == aware  # store_param_remainders is its default
    moments = torch.bfloat16 if aware and job.settings.optimizer_state is OptimizerState.BF16 else torch.float32
    assert args.exp_avg_dtype == args.exp_avg_sq_dtype == moments
    if int(d.zero) >= 2:
        assert args.data_parallel_sharding_strategy == ("optim_grads" if int(d.zero) == 2 else "optim_grads_params")
    if d.cp > 1:
        assert config.cp_comm_type == job.settings.cp_comm_type.value


def check_model_shape(args, config, plan: Plan) -> None:
    """The model's form beyond its sizes: MLP, norm, biases, embeddings, positions, vocabulary, sequence."""
    m = plan.model
    assert config.gated_linear_unit == m.gated_mlp
    assert config.normalization == ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    assert config.add_bias_linear == m.linear_bias
    assert args.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert args.position_embedding_type == ("learned_absolute" if m.learned_position_embeddings else "rope")
    assert args.vocab_size == m.vocab_size
    assert args.max_position_embeddings >= plan.job.seq_len
    if m.is_moe:
        layer_is_moe = config.moe_layer_freq
        if isinstance(layer_is_moe, int):
            layer_is_moe = [int(i % layer_is_moe == 0) for i in range(m.num_layers)]
        assert layer_is_moe == [int(m.is_moe_layer(i)) for i in range(m.num_layers)]


def stage_layers(args, config, plan: Plan) -> list[int]:
    """Decoder layers per (virtual) stage in model order, as Megatron builds them on each pipeline rank."""
    d = plan.dims
    chunks = args.virtual_pipeline_model_parallel_size
    parallel_state.set_virtual_pipeline_model_parallel_world_size(chunks)
    try:
        counts = []
        for chunk in range(chunks or 1):
            for rank in range(d.pp):
                parallel_state.set_pipeline_model_parallel_rank(rank)
                counts.append(get_num_layers_to_build(config, vp_stage=chunk if chunks else None, pp_rank=rank))
        return counts
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
        parallel_state.set_pipeline_model_parallel_rank(None)


def check_schedule_and_split(args, config, launch: Launch) -> None:
    """Megatron runs the costed schedule, 1F1B or interleaved 1F1B with virtual stages (an export of any other
    is refused: test_export_schedules.py), every stage keeping its costed layers."""
    plan = launch.plan
    d = run = plan.dims
    layers = plan.model.num_layers
    assert (args.virtual_pipeline_model_parallel_size is not None) == (run.schedule is Schedule.INTERLEAVED)
    assert run.schedule in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    chunks = stage_layers(args, config, plan)
    assert chunks == list(run.virtual_stage_layers(layers))
    assert [sum(chunks[s :: d.pp]) for s in range(d.pp)] == list(d.stage_layers(layers))


# ---------------------------------------------------------------- rank groups
def megatron_groups(args, world: int) -> dict[str, set[frozenset[int]]]:
    """The dense groups Megatron-core builds (its RankGenerator with ep = 1, as initialize_model_parallel
    builds the decoder's), and the expert-parallel groups of its expert generator (cp folded away)."""
    order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"
    tp, pp, cp, ep = (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
        args.expert_model_parallel_size,
    )
    dense = parallel_state.RankGenerator(tp=tp, ep=1, dp=args.data_parallel_size, pp=pp, cp=cp, order=order)
    etp = args.expert_tensor_parallel_size
    expert = parallel_state.RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    groups = {axis: {frozenset(g) for g in dense.get_ranks(axis)} for axis in ("tp", "cp", "dp", "pp")}
    groups["ep"] = {frozenset(g) for g in expert.get_ranks("ep")}
    return groups


def costed_groups(plan: Plan) -> dict[str, set[frozenset[int]]]:
    """The groups nestplan costed: ranks laid on the devices in the plan's axis order (device = rank)."""
    grid = rank_grid(plan.dims, plan.axis_order)
    keys = {"tp": ("tp",), "cp": ("cp",), "dp": ("ep", "dp"), "pp": ("pp",)}
    groups = {key: _along(grid, axes) for key, axes in keys.items()}
    # the experts' group: the ep ranks, each with the tp / etp ranks of its tp group that fold into it
    experts = expert_rank_groups(grid, plan.dims.expert_tp)["expert"]
    groups["ep"] = {frozenset(int(r) for r in row) for row in experts}
    return groups


def _along(grid: np.ndarray, axes: tuple[str, ...]) -> set[frozenset[int]]:
    along = [AXES.index(a) for a in axes]
    rest = [i for i in range(grid.ndim) if i not in along]
    size = int(np.prod([grid.shape[i] for i in along]))
    return {frozenset(int(r) for r in row) for row in np.transpose(grid, rest + along).reshape(-1, size)}


def placed(groups: dict[str, set[frozenset[int]]], node_ranks: list[int], per_node: int) -> dict:
    """Megatron's rank groups as sets of devices: torchrun's node rank n runs on the allocation's node
    that the launch script gives node rank n, local rank l on its l-th device."""
    node_of = {rank: node for node, rank in enumerate(node_ranks)}

    def device(rank: int) -> int:
        return node_of[rank // per_node] * per_node + rank % per_node

    return {key: {frozenset(device(r) for r in g) for g in gs} for key, gs in groups.items()}


def check_groups(args, launch: Launch) -> None:
    plan = launch.plan
    per_node = int(launch.torchrun["--nproc-per-node"])
    ours = placed(megatron_groups(args, launch.world_size), launch.node_ranks(), per_node)
    costed = costed_groups(plan)
    for axis in ("tp", "cp", "dp", "pp"):
        assert ours[axis] == costed[axis], axis
    if plan.dims.cp == 1:
        assert ours["ep"] == costed["ep"]
    elif ours["ep"] != costed["ep"]:  # Megatron's expert grid folds cp into ep: said in the export's notes
        assert any("expert-parallel group" in n for n in launch.export.notes)


# ---------------------------------------------------------------- the tests
def check_export(plan: Plan, tmp_path: Path, monkeypatch) -> None:
    launch = Launch(plan, tmp_path)
    args = megatron_args(launch, monkeypatch)
    check_degrees_and_batch(args, plan)
    config = core_transformer_config_from_args(args)
    check_model_and_training(args, config, plan)
    check_schedule_and_split(args, config, launch)
    check_groups(args, launch)


def test_the_megatron_validated_is_the_one_the_export_names() -> None:
    assert package_info.__version__ == MEGATRON_CORE
    assert f"megatron-core {MEGATRON_CORE}" in megatron.PIN


@pytest.mark.parametrize("name", ["llama3-70b-256", "mixtral-8x7b-128", "llama3.1-405b-2048"])
def test_megatron_accepts_the_issue_plans_as_costed(issue_plans, name, tmp_path, monkeypatch) -> None:
    check_export(issue_plans[name], tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_megatron_accepts_every_planned_case_as_costed(case, tmp_path, monkeypatch) -> None:
    check_export(planned_plans("megatron")[case], tmp_path, monkeypatch)


# ---------------------------------------------------------------- rank order a launcher follows (issue 18, item 3)
def _replica_major(model: str, devices: int, dims: ParallelDims) -> Plan:
    job = Job(global_batch_size=1024, seq_len=4096)
    return api.evaluate_full(
        model, "h100-spine-leaf", dims, job, devices=devices, axis_order=("tp", "cp", "ep", "pp", "dp")
    ).plan


def test_replica_major_dense_plan_runs_with_the_tp_pp_dp_mapping(tmp_path, monkeypatch) -> None:
    plan = _replica_major("llama3-70b", 128, ParallelDims(tp=4, sp=True, pp=4, dp=8, zero=1))
    launch = Launch(plan, tmp_path)
    assert "--use-tp-pp-dp-mapping" in launch.argv
    assert len(launch.export.files) == 1  # the flag expresses the order: no node order needed
    check_export(plan, tmp_path / "again", monkeypatch)


def test_order_no_flag_expresses_runs_as_costed_through_the_node_order(tmp_path, monkeypatch) -> None:
    """Megatron-core cannot map tp-pp-dp with experts, pp > 1 and ep != cp: the launch script gives
    the nodes the torchrun node ranks that put its stage-major ranks on the costed replica-major devices."""
    plan = _replica_major("mixtral-8x7b", 128, ParallelDims(tp=2, sp=True, ep=4, pp=4, dp=4, zero=1))
    launch = Launch(plan, tmp_path)
    assert "--use-tp-pp-dp-mapping" not in launch.argv
    assert [f.name for f in launch.export.files] == ["launch_megatron.sh", "node_ranks.txt"]
    assert launch.node_ranks() != list(range(16))
    assert not any("RANK LAYOUT DIFFERS" in n for n in launch.export.notes)
    check_export(plan, tmp_path / "again", monkeypatch)


SLURM_STUBS = {
    "scontrol": '#!/usr/bin/env bash\nfor k in $(seq 0 $((NODES - 1))); do echo "node-$k"; done\n',
    "srun": '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$OUT.srun"\ncp "$SLURM_HOSTFILE" "$OUT.hosts"\n',
    "python3": '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$OUT.argv"\necho "$RANK $LOCAL_RANK $WORLD_SIZE" > "$OUT.env"\n',
}


def _slurm(folder: Path, env: dict[str, str]) -> None:
    """Run the export's launch script with SLURM's commands stood in (each records what it was given)."""
    stub = folder / "slurm-bin"
    stub.mkdir(exist_ok=True)
    for name, text in SLURM_STUBS.items():
        (stub / name).write_text(text)
        (stub / name).chmod(0o755)
    path = {"PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(folder / "out"), "NODES": "16"}
    subprocess.run(["bash", str(folder / "launch_megatron.sh")], env=path | env, check=True, capture_output=True)


def test_order_no_node_order_expresses_is_placed_rank_by_rank_by_slurm(tmp_path, monkeypatch) -> None:
    """tp x cp x ep = 2 ranks per stage of a replica: a node's worth of Megatron's stage-major ranks
    was costed on several nodes, so no node order helps. Under sbatch the script starts one SLURM task
    per rank, placed by SLURM_HOSTFILE (srun --distribution=arbitrary): Megatron's groups, built from the
    flags the task runs with, span the nodes nestplan costed. Stand-ins: scontrol, srun and python3 record
    what the script hands them (task 0 of the step is run as srun would run it)."""
    plan = _replica_major("mixtral-8x7b", 128, ParallelDims(tp=1, ep=2, pp=4, dp=16, zero=1))
    export = megatron.export(ExportInput(plan, "test"))
    export.write(tmp_path)
    assert [f.name for f in export.files] == ["launch_megatron.sh", "rank_nodes.txt"]
    assert any("RANK LAYOUT DIFFERS" in n for n in export.notes)  # what torchrun runs outside sbatch
    assert any("srun --distribution=arbitrary" in n for n in export.notes)
    _slurm(tmp_path, {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node-[0-15]"})
    srun = (tmp_path / "out.srun").read_bytes().decode().split("\0")
    assert "--ntasks=128" in srun and "--distribution=arbitrary" in srun
    hosts = [int(h.removeprefix("node-")) for h in (tmp_path / "out.hosts").read_text().split()]
    _slurm(
        tmp_path,
        {
            "SLURM_JOB_ID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NTASKS": "128",
            "SLURM_NODEID": "0",
            "NESTPLAN_RANK_TASKS": "1",
        },
    )  # srun passes it on
    assert (tmp_path / "out.env").read_text().split() == ["0", "0", "128"]
    argv = (tmp_path / "out.argv").read_bytes().decode().split("\0")[:-1]
    args = parsed_and_validated(plan, argv, 128, "", monkeypatch)  # the script sets no connection limit here
    check_degrees_and_batch(args, plan)
    theirs = megatron_groups(args, 128)
    costed = costed_groups(plan)
    for axis in ("tp", "cp", "dp", "pp", "ep"):
        assert _nodes_of(theirs[axis], hosts.__getitem__) == _nodes_of(costed[axis], lambda d: d // 8), axis


def test_rank_placed_plan_run_without_sbatch_is_torchrun_in_megatrons_order(tmp_path) -> None:
    plan = _replica_major("mixtral-8x7b", 128, ParallelDims(tp=1, ep=2, pp=4, dp=16, zero=1))
    launch = Launch(plan, tmp_path)
    assert launch.torchrun["--nnodes"] == "16" and launch.node_ranks() == list(range(16))


def _nodes_of(groups: set[frozenset[int]], node) -> list[tuple[int, ...]]:
    """Each group as the nodes its members run on: what the cost of its collective depends on."""
    return sorted(tuple(sorted(node(r) for r in g)) for g in groups)


def test_node_index_outside_the_allocation_is_refused(tmp_path) -> None:
    plan = _replica_major("mixtral-8x7b", 128, ParallelDims(tp=2, sp=True, ep=4, pp=4, dp=4, zero=1))
    Launch(plan, tmp_path)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "ARGV_OUT": str(tmp_path / "x"), "NODE_INDEX": "16"}
    result = subprocess.run(["bash", str(tmp_path / "launch_megatron.sh")], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "NODE_INDEX 16" in result.stderr


def test_node_rank_file_holds_only_node_ranks_and_only_where_needed() -> None:
    """export.rank_order: comment lines, then one integer per node, a permutation; no file where the
    framework's order is the costed one."""
    plan = _replica_major("mixtral-8x7b", 128, ParallelDims(tp=2, sp=True, ep=4, pp=4, dp=4, zero=1))
    text = rank_order.node_rank_file(plan, "Megatron-LM", ("tp", "cp", "ep", "dp", "pp"), 8)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert sorted(int(line) for line in lines) == list(range(16)) and lines != [str(k) for k in range(16)]
    assert rank_order.node_rank_file(plan, "Megatron-LM", plan.axis_order, 8) is None


# ---------------------------------------------------------------- regressions
def test_bert_runs_megatron_lms_bert_entry_point(tmp_path, monkeypatch) -> None:
    """pretrain_bert.py moved to examples/bert/ in Megatron-LM."""
    plan = _evaluated("bert-large", "dgx-a100", 16, ParallelDims(dp=16), 256, 512)
    assert Launch(plan, tmp_path).argv[0].endswith("/examples/bert/pretrain_bert.py")
    check_export(plan, tmp_path / "again", monkeypatch)


def test_what_a_refused_v_plan_would_run_is_a_plan_megatron_runs(tmp_path, monkeypatch) -> None:
    """Megatron-core has no DualPipeV: the export refuses such a plan and names interleaved 1F1B with two
    chunks per stage, each stage keeping its costed uneven layers (tests/unit/test_export_schedules.py).
    That plan, evaluated and exported, passes Megatron's own checks with the layout it needs."""
    dims = ParallelDims(
        tp=8, sp=True, pp=4, dp=4, zero=1, schedule="dualpipev", virtual_stages=2, layers_per_stage=(16, 22, 22, 20)
    )
    refused = _evaluated("llama3-70b", "dgx-h100", 128, dims, 512, 4096)
    plan = _evaluated("llama3-70b", "dgx-h100", 128, megatron.runs_instead(refused), 512, 4096)
    launch = Launch(plan, tmp_path)
    assert "--pipeline-model-parallel-layout" in launch.argv
    check_export(plan, tmp_path / "again", monkeypatch)


def test_mtp_modules_in_the_layout_pass_megatrons_own_check() -> None:
    """An uneven interleaved split of a model with an MTP module: Megatron-core's layout parser and its
    validate_layer_layout accept the exported --pipeline-model-parallel-layout."""
    import dataclasses

    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    model = dataclasses.replace(api.resolve_model("deepseek-v2-lite"), mtp_layers=1)
    dims = ParallelDims(
        tp=1, ep=8, pp=2, dp=1, zero=1, virtual_stages=2, schedule=Schedule.INTERLEAVED, layers_per_stage=(7, 7, 7, 6)
    )
    plan = api.evaluate_full(model, "dgx-h100", dims, Job(global_batch_size=64, seq_len=4096), devices=16).plan
    layout = PipelineParallelLayerLayout(megatron.layout(plan), dims.pp)
    layout.validate_layer_layout(model.num_layers, model.mtp_layers)
    assert megatron.layout(plan).endswith("mL")


# ---------------------------------------------------------------- Mamba-2 hybrids (Nemotron-H)
def _nemotron_h(dims: ParallelDims, devices: int = 16, model: str = "nemotron-h-8b") -> Plan:
    return _evaluated(model, "dgx-h100", devices, dims, 256, 8192)


class _StageGroup:
    """Stand-in for a pipeline process group: the rank and size torch.distributed would report."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


def hybrid_segments(args, plan: Plan, monkeypatch) -> list[str]:
    """The layer symbols Megatron-core's HybridModel builds on each (virtual) stage, in model order:
    its own select_pipeline_segment on the validated pattern, for each pipeline rank and chunk, with
    stand-ins for the pipeline group's rank and size (torch.distributed.get_rank / get_world_size)
    and for its per-stage logging, which asks the process groups too."""
    from megatron.core.models.hybrid import hybrid_layer_allocation as allocation

    monkeypatch.setattr(allocation.torch.distributed, "get_rank", lambda group: group.rank)
    monkeypatch.setattr(allocation.torch.distributed, "get_world_size", lambda group: group.size)
    monkeypatch.setattr(allocation, "log_on_each_pipeline_stage", lambda *a, **k: None)
    monkeypatch.setattr(allocation, "log_single_rank", lambda *a, **k: None)
    main = allocation.parse_hybrid_pattern(args.hybrid_layer_pattern).main_pattern
    chunks = args.virtual_pipeline_model_parallel_size
    segments = []
    for chunk in range(chunks or 1):
        for rank in range(plan.dims.pp):
            layers, offset = allocation.select_pipeline_segment(
                main,
                _StageGroup(rank, plan.dims.pp),
                chunk if chunks else None,
                first_stage_layers=args.decoder_first_pipeline_num_layers,
                last_stage_layers=args.decoder_last_pipeline_num_layers,
            )
            assert offset == sum(len(s) for s in segments)
            segments.append("".join(layers))
    return segments


def check_hybrid_export(plan: Plan, tmp_path: Path, monkeypatch) -> list[str]:
    """Megatron-LM's own parsing of a hybrid export: degrees, batch and groups as for a GPT, the
    HybridModel's TransformerConfig (Mamba-2 sizes, attention, squared-ReLU MLP, no positions), and
    the stages select_pipeline_segment builds: the costed layers per (virtual) stage, each block the
    costed kind. Returns the segments."""
    launch = Launch(plan, tmp_path)
    assert launch.argv[0].endswith("/pretrain_hybrid.py")
    args = megatron_args(launch, monkeypatch)
    check_degrees_and_batch(args, plan)
    check_groups(args, launch)
    config = core_transformer_config_from_args(args)
    m, d, shape = plan.model, plan.dims, plan.model.mamba
    assert config.is_hybrid_model and args.spec == list(megatron.HYBRID_SPEC)
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size) == (
        m.num_layers,
        m.hidden_size,
        m.ffn_hidden_size,
    )
    assert (config.num_attention_heads, config.num_query_groups, config.kv_channels) == (
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
    )
    assert (config.mamba_num_heads, config.mamba_head_dim, config.mamba_state_dim, config.mamba_num_groups) == (
        shape.num_heads,
        shape.head_dim,
        shape.state_size,
        shape.groups,
    )
    assert config.activation_func.__name__ == "squared_relu" and not config.gated_linear_unit
    assert args.position_embedding_type == "none" and config.normalization == "RMSNorm"
    assert not config.add_bias_linear and args.untie_embeddings_and_output_weights
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.sequence_parallel) == (
        d.tp,
        d.pp,
        d.sp_active,
    )
    assert (
        config.recompute_granularity
        == {Recompute.NONE: None, Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}[d.recompute]
    )
    segments = hybrid_segments(args, plan, monkeypatch)
    assert [len(s) for s in segments] == list(plan.dims.virtual_stage_layers(m.num_layers))
    built = "".join(segments)
    assert [c == "M" for c in built] == [m.mixer_of(i) == "mamba" for i in range(m.num_layers)]
    assert [c == "*" for c in built] == [m.mixer_of(i) == "attention" for i in range(m.num_layers)]
    assert [c in "-E" for c in built] == [m.has_ffn(i) for i in range(m.num_layers)]
    assert [c == "E" for c in built] == [m.is_moe_layer(i) for i in range(m.num_layers)]
    assert (config.num_moe_experts or 0) == m.num_experts
    if m.is_moe:
        assert (config.moe_router_topk, config.moe_ffn_hidden_size, config.moe_shared_expert_intermediate_size) == (
            m.experts_per_token,
            m.moe_ffn_hidden_size,
            m.shared_expert_ffn_hidden_size,
        )
    return segments


@pytest.mark.slow
def test_megatron_builds_nemotron_h_on_uneven_stages_as_costed(tmp_path, monkeypatch) -> None:
    """Nemotron-H 8B at tp 2 (sequence parallel) x pp 2 x dp 4 on the uneven split 28 + 24: the pattern's
    pipe gives each stage its costed blocks, which a pipe-free pattern split evenly would not."""
    plan = _nemotron_h(ParallelDims(tp=2, sp=True, pp=2, dp=4, zero=1, layers_per_stage=(28, 24)))
    segments = check_hybrid_export(plan, tmp_path, monkeypatch)
    assert [len(s) for s in segments] == [28, 24]


@pytest.mark.slow
def test_megatron_builds_nemotron_h_interleaved_as_costed(tmp_path, monkeypatch) -> None:
    """Interleaved 1F1B with two chunks per stage at tp 4 x pp 2, selective recomputation, cp 2 beside
    it: four pipe segments, from which validate_args derives the virtual pipeline size 2."""
    plan = _nemotron_h(
        ParallelDims(
            tp=4,
            sp=True,
            cp=2,
            pp=2,
            dp=1,
            zero=1,
            recompute="selective",
            schedule="interleaved",
            virtual_stages=2,
            layers_per_stage=(12, 14, 14, 12),
        )
    )
    segments = check_hybrid_export(plan, tmp_path, monkeypatch)
    assert [len(s) for s in segments] == [12, 14, 14, 12]


@pytest.mark.slow
def test_megatron_builds_the_planned_nemotron_h(tmp_path, monkeypatch) -> None:
    """The planner's own plan for Nemotron-H 8B on 16 H100s under --export megatron."""
    space = api.search_space(export="megatron", model=api.resolve_model("nemotron-h-8b"))
    assert not space.moe_comm_overlap  # a HybridModel has no combined 1F1B schedule
    plan = api.plan(
        "nemotron-h-8b", "dgx-h100", Job(global_batch_size=256, seq_len=8192), devices=16, top=0, space=space
    ).plan
    assert plan.dims.pp > 1
    check_hybrid_export(plan, tmp_path, monkeypatch)


@pytest.mark.slow
def test_megatron_builds_a_hybrid_moe_as_costed(tmp_path, monkeypatch) -> None:
    """Nemotron 3 Nano (MoE blocks E between Mamba and attention ones) at tp 2 x ep 8 x pp 2: the experts'
    sizes, router and shared expert as costed, the E blocks where the plan has them."""
    plan = _nemotron_h(
        ParallelDims(tp=2, sp=True, ep=8, pp=2, dp=1, zero=1, layers_per_stage=(27, 25)), 32, "nemotron-3-nano-30b-a3b"
    )
    segments = check_hybrid_export(plan, tmp_path, monkeypatch)
    assert [len(s) for s in segments] == [27, 25] and "E" in segments[0]


@pytest.mark.slow
def test_megatron_takes_a_chunk_of_the_embedding_alone_as_an_empty_segment(tmp_path, monkeypatch) -> None:
    """Interleaved with the first chunk holding only the embedding and the last only the head (0 blocks):
    empty pipe segments, which validate_args and select_pipeline_segment take as stages without layers."""
    plan = _nemotron_h(
        ParallelDims(
            tp=2, sp=True, pp=2, dp=4, zero=1, schedule="interleaved", virtual_stages=2, layers_per_stage=(0, 26, 26, 0)
        )
    )
    segments = check_hybrid_export(plan, tmp_path, monkeypatch)
    assert [len(s) for s in segments] == [0, 26, 26, 0]


def test_deepseek_v2_routes_with_a_softmax_over_every_expert(tmp_path, monkeypatch) -> None:
    """DeepSeek-V2 scores every expert before its top-k (HF DeepseekV2MoEGate): Megatron-core's
    moe_router_pre_softmax, whose kept scores over all experts nestplan costs; the whole MLA plan runs as
    costed."""
    dims = ParallelDims(tp=2, sp=True, ep=4, pp=1, dp=2, zero=1)
    plan = _evaluated("deepseek-v2-lite", "dgx-h100", 16, dims, 64, 4096)
    assert plan.model.router_scores_all_experts
    check_export(plan, tmp_path, monkeypatch)  # its latents, heads, router, degrees, split and groups as costed
    assert ("--moe-router-pre-softmax", None) in megatron.all_flags(ExportInput(plan, "test"))[0]


def test_deepseek_v3_runs_its_routing_groups_and_mtp_as_costed(tmp_path, monkeypatch) -> None:
    """DeepSeek-V3 on an uneven pipeline: sigmoid scores with the correction bias, node-limited routing,
    the dense first layers, MLA and its MTP module (``m`` before the loss in the layout) all parse and
    validate in Megatron-LM as costed."""
    dims = ParallelDims(tp=2, sp=True, ep=8, pp=4, dp=1, zero=1, layers_per_stage=(16, 15, 15, 15))
    plan = _evaluated("deepseek-v3", "dgx-h100", 64, dims, 64, 4096)
    assert plan.model.mtp_layers == 1 and plan.model.routing_groups > 1
    check_export(plan, tmp_path, monkeypatch)
    flags = dict(megatron.all_flags(ExportInput(plan, "test"))[0])
    assert flags["--mtp-num-layers"] == 1 and flags["--moe-router-score-function"] == "sigmoid"
