"""nestplan's DeepSpeed exports run through DeepSpeed 0.19.8's own ``deepspeed.initialize`` (issue 18).

Each accepted export's ``ds_config.json`` goes, unchanged and with no mpu of the test's making, to
``deepspeed.initialize`` in a child process (DeepSpeed's process groups are global, one world per
process), with the model the launch script tells the user to build: for pp > 1 a ``PipelineModule``
with ``PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world // (pp x tp))`` on the
plan's world size, so DeepSpeed's pipeline grid derives the data-parallel size and the engine makes
its own batch assertion against it; for pp = 1 a plain module (DeepSpeed's config path with
``mpu=None``: AutoTP's mesh comes from the config), or for cp > 1 the mpu DeepSpeed's own Ulysses
for Hugging Face models returns (``UlyssesSPAttentionHF.register_with_transformers``, called as the
export's note says: DeepSpeed's ``parallel_state_sp``, no mpu of the test's making). The parsed
meaning read back from the engine must equal the plan: micro batch, accumulation steps, the samples a step trains (micro
batch x accumulation x the engine's data-parallel world) = the global batch, the train_batch_size
DeepSpeed reports, ZeRO stage, precision, optimizer, gradient accumulation dtype, the degrees as
DeepSpeed derives them (data-parallel world, pipeline stages, tensor and sequence-parallel width,
expert-parallel width) and rank 0's groups against the ranks nestplan costed.

Stand-ins, for what needs GPUs or a cluster:
- the process group: torch.distributed's fake backend (``FakeStore``, rank 0 of the plan's world
  size; collectives return at once, group creation runs as on a cluster), which DeepSpeed's comm
  wraps (``deepspeed.init_distributed`` on an initialized torch.distributed), and LOCAL_RANK, RANK,
  WORLD_SIZE set as the deepspeed launcher sets them;
- the GPU: DeepSpeed's CPU accelerator (what it picks on a machine without one);
- the model: tiny layers of the plan's layer count (one Linear per transformer layer; for MoE
  plans DeepSpeed's own ``deepspeed.moe.layer.MoE`` with the plan's experts and the export's
  ``ep_size``); for AutoTP (tp > 1, pp = 1) and Ulysses (cp > 1) a tiny Hugging Face Llama (AutoTP
  shards models it recognizes, ALST registers Hugging Face attention; needs transformers), with as
  many key-value heads as tp or cp.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

MARK = "DEEPSPEED-FACTS "


# ---------------------------------------------------------------- the child: deepspeed.initialize


def _child(spec: dict) -> dict:
    """Runs in its own process: the fake world, the stand-in model, ``deepspeed.initialize`` on the
    exported config, and what the engine derived from it."""
    import torch
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = spec["world"]
    tdist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    os.environ.update(LOCAL_RANK="0", RANK="0", WORLD_SIZE=str(world))
    import deepspeed

    deepspeed.init_distributed()
    model = _stand_in_model(spec, torch, deepspeed)
    mpu = None
    if spec["cp"] > 1:  # what the export's Ulysses note tells the user's code to run
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model,
            core_attn_implementation="sdpa",
            sequence_parallel_size=spec["cp"],
            micro_batch_size=spec["config"]["train_micro_batch_size_per_gpu"],
            seq_length=spec["seq_len"],
            seq_length_is_variable=False,
        )
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=spec["config"], model_parameters=model.parameters(), mpu=mpu
    )
    return _engine_facts(engine, spec, tdist)


def _stand_in_model(spec: dict, torch, deepspeed):
    from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    hidden, world, pp, tp, ep = 8, spec["world"], spec["pp"], spec["tp"], spec["ep"]
    if pp > 1:
        topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world // (pp * tp))
        layer = (
            LayerSpec(
                deepspeed.moe.layer.MoE,
                hidden_size=hidden,
                expert=torch.nn.Linear(hidden, hidden),
                num_experts=spec["experts"],
                ep_size=ep,
            )
            if ep > 1
            else LayerSpec(torch.nn.Linear, hidden, hidden)
        )
        return PipelineModule(
            [layer] * spec["layers"], topology=topology, loss_fn=torch.nn.MSELoss(), partition_method="uniform"
        )
    if spec["config"].get("tensor_parallel", {}).get("autotp_size", 1) > 1 or spec["cp"] > 1:
        from transformers import LlamaConfig, LlamaForCausalLM

        heads = max(tp, spec["cp"])
        return LlamaForCausalLM(
            LlamaConfig(
                hidden_size=8 * heads,
                intermediate_size=16 * heads,
                num_hidden_layers=2,
                num_attention_heads=heads,
                num_key_value_heads=heads,
                vocab_size=64,
                attn_implementation="sdpa",
            )
        )
    parts = {"dense": torch.nn.Linear(hidden, hidden)}
    if ep > 1:
        parts["moe"] = deepspeed.moe.layer.MoE(
            hidden_size=hidden, expert=torch.nn.Linear(hidden, hidden), num_experts=spec["experts"], ep_size=ep
        )
    return torch.nn.ModuleDict(parts)


def _engine_facts(engine, spec: dict, tdist) -> dict:
    from deepspeed.utils import groups

    config = engine._config  # the DeepSpeedConfig deepspeed.initialize built from the exported dict
    facts = {
        "engine": type(engine).__name__,
        "config_world": config.world_size,
        "train_batch_size": engine.train_batch_size(),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "accumulation": engine.gradient_accumulation_steps(),
        "dp_world": engine.dp_world_size,
        "seq_dp_world": engine.seq_dp_world_size,
        "sequence_parallel": engine.sequence_parallel_size,
        "autotp": engine.autotp_size(),
        "zero": engine.zero_optimization_stage(),
        "bf16": engine.bfloat16_enabled(),
        "fp16": engine.fp16_enabled(),
        "optimizer": config.optimizer_name,
        "grad_accum_dtype": config.grad_accum_dtype,
        "groups": {"data": tdist.get_process_group_ranks(engine.seq_data_parallel_group)},
    }
    if spec["pp"] > 1:
        grid = engine.grid
        facts.update(pipe=grid.pipe_parallel_size, model=grid.model_parallel_size, grid_data=grid.data_parallel_size)
        facts["groups"]["pipe"] = tdist.get_process_group_ranks(grid.get_pipe_parallel_group())
        facts["groups"]["tensor"] = tdist.get_process_group_ranks(grid.get_slice_parallel_group())
    elif engine.autotp_size() > 1:
        facts["groups"]["tensor"] = tdist.get_process_group_ranks(groups.get_tensor_model_parallel_group())
    if engine.sequence_parallel_size > 1:
        facts["groups"]["sequence"] = tdist.get_process_group_ranks(engine.seq_parallel_group)
    if spec["ep"] > 1:
        name = f"ep_size_{spec['ep']}"
        facts["groups"]["expert"] = tdist.get_process_group_ranks(groups._get_expert_parallel_group(name))
    return facts


if __name__ == "__main__":  # the child process of _initialize: DeepSpeed and torch only, no nestplan
    print(MARK + json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
    sys.exit(0)

pytest.importorskip("deepspeed", reason="DeepSpeed (the `validate` extra) runs the exported config")

from cli_helpers import run_cli  # noqa: E402
from planned_cases import CASES, planned_plans  # noqa: E402

from nestplan import api  # noqa: E402
from nestplan.cost.evaluator import evaluate_plan  # noqa: E402
from nestplan.errors import ConfigError  # noqa: E402
from nestplan.export import deepspeed as ds_export  # noqa: E402
from nestplan.export.plan import ExportInput  # noqa: E402
from nestplan.job import Job  # noqa: E402
from nestplan.plan import Plan  # noqa: E402
from nestplan.strategy.dims import ParallelDims  # noqa: E402

# the fields DeepSpeed's refusals name (etp: experts folded over tp, which its MoE layer cannot run)
OVERRIDDEN = ("cp", "tp", "zero_stage", "layers_per_stage", "etp", "moe_comm_overlap", "moe_dispatcher")


# ---------------------------------------------------------------- the parent: export, run, compare


def _export(plan: Plan, tmp_path: Path) -> tuple[dict, tuple[str, ...]]:
    paths, result = api.export_plan(plan, "deepspeed", tmp_path)
    assert [p.name for p in paths] == [
        "ds_config.json",
        "launch_deepspeed.sh",
        "config.json",
    ]  # the model: its own test
    return json.loads(paths[0].read_text()), tuple(result.notes)


def _initialize(plan: Plan, cfg: dict) -> dict:
    """``deepspeed.initialize`` on ``cfg`` in a child process with the plan's world and stand-in model."""
    d = plan.dims
    if d.pp == 1 and (d.tp > 1 or d.cp > 1):
        pytest.importorskip("transformers", reason="AutoTP and Ulysses run a Hugging Face model (the `trace` extra)")
    spec = {
        "world": plan.devices_used,
        "pp": d.pp,
        "tp": d.tp,
        "cp": d.cp,
        "ep": d.ep,
        "layers": plan.model.num_layers,
        "experts": plan.model.num_experts,
        "seq_len": plan.job.seq_len,
        "config": cfg,
    }
    # the first run on a machine compiles DeepSpeed's CPU ops (shared-memory comm, FusedAdam): minutes
    run = subprocess.run(
        [sys.executable, __file__, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=Path(__file__).parent,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith(MARK)]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-6000:]
    return json.loads(lines[-1][len(MARK) :])


