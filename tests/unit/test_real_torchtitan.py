"""nestplan's torchtitan exports read by torchtitan 0.3.0's own code (issue 18).

Each export is launched the way a user launches it: ``bash launch_torchtitan.sh`` with a stand-in
``torchrun`` first on PATH that records the arguments it is given (and the PYTHONPATH the script
sets, where the export's config module lies). Those arguments go to torchtitan's
``ConfigManager().parse_args`` (its own config registry, tyro parser and ``Trainer.Config``
validation), the parsed parallelism to ``ParallelDims.from_config`` and ``build_mesh()``, the model
config and pipeline settings to torchtitan's own stage split (``_get_pipeline_metadata`` and
``_generate_llm_fqn_per_model_part``, what ``pipeline_llm`` runs), and the model config is built on
the meta device. The parsed meaning must equal the plan.

Stand-ins, for what needs GPUs: the process group is torch.distributed's fake backend (``FakeStore``,
rank 0 of the plan's world size); the mesh is built with device type ``cpu`` (torchtitan picks
``cuda``); for FP8 plans torchtitan's device check for float8 (``has_cuda_capability``) answers as an
H100 (SM90) would. torchao (float8) is needed only for the FP8 plans.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan 0.3.0 (the version the export targets) is not installed")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from planned_cases import CASES, planned_plans  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.distributed import parallel_dims as titan_dims  # noqa: E402
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: E402
from torchtitan.distributed.pipeline_parallel import (  # noqa: E402
    _generate_llm_fqn_per_model_part,
    _get_pipeline_metadata,
)

from nestplan import api  # noqa: E402
from nestplan.errors import ConfigError  # noqa: E402
from nestplan.export import build, framework_schedules  # noqa: E402
from nestplan.export.torchtitan import CONFIG_MODULE, SCHEDULES, run_model  # noqa: E402
from nestplan.job import Job  # noqa: E402
from nestplan.model.layers import total_params  # noqa: E402
from nestplan.plan import Plan  # noqa: E402
from nestplan.settings import Fp8Recipe, RunSettings
from nestplan.strategy.dims import ParallelDims  # noqa: E402
from nestplan.strategy.enums import Recompute  # noqa: E402
from nestplan.strategy.placement import rank_grid  # noqa: E402

STAGE_MAJOR = ("tp", "cp", "ep", "dp", "pp")
FAKE_TORCHRUN = '#!/bin/sh\nprintf \'%s\\0\' "$@" > "$ARGV_FILE"\nprintf \'%s\' "$PYTHONPATH" > "$PATH_FILE"\n'


def _fixture_plan(model: str, devices: int, dims: ParallelDims, seq_len: int = 8192) -> Plan:
    """The shapes of tests/unit/test_export.py's fixture (the issue's plans on h100-spine-leaf)."""
    job = Job(global_batch_size=4096, seq_len=seq_len)
    return api.evaluate_full(model, "h100-spine-leaf", dims, job, devices=devices, axis_order=STAGE_MAJOR).plan


@pytest.fixture(scope="module")
def issue_plans() -> dict[str, Plan]:
    """The issue's three plans: Llama 3 70B on 256, Mixtral on 128, Llama 3.1 405B on 2,048 (as planned)."""
    job = Job(global_batch_size=2048, seq_len=8192)
    return {
        "llama3-70b": _fixture_plan(
            "llama3-70b", 256, ParallelDims(tp=2, sp=True, cp=4, pp=4, dp=8, zero=1, layers_per_stage=(19, 21, 21, 19))
        ),
        "mixtral-8x7b": _fixture_plan(
            "mixtral-8x7b",
            128,
            ParallelDims(tp=1, cp=2, ep=4, pp=4, dp=4, zero=1, schedule="interleaved", virtual_stages=2),
        ),
        "llama3.1-405b": api.plan(  # the schedules torchtitan runs: its export refuses ZB-H1
            "llama3.1-405b",
            "llama3-h100",
            job,
            devices=2048,
            top=0,
            space=api.search_space(schedules=framework_schedules("torchtitan")),
        ).plan,
    }


