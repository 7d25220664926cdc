"""Exports (`--export`, `nestplan export`): flags and keys against the frameworks' pinned tables,
DeepSpeed's own config class on the exported JSON, rank-order notes, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.export import megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.job import Job, Optimizer
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims
from nestplan.settings import RunSettings

TABLES = Path(megatron.__file__).parent


def _table(name: str) -> set[str]:
    lines = (TABLES / name).read_text().splitlines()
    return {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}


def _plan(model: str, devices: int, dims: ParallelDims, seq: int, order=("tp", "cp", "ep", "dp", "pp")) -> Plan:
    job = Job(global_batch_size=4096, seq_len=seq)
    return api.evaluate_full(model, "h100-spine-leaf", dims, job, devices=devices, axis_order=order).plan


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    """The issue's two cases, with plans of the shapes nestplan chooses for them."""
    return {
        "llama3-70b": _plan(
            "llama3-70b",
            256,
            ParallelDims(tp=2, sp=True, cp=4, pp=4, dp=8, zero=1, layers_per_stage=(19, 21, 21, 19)),
            8192,
        ),
        "mixtral-8x7b": _plan(
            "mixtral-8x7b",
            128,
            ParallelDims(tp=1, cp=2, ep=4, pp=4, dp=4, zero=1, schedule="interleaved", virtual_stages=2),
            8192,
        ),
    }


def _input(plan: Plan) -> ExportInput:
    return ExportInput(plan, "test")


@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x7b"])
def test_megatron_flags_exist_in_the_pinned_release(plans, name) -> None:
    flags, _ = megatron.all_flags(_input(plans[name]))
    known = _table("megatron_flags.txt")
    emitted = {f for f, _ in flags} | {"--tokenizer-type", "--vocab-size", "--mock-data", "--train-iters", "--lr"}
    assert emitted <= known, emitted - known
    text = megatron.export(_input(plans[name])).files[0].text
    for flag in (
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--micro-batch-size",
        "--global-batch-size 4096",
        "--use-distributed-optimizer",
        "CUDA_DEVICE_MAX_CONNECTIONS=1",
    ):
        assert flag in text
    assert "#SBATCH --nodes=" in text and "predicted by nestplan: step" in text


@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x7b"])
def test_torchtitan_flags_exist_in_the_pinned_release(plans, name) -> None:
    flags, ckpt, _ = torchtitan.all_flags(_input(plans[name]))
    known = _table("torchtitan_flags.txt")
    assert {f for f, _ in flags} | {ckpt} <= known
    values = dict(flags)
    d = plans[name].dims
    assert values["--training.local-batch-size"] * d.dp * d.ep == 4096


@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x7b"])
def test_nemo_keys_exist_in_the_pinned_release(plans, name) -> None:
    items, _ = nemo.overrides(_input(plans[name]))
    assert {k for k, _ in items} <= _table("megatron_bridge_keys.txt")


@pytest.fixture
def deepspeed_config(monkeypatch):
    """DeepSpeed's config module, with a rank of 0: DeepSpeedConfig asks its communicator for the
    rank (no process group on this machine) before it asks the mpu for the data-parallel world."""
    ds = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(ds.dist, "get_rank", lambda *args, **kwargs: 0)
    return ds


@pytest.mark.parametrize("name,why", [("llama3-70b", "no sequence axis"), ("mixtral-8x7b", "no interleaved schedule")])
def test_deepspeed_refuses_ulysses_inside_a_pipeline(plans, name, why, tmp_path) -> None:
    """Both plans run cp > 1 with pp > 1: DeepSpeed's pipeline topology has no sequence axis; Mixtral's is
    refused before that for its schedule (tests/unit/test_real_deepspeed.py runs deepspeed.initialize
    itself on the exports it accepts)."""
    with pytest.raises(ConfigError, match=why):
        api.export_plan(plans[name], "deepspeed", tmp_path)


def test_deepspeed_accepts_the_job_settings(tmp_path, deepspeed_config) -> None:
    """SGD (torch.optim.SGD, outside ZeRO's tested optimizers) with bf16 gradient accumulation, ZeRO 1."""
    job = Job(global_batch_size=4096, seq_len=4096, optimizer=Optimizer.SGD, settings=RunSettings(grad_dtype="bf16"))
    plan = api.evaluate_full(
        "llama2-7b", "h100-spine-leaf", ParallelDims(tp=2, sp=True, dp=32, zero=1), job, devices=64
    ).plan
    paths, _ = api.export_plan(plan, "deepspeed", tmp_path)

    class Mpu:
        def get_data_parallel_world_size(self) -> int:
            return 32

    config = deepspeed_config.DeepSpeedConfig(json.loads(paths[0].read_text()), mpu=Mpu())
    assert config.optimizer_name == "SGD" and config.zero_allow_untested_optimizer
    assert config.grad_accum_dtype == "bf16" and config.zero_optimization_stage == 1