def _ranks(plan: Plan, *axes: str) -> list[int]:
    """Rank 0's group over ``axes`` (adjacent in DeepSpeed's order, fastest first) in the rank grid
    DeepSpeed builds, which is nestplan's when the export carries no rank-layout note."""
    order = [str(a) for a in ds_export.STAGE_MAJOR]
    stride = 1
    for axis in order[: order.index(axes[0])]:
        stride *= plan.dims.degree(axis)
    size = 1
    for axis in axes:
        size *= plan.dims.degree(axis)
    return [k * stride for k in range(size)]


def _check_meaning(plan: Plan, cfg: dict, notes: tuple[str, ...], facts: dict) -> None:
    """What DeepSpeed derived from the config equals the plan."""
    d, job = plan.dims, plan.job
    assert facts["micro_batch"] == d.micro_batch_size
    assert facts["accumulation"] == plan.num_microbatches
    replicas = facts["seq_dp_world"] // facts["sequence_parallel"]  # ZeRO's and the gradients' group over cp
    assert replicas == d.dp * d.ep and facts["dp_world"] in (replicas, None)  # None: DeepSpeed's, under Ulysses' mpu
    assert facts["micro_batch"] * facts["accumulation"] * replicas == job.global_batch_size
    if "train_batch_size" in cfg:
        assert facts["train_batch_size"] == job.global_batch_size == cfg["train_batch_size"]
    else:  # DeepSpeed derives it over its own world (AutoTP's ranks included); a note says so
        assert facts["train_batch_size"] == ds_export.derived_train_batch(plan) != job.global_batch_size
        assert any(f"derives and reports {facts['train_batch_size']}" in n for n in notes)
    assert facts["config_world"] == ds_export.batch_world(plan)
    assert facts["zero"] == int(d.zero)
    assert (facts["bf16"], facts["fp16"]) == (job.dtype == "bf16", job.dtype == "fp16")
    assert facts["optimizer"] == ds_export.OPTIMIZERS[job.optimizer.value].lower()
    if "data_types" in cfg:
        assert facts["grad_accum_dtype"] == job.settings.grad_dtype
    else:  # DeepSpeed cannot accumulate in the costed dtype here (no ZeRO): the note says so
        assert facts["grad_accum_dtype"] is None and any("DeepSpeed accumulates gradients in" in n for n in notes)
    assert facts["sequence_parallel"] == d.cp
    if d.pp > 1:
        assert (facts["engine"], facts["pipe"], facts["model"], facts["grid_data"]) == (
            "PipelineEngine",
            d.pp,
            d.tp,
            d.dp * d.ep,
        )
        assert facts["autotp"] == 0
    else:
        assert facts["engine"] == "DeepSpeedEngine" and facts["autotp"] == (d.tp if d.tp > 1 else 0)
    layout_noted = any(n.startswith("RANK LAYOUT DIFFERS") for n in notes)
    expected = {
        "data": _ranks(plan, "cp", "ep", "dp"),
        "pipe": _ranks(plan, "pp"),
        "tensor": _ranks(plan, "tp"),
        "sequence": _ranks(plan, "cp"),
        "expert": _ranks(plan, "ep"),
    }
    for name, ranks in facts["groups"].items():
        assert ranks == expected[name], name
    if not layout_noted:  # DeepSpeed's grid is the one costed
        assert tuple(a for a in plan.axis_order if d.degree(a) > 1) == tuple(
            str(a) for a in ds_export.STAGE_MAJOR if d.degree(str(a)) > 1
        )