def launched(plan: Plan, out: Path, node: int = 0) -> tuple[list[str], list[str], str]:
    """What the exported script, run on node ``node`` (network order), hands torchrun: torchrun's own
    options, the arguments it passes to ``torchtitan.train``, and the PYTHONPATH it runs under."""
    if not (out / "launch_torchtitan.sh").exists():
        build(plan, "torchtitan", "test").write(out)
        (out / "bin").mkdir()
        (out / "bin" / "torchrun").write_text(FAKE_TORCHRUN)
        (out / "bin" / "torchrun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NODE_", "MASTER_", "PYTHONPATH"))}
    env.update(
        PATH=f"{out / 'bin'}:{env['PATH']}",
        ARGV_FILE=str(out / "argv"),
        PATH_FILE=str(out / "pythonpath"),
        SLURM_NODEID=str(node),
    )
    subprocess.run(["bash", str(out / "launch_torchtitan.sh")], env=env, check=True, timeout=60)
    args = (out / "argv").read_text().split("\0")[:-1]
    start = args.index("-m")
    assert args[start + 1] == "torchtitan.train"
    return args[:start], args[start + 2 :], (out / "pythonpath").read_text()


def launched_argv(plan: Plan, out: Path) -> tuple[list[str], str]:
    """The arguments ``torchrun`` passes to ``torchtitan.train`` on the first node, and the PYTHONPATH."""
    _, argv, pythonpath = launched(plan, out)
    return argv, pythonpath


@pytest.fixture
def titan(monkeypatch):
    """Parse an argv with torchtitan's ConfigManager, the config module found on ``pythonpath``."""

    def parse(argv: list[str], pythonpath: str):
        for folder in reversed(pythonpath.split(":")):
            monkeypatch.syspath_prepend(folder)
        monkeypatch.delitem(sys.modules, CONFIG_MODULE, raising=False)
        return ConfigManager().parse_args(argv)

    monkeypatch.setattr(titan_dims, "device_type", "cpu")  # stand-in: the mesh on CPU, not CUDA
    from torchtitan.components.quantization import float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: (9, 0) >= (major, minor))
    return parse


def built_mesh(config, world: int):
    """torchtitan's ParallelDims from the parsed config, its mesh built on a fake process group."""
    dims = titan_dims.ParallelDims.from_config(config.parallelism, world)
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        dims.build_mesh()
        return dims, {name: mesh.size() for name, mesh in dims.get_all_one_dimensional_meshes().items()}
    finally:
        dist.destroy_process_group()


def expected_meaning(plan: Plan) -> dict:
    """What the plan means in torchtitan's terms."""
    d, job = plan.dims, plan.job
    replicate, shard = (d.dp, d.ep) if d.zero == 0 else (1, d.dp * d.ep)
    return {
        "tp": d.tp,
        "cp": d.cp,
        "pp": d.pp,
        "dp_replicate": replicate,
        "dp_shard": shard,
        "ep": d.ep * d.tp if d.ep > 1 or d.etp is not None else 1,  # its experts whole over ep x tp
        "sp": d.sp_active and d.tp > 1,
        "global_batch": job.global_batch_size,
        "microbatch": d.micro_batch_size,
        "microbatches": job.global_batch_size // d.batch_replicas // d.micro_batch_size,
        "schedule": SCHEDULES[d.schedule] if d.pp > 1 else None,
        "seq_len": job.seq_len,
        "param_dtype": {"bf16": "bfloat16", "fp32": "float32"}[job.dtype],
        "checkpoint": d.recompute,
        "fp8": job.fp8,
        "compile": job.settings.tp_comm_overlap and d.tp > 1,
        "async_tp": job.settings.tp_comm_overlap and d.tp > 1,
        "cuda_graphs": False,
        "layers": plan.model.num_layers,
        "hidden": plan.model.hidden_size,
        "vocab": plan.model.vocab_size,
    }