def test_saved_plan_exports_like_a_fresh_one(capsys, plans, tmp_path) -> None:
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plans["mixtral-8x7b"].to_dict()))
    code, _, _ = run_cli(capsys, ["export", str(saved), "--framework", "nemo", "--out", str(tmp_path / "a")])
    assert code == 0
    api.export_plan(plans["mixtral-8x7b"], "nemo", tmp_path / "b")
    for f in ("launch_megatron_bridge.sh", "megatron_bridge_overrides.txt"):
        assert (tmp_path / "a" / f).read_text() == (tmp_path / "b" / f).read_text()


def test_rank_order_the_framework_cannot_express_is_noted(tmp_path) -> None:
    plan = _plan("llama2-7b", 64, ParallelDims(tp=2, pp=4, dp=8), 4096, order=("tp", "cp", "ep", "pp", "dp"))
    _, result = api.export_plan(plan, "torchtitan", tmp_path)
    note = next(n for n in result.notes if n.startswith("RANK LAYOUT DIFFERS"))
    assert "tp-cp-ep-dp-pp" in note and "nestplan predicts step" in note
    _, result = api.export_plan(plan, "megatron", tmp_path / "m")  # --use-tp-pp-dp-mapping expresses it
    assert not any(n.startswith("RANK LAYOUT") for n in result.notes)
    assert "--use-tp-pp-dp-mapping" in (tmp_path / "m" / "launch_megatron.sh").read_text()


@pytest.mark.parametrize(
    "change,named",
    [
        (lambda d: d.update(schema="nestplan.plan/0"), "schema"),
        (lambda d: d["parallel"].update(zero_stage=2), "ZeRO"),
        (lambda d: d["parallel"].update(zero_stage=4), "parallel.zero_stage"),
        (lambda d: d.update(model=7), "'model'"),
        (lambda d: d.update(cluster="h100\nrm -rf ~"), "cluster"),
        (lambda d: d["job"].update(dtype="int4"), "job.dtype"),
        (lambda d: d["parallel"].update(tp=True), "parallel.tp"),
        (lambda d: d["parallel"].update(tp=2.0), "parallel.tp"),
        (lambda d: d["job"].update(seq_len=10**30), "job.seq_len"),
        (lambda d: d["parallel"].update(sp="yes"), "parallel.sp"),
        (lambda d: d["parallel"].update(recompute=["full"]), "parallel.recompute"),
        (lambda d: d["parallel"]["layers_per_stage"].__setitem__(0, 8.0), "parallel.layers_per_stage[0]"),
        (lambda d: d["placement"]["axis_order"].__setitem__(0, ["tp"]), "placement.axis_order"),
        (lambda d: d["placement"].update(axis_order="tpcpepdppp"), "placement.axis_order"),
    ],
)
def test_bad_plans_one_line_exit_2(capsys, tmp_path, change, named) -> None:
    plan = _plan("llama2-7b", 64, ParallelDims(tp=2, pp=4, dp=8), 4096).to_dict()
    change(plan)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan))
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "deepspeed", "--out", str(tmp_path / "o")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "0.5"])
def test_plan_object_prediction_must_be_finite(value) -> None:
    """A plan object handed to the reader in Python (no file reader in between) is checked field by field."""
    plan = _plan("llama2-7b", 64, ParallelDims(tp=2, pp=4, dp=8), 4096).to_dict()
    plan["prediction"]["mfu"] = value
    with pytest.raises(ConfigError, match="prediction.mfu"):
        Plan.from_dict(plan)


def test_unknown_framework(capsys, tmp_path) -> None:
    code, _, err = run_cli(
        capsys,
        [
            "plan",
            "--model",
            "bert-large",
            "--cluster",
            "v100-spine-leaf",
            "--global-batch-size",
            "64",
            "--export",
            "jax",
            "--out",
            str(tmp_path),
        ],
    )
    assert code == 2 and "unknown framework 'jax'" in err