def _accepted(plan: Plan, tmp_path: Path) -> dict:
    cfg, notes = _export(plan, tmp_path)
    facts = _initialize(plan, cfg)
    _check_meaning(plan, cfg, notes, facts)
    return facts


def _evaluated(model: str, cluster: str, devices: int, dims: ParallelDims, batch: int, seq: int) -> Plan:
    return api.evaluate_full(
        model,
        cluster,
        dims,
        Job(global_batch_size=batch, seq_len=seq),
        devices=devices,
        axis_order=("tp", "cp", "ep", "dp", "pp"),
    ).plan


# ---------------------------------------------------------------- the issue's three plans


ISSUE_PLANS = {  # tests/unit/test_export.py's two; for Llama 3.1 405B on 2,048 H100s the plan `nestplan plan` chose
    # (global batch 2048 x 8192 tokens), fixed here: planning it takes most of a minute
    "llama3-70b": lambda: _evaluated(
        "llama3-70b",
        "h100-spine-leaf",
        256,
        ParallelDims(tp=2, sp=True, cp=4, pp=4, dp=8, zero=1, layers_per_stage=(19, 21, 21, 19)),
        4096,
        8192,
    ),
    "mixtral-8x7b": lambda: _evaluated(
        "mixtral-8x7b",
        "h100-spine-leaf",
        128,
        ParallelDims(tp=1, cp=2, ep=4, pp=4, dp=4, zero=1, schedule="interleaved", virtual_stages=2),
        4096,
        8192,
    ),
    "llama3.1-405b": lambda: _evaluated(
        "llama3.1-405b",
        "dgx-h100",
        2048,
        ParallelDims(
            tp=4,
            sp=True,
            cp=4,
            pp=16,
            dp=8,
            zero=1,
            schedule="interleaved",
            virtual_stages=4,
            layers_per_stage=(1,) + (2,) * 62 + (1,),
        ),
        2048,
        8192,
    ),
}