def parsed_meaning(config, plan: Plan) -> dict:
    """The same quantities read back from torchtitan's parsed config and its built mesh."""
    par, train, model = config.parallelism, config.training, config.model_spec.model
    dims, sizes = built_mesh(config, plan.devices_used)
    batch = dims.dp_replicate * dims.dp_shard
    accumulation = train.global_batch_size // (train.local_batch_size * batch)
    assert train.global_batch_size == accumulation * train.local_batch_size * batch
    microbatches = train.local_batch_size // par.pipeline_parallel_microbatch_size if dims.pp > 1 else accumulation
    microbatch = par.pipeline_parallel_microbatch_size if dims.pp > 1 else train.local_batch_size
    assert sizes.get("tp", 1) == dims.tp and sizes.get("cp", 1) == dims.cp and sizes.get("pp", 1) == dims.pp
    assert sizes.get("dp_shard", 1) == dims.dp_shard and sizes.get("ep", 1) == dims.ep
    checkpoint = {FullAC.Config: Recompute.FULL, SelectiveAC.Config: Recompute.SELECTIVE}.get(
        type(config.activation_checkpoint), Recompute.NONE
    )
    from torchtitan.components.quantization.float8 import Float8Linear

    fp8 = Float8Linear is not None and any(True for _ in model.traverse(Float8Linear.Config))
    return {
        "tp": dims.tp,
        "cp": dims.cp,
        "pp": dims.pp,
        "dp_replicate": dims.dp_replicate,
        "dp_shard": dims.dp_shard,
        "ep": dims.ep,
        "sp": par.enable_sequence_parallel and dims.tp > 1,
        "global_batch": train.global_batch_size,
        "microbatch": microbatch,
        "microbatches": microbatches,
        "schedule": par.pipeline_parallel_schedule if dims.pp > 1 else None,
        "seq_len": train.seq_len,
        "param_dtype": train.mixed_precision_param,
        "checkpoint": checkpoint,
        "fp8": fp8,
        "compile": config.compile.enable,
        "async_tp": config.compile.enable_async_tensor_parallel,
        "cuda_graphs": not train.disable_cuda_graphs,
        "layers": len(model.layers),
        "hidden": model.dim,
        "vocab": model.vocab_size,
    }


def stage_layers(config, plan: Plan) -> list[int]:
    """Transformer layers per (virtual) stage as torchtitan's pipeline_llm splits the model: the
    config's module list where it has one, else torchtitan's own split of the flags' numbers."""
    if plan.dims.pp == 1:
        return [plan.model.num_layers]
    parts = config.parallelism.module_fqns_per_model_part  # listed by the config module, else generated
    if parts is None:
        dims = titan_dims.ParallelDims.from_config(config.parallelism, plan.devices_used)
        stages, layers, first, last = _get_pipeline_metadata(dims, config.parallelism, config.model_spec.model)
        parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    named = [name for part in parts for name in part if name.startswith("layers.")]
    assert named == [f"layers.{i}" for i in range(plan.model.num_layers)]  # every layer once, in order
    return [sum(name.startswith("layers.") for name in part) for part in parts]


def meta_params(config) -> int:
    """Parameters of the model torchtitan builds (on the meta device: shapes only)."""
    with torch.device("meta"):
        model = config.model_spec.model.build()
    return sum(p.numel() for p in model.parameters())


def check_export(plan: Plan, out: Path, parse) -> list[str]:
    """Assert torchtitan accepts the export and reads the plan back; returns the export's notes."""
    if plan.job.fp8:
        pytest.importorskip("torchao", reason="torchao (torchtitan's float8 linears) is not installed")
    argv, pythonpath = launched_argv(plan, out)
    config = parse(argv, pythonpath)
    assert parsed_meaning(config, plan) == expected_meaning(plan)
    notes = build(plan, "torchtitan", "test").notes
    costed = (
        list(plan.dims.virtual_stage_layers(plan.model.num_layers)) if plan.dims.pp > 1 else [plan.model.num_layers]
    )
    assert stage_layers(config, plan) == costed
    # the model nestplan costed (or what torchtitan's model of its architecture builds, quoted in the notes)
    built = run_model(plan.model, plan.dims.pp > 1)
    assert meta_params(config) == pytest.approx(total_params(built), rel=1e-3)
    assert (built == plan.model) or any(f"builds {plan.model.name} as its" in n for n in notes)
    return notes


@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x7b", "llama3.1-405b"])
def test_torchtitan_reads_the_issue_plans_back(issue_plans, name, tmp_path, titan) -> None:
    plan = issue_plans[name]
    notes = check_export(plan, tmp_path, titan)
    if plan.dims.cp > 1:  # torchtitan all-gathers K/V; nestplan's prediction for that is quoted
        assert any("all-gathers K/V" in n and "nestplan predicts step" in n for n in notes)