@pytest.mark.parametrize("name", list(ISSUE_PLANS))
def test_the_issue_plans_are_refused_in_one_line(name, capsys, tmp_path) -> None:
    """All three run context parallelism inside a pipeline: DeepSpeed's pipeline grid has no sequence
    axis, so the export refuses, exit 2; Mixtral's and the 405B plan's interleaved schedule, which its
    pipeline engine does not run, is refused first."""
    plan = ISSUE_PLANS[name]()
    assert plan.dims.pp > 1 and plan.dims.cp > 1
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan.to_dict()))
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "deepspeed", "--out", str(tmp_path / "o")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot export to DeepSpeed" in err
    assert "no sequence axis" in err or "no interleaved schedule" in err
    assert not (tmp_path / "o").exists()


def test_pipeline_with_ulysses_is_refused_and_would_fail_deepspeeds_batch_assertion() -> None:
    """Regression (b): the issue's Llama 3 70B plan (tp 2, cp 4, pp 4, dp 8 on 256). Exported as before
    (train_batch_size 4096 over micro batch 1 x 512 steps), DeepSpeed's PipelineModule grid counts the
    Ulysses ranks as data parallel (256 / (pp 4 x tp 2) = 32) and its batch assertion fails
    (``4096 != 1 * 512 * 32``, DeepSpeedConfig._batch_assertion); the export now refuses it."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    plan = ISSUE_PLANS["llama3-70b"]()
    d = plan.dims
    grid_data = PipeModelDataParallelTopology(num_pp=d.pp, num_mp=d.tp, num_dp=plan.devices_used // (d.pp * d.tp))
    assert grid_data.get_dim("data") == d.dp * d.cp == 32
    assert d.micro_batch_size * plan.num_microbatches * grid_data.get_dim("data") != plan.job.global_batch_size
    with pytest.raises(ConfigError, match="no sequence axis") as err:
        ds_export.export(ExportInput(plan, "test"))
    assert err.value.field == "cp"


def test_pipeline_batch_passes_deepspeeds_assertion(tmp_path) -> None:
    """Regression (a): a pp > 1 plan (tp 4, pp 4, dp 8 on 128 H100s) through PipelineModule: the
    engine's grid derives dp 8 from the world and the topology, and DeepSpeed's batch assertions
    (config and PipelineEngine) hold with the exported train_batch_size."""
    plan = _evaluated(
        "llama3-70b",
        "dgx-h100",
        128,
        ParallelDims(tp=4, sp=True, pp=4, dp=8, zero=1, layers_per_stage=(19, 21, 21, 19)),
        512,
        8192,
    )
    facts = _accepted(plan, tmp_path)
    assert facts["train_batch_size"] == 512 and facts["grid_data"] == 8 and facts["groups"]["pipe"] == [0, 32, 64, 96]


def test_autotp_without_a_train_batch_size(tmp_path) -> None:
    """tp 2 x dp 32 on 64 (pp 1): DeepSpeed's config counts AutoTP's ranks as data parallel (64), so a
    train_batch_size of the global batch would fail its assertion; the export leaves it out, the
    engine's data-parallel world is 32 and a step trains the global batch; DeepSpeed reports twice it."""
    plan = _evaluated("llama2-7b", "dgx-h100", 64, ParallelDims(tp=2, sp=True, dp=32, zero=1), 256, 4096)
    facts = _accepted(plan, tmp_path)
    assert facts["train_batch_size"] == 512 and facts["dp_world"] == 32 and facts["groups"]["tensor"] == [0, 1]