def test_405b_runs_bf16_without_compile(issue_plans, tmp_path, titan) -> None:
    """torchtitan's own llama3_405b config builds FP8 linears, compiles and turns async TP on; the
    export runs the BF16 eager step nestplan costed."""
    argv, pythonpath = launched_argv(issue_plans["llama3.1-405b"], tmp_path)
    config = titan(argv, pythonpath)
    assert (config.compile.enable, config.compile.enable_async_tensor_parallel) == (False, False)
    assert config.model_spec.flavor == "405B" and not any(
        "Float8" in type(c).__name__ for _, c, _, _ in config.model_spec.model.traverse(object)
    )


def test_mixtral_is_the_real_moe_model(issue_plans, tmp_path, titan) -> None:
    """Not torchtitan's tiny dense debug model: 32 MoE layers of 8 experts, top 2, hidden 14336."""
    argv, pythonpath = launched_argv(issue_plans["mixtral-8x7b"], tmp_path)
    model = titan(argv, pythonpath).model_spec.model
    moes = [block.moe for block in model.layers]
    assert len(moes) == 32 and all(m is not None and m.num_experts == 8 and m.router.top_k == 2 for m in moes)
    assert {m.routed_experts.inner_experts.hidden_dim for m in moes} == {14336}


def test_pipeline_needs_cuda_graphs_off(issue_plans, tmp_path, titan, capsys) -> None:
    """The issue's rejection: torchtitan 0.3.0 captures CUDA graphs by default and refuses them with
    pipeline parallelism; the export turns them off, and without that flag torchtitan still refuses."""
    argv, pythonpath = launched_argv(issue_plans["llama3-70b"], tmp_path)
    assert "--training.disable-cuda-graphs" in argv
    argv.remove("--training.disable-cuda-graphs")
    with pytest.raises(SystemExit):  # tyro reports Trainer.Config's ValueError and exits
        titan(argv, pythonpath)
    assert "CUDA graphs do not support pipeline parallelism" in capsys.readouterr().err


def test_other_architectures_build_as_llama_with_the_prediction_quoted(tmp_path, titan) -> None:
    """GPT-3 (LayerNorm, GELU MLP, biases, learned positions, tied head): torchtitan 0.3.0 has no such
    model; the export builds its Llama 3 model of GPT-3's sizes, names each fact it builds otherwise (the
    head untied: torchtitan ties no weights under pipeline parallelism) and quotes nestplan's prediction
    for that one."""
    plan = _fixture_plan("gpt3-175b", 64, ParallelDims(tp=8, pp=8, dp=1), seq_len=2048)
    notes = check_export(plan, tmp_path, titan)
    note = next(n for n in notes if "builds gpt3-175b as its llama3 model" in n)
    assert "nestplan predicts step" in note
    assert all(f"{fact} " in note for fact in ("norm", "activation", "gated_mlp", "tied_embeddings", "rope_theta"))


@pytest.mark.parametrize(
    ("name", "dims"),
    [
        ("deepseek-v2-lite", ParallelDims(tp=1, ep=4, pp=2, dp=4, zero=1, layers_per_stage=(13, 14))),
        ("gpt-oss-20b", ParallelDims(tp=2, ep=2, pp=2, dp=4, zero=1)),
        ("qwen3-235b-a22b", ParallelDims(tp=4, sp=True, ep=2, pp=2, dp=2, zero=1)),
    ],
)
def test_torchtitans_own_models_read_back_pipelined(name, dims, tmp_path, titan) -> None:
    """DeepSeek-V2-Lite as torchtitan's DeepSeek-V3 model, gpt-oss as its gpt-oss model and Qwen3-MoE as its
    Qwen3 model, each with expert and pipeline parallelism: torchtitan parses the launch, splits the stages
    as costed and builds the model nestplan costed, nothing noted about the model."""
    plan = _fixture_plan(name, 32, dims, seq_len=4096)
    notes = check_export(plan, tmp_path, titan)
    assert not any(f"builds {name} as its" in n for n in notes)