def test_ulysses_through_deepspeeds_own_groups(tmp_path) -> None:
    """cp 2 x dp 4 on 8 (pp 1, tp 1): DeepSpeed's Ulysses mpu (register_with_transformers, as the note
    says) gives the engine nestplan's cp group and ZeRO over all 8 cp x dp ranks, as costed."""
    plan = _evaluated("llama3-8b", "dgx-h100", 8, ParallelDims(cp=2, dp=4, zero=1), 128, 8192)
    facts = _accepted(plan, tmp_path)
    assert facts["sequence_parallel"] == 2 and facts["groups"]["sequence"] == [0, 1]
    assert facts["seq_dp_world"] == 8 and facts["train_batch_size"] == 128


def test_ulysses_with_autotp_is_refused() -> None:
    plan = _evaluated("llama3-8b", "dgx-h100", 16, ParallelDims(tp=2, sp=True, cp=2, dp=4, zero=1), 32, 32768)
    with pytest.raises(ConfigError, match="share ranks"):
        ds_export.export(ExportInput(plan, "test"))


def test_ulysses_needs_the_key_value_heads_divisible() -> None:
    """Llama 3 8B has 8 key/value heads: Ulysses over 16 ranks cannot split them (nestplan costed a ring)."""
    plan = _evaluated("llama3-8b", "dgx-h100", 16, ParallelDims(cp=16, zero=1), 16, 131072)
    with pytest.raises(ConfigError, match="8 key/value heads over the 16 ranks"):
        ds_export.export(ExportInput(plan, "test"))


# ---------------------------------------------------------------- the launcher


def _launched_world(plan: Plan, tmp_path: Path) -> int:
    """The ranks DeepSpeed's own launcher (deepspeed.launcher.runner: parse_args, the hostfile reader,
    parse_inclusion_exclusion, apply_num_nodes_and_gpus) starts from the exported command line, with
    a hostfile written as the script's comment says (stand-in host names)."""
    from deepspeed.launcher import runner

    paths, _ = api.export_plan(plan, "deepspeed", tmp_path)
    lines = paths[1].read_text().splitlines()
    command = next(line for line in lines if line.startswith("deepspeed "))
    comment = lines[lines.index(command) - 1]
    per_node, nodes = (
        plan.cluster.topology.unit_devices(0),
        -(-plan.devices_used // plan.cluster.topology.unit_devices(0)),
    )
    last = plan.devices_used - (nodes - 1) * per_node
    slots = [per_node] * (nodes - 1) + [last]
    said = f"slots={last}" if len(set(slots)) == 1 else f"slots={per_node}, the last with slots={last}"
    assert comment.endswith(f"one line each (<host> {said})"), comment
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"node-{i} slots={n}\n" for i, n in enumerate(slots)))
    words = shlex.split(command.replace('"${HOSTFILE:-hostfile}"', str(hostfile)).replace('"$@"', ""))
    args = runner.parse_args(words[1:])
    active = runner.parse_inclusion_exclusion(runner.fetch_hostfile(args.hostfile), args.include, args.exclude)
    active = runner.apply_num_nodes_and_gpus(active, args.num_nodes, args.num_gpus)
    return sum(len(ranks) for ranks in active.values())


@pytest.mark.parametrize("devices", [12, 16, 4])
def test_the_launcher_starts_the_plans_devices(devices, tmp_path) -> None:
    """12 of 16 A100s (the last node half used), two whole nodes, and 4 GPUs of one node: DeepSpeed's
    launcher starts exactly the plan's ranks (a world of 16 for the 12-device plan would fail the
    batch assertion)."""
    spec, cluster, job = (
        api.resolve_model("llama3-8b"),
        api.resolve_cluster("dgx-a100", 16),
        Job(global_batch_size=devices, seq_len=2048),
    )
    plan = api.Evaluation(
        spec, cluster, job, evaluate_plan(spec, cluster, ParallelDims(dp=devices, zero=1), job), 0.0
    ).plan
    assert plan.devices_used == devices and plan.cluster.devices == 16
    assert _launched_world(plan, tmp_path) == devices


# ---------------------------------------------------------------- every planned case


@pytest.mark.slow
@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_every_planned_case_is_accepted_or_refused_in_one_line(case, tmp_path) -> None:
    plan = planned_plans("deepspeed")[case]
    try:
        ds_export.check(plan, plan.model.num_heads)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err).startswith("cannot export to DeepSpeed") and err.field in OVERRIDDEN
        return
    _accepted(plan, tmp_path)