def test_nodes_renumbered_to_the_costed_order(tmp_path, titan) -> None:
    """Costed pp inside dp (tp-cp-ep-pp-dp): torchtitan's mesh puts pp outermost, but each of its
    node-sized rank blocks is one tp group, so renumbering the nodes puts every torchtitan rank on the
    device nestplan costed for its (pp, dp, tp) coordinates, read from torchtitan's own mesh."""
    order = ("tp", "cp", "ep", "pp", "dp")
    plan = api.evaluate_full(
        "llama3-70b",
        "h100-spine-leaf",
        ParallelDims(tp=8, pp=4, dp=8),
        Job(global_batch_size=1024, seq_len=8192),
        devices=256,
        axis_order=order,
    ).plan
    notes = build(plan, "torchtitan", "test").notes
    assert not any(n.startswith("RANK LAYOUT DIFFERS") for n in notes) and any(
        "renumbers the nodes" in n for n in notes
    )
    node_rank = {}
    for node in range(plan.devices_used // 8):
        options, argv, pythonpath = launched(plan, tmp_path, node)
        node_rank[int(options[options.index("--node-rank") + 1])] = node
    assert sorted(node_rank) == list(range(32))  # every torchrun node rank once
    dims, _ = built_mesh(titan(argv, pythonpath), plan.devices_used)
    logical = dims._global_meshes["dense"].mesh.reshape(4, 8, 8)  # torchtitan's ranks by [pp, dp, tp]
    physical = [[[node_rank[int(r) // 8] * 8 + int(r) % 8 for r in row] for row in stage] for stage in logical]
    costed = rank_grid(plan.dims, order)[:, 0, 0, :, :].transpose(1, 2, 0)  # [tp, pp, dp] -> [pp, dp, tp]
    assert physical == costed.tolist()


def test_split_the_flags_cannot_give_is_listed(tmp_path, titan) -> None:
    """Layers 20,18,22,20: torchtitan's first/last-stage weights cannot give it (its middle stages differ
    by at most one layer); the config module lists each stage's modules and torchtitan runs that."""
    plan = api.evaluate_full(
        "llama3-70b",
        "h100-spine-leaf",
        ParallelDims(tp=8, pp=4, dp=8, layers_per_stage=(20, 18, 22, 20)),
        Job(global_batch_size=1024, seq_len=8192),
        devices=256,
    ).plan
    notes = check_export(plan, tmp_path, titan)  # the split read back is the costed one
    assert any("lists each stage's modules" in n for n in notes)


def test_fp8_and_async_tp_on_where_costed(tmp_path, titan) -> None:
    """A plan costing FP8 GEMMs (delayed scaling) and tp collectives under their GEMMs: torchtitan
    builds float8 linears and compiles with async TP; its rowwise scaling is quoted as nestplan's
    tensorwise prediction."""
    job = Job(
        global_batch_size=64, seq_len=8192, settings=RunSettings(fp8_recipe=Fp8Recipe.DELAYED, tp_comm_overlap=True)
    )
    plan = api.evaluate_full("llama3-8b", "h100-spine-leaf", ParallelDims(tp=8, sp=True, dp=2), job, devices=16).plan
    notes = check_export(plan, tmp_path, titan)  # fp8, compile and async_tp are read back as costed
    assert any("rowwise current scaling" in n and "nestplan predicts step" in n for n in notes)


def test_fp16_is_refused() -> None:
    """torchtitan 0.3.0's mixed precision is bfloat16 or float32 (V100-style fp16 plans cannot run)."""
    plan = api.evaluate_full(
        "llama2-7b",
        "h100-spine-leaf",
        ParallelDims(tp=2, dp=4),
        Job(global_batch_size=64, seq_len=4096, dtype="fp16"),
        devices=8,
    ).plan
    with pytest.raises(ConfigError, match="bfloat16 or float32"):
        build(plan, "torchtitan", "test")


def test_an_encoder_is_refused() -> None:
    plan = _fixture_plan("bert-large", 8, ParallelDims(dp=8), seq_len=512)
    with pytest.raises(ConfigError, match="bert-large has bidirectional attention"):
        build(plan, "torchtitan", "test")


@pytest.mark.slow
@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_torchtitan_reads_every_planned_case_back(name, tmp_path, titan) -> None:
    """Every planned case: torchtitan accepts the export and reads the plan back, or the export is
    refused (ConfigError) where torchtitan 0.3.0 has nothing close (an encoder)."""
    plan = planned_plans("torchtitan")[name]
    if plan.model.causal:
        check_export(plan, tmp_path, titan)
    else:
        with pytest.raises(ConfigError, match="has bidirectional attention"):
            build(plan, "torchtitan", "test")
