"""The typed plan (``nestplan.plan.Plan``): the plan JSON written and read back losslessly (schema
/2, with the model's config and the cluster's definition), /1 plans still read, every embedded
field checked by the model and cluster readers, and ``nestplan export plan.json`` with nothing else
given for a config.json model on a cluster file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cluster import cluster_from_dict, cluster_names
from nestplan.cost.evaluator import evaluate_plan
from nestplan.errors import ConfigError
from nestplan.job import Job, Optimizer
from nestplan.model import model_names
from nestplan.model.config import config_dict
from nestplan.plan import SCHEMA, SCHEMA_V1, Plan
from nestplan.settings import Fp8Recipe, RunSettings
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = str(ROOT / "bench" / "qwen3-235b-a22b.json")
JOB = Job(global_batch_size=16, seq_len=512)
V1_ONLY = ("model_config", "model_calibration", "cluster_definition", "device_order")


def _two_stages(model) -> ParallelDims:
    """pp 2 x dp 2 (ep 2 for a mixture of experts), the layers split unevenly where they are odd."""
    half = model.num_layers // 2
    return ParallelDims(pp=2, dp=2, ep=2 if model.is_moe else 1, layers_per_stage=(half, model.num_layers - half))


def _plan(
    model,
    cluster,
    dims: ParallelDims | None = None,
    job: Job = JOB,
    devices: int | None = None,
    order=("tp", "cp", "ep", "dp", "pp"),
) -> Plan:
    spec = api.resolve_model(model)
    dims = dims or _two_stages(spec)
    return api.evaluate_full(spec, cluster, dims, job, devices=devices or dims.devices, axis_order=order).plan


def _idle_plan() -> Plan:
    """Llama 3 8B on 12 of the 16 dgx-a100 devices it was planned on (dp 12)."""
    spec, cluster, job = api.resolve_model("llama3-8b"), api.resolve_cluster("dgx-a100", 16), Job(12, 2048)
    pred = evaluate_plan(spec, cluster, ParallelDims(dp=12, zero=1), job)
    return api.Evaluation(spec, cluster, job, pred, 0.0).plan


def _saved(plan: Plan) -> dict:
    """The plan JSON as a file holds it (JSON text and back)."""
    return json.loads(json.dumps(plan.to_dict(), allow_nan=False))


def _round_trip(plan: Plan) -> None:
    data = _saved(plan)
    assert data["schema"] == SCHEMA
    read = Plan.from_dict(data)
    assert read == plan
    assert read.to_dict() == data
    assert read.prediction is None and plan.prediction is not None  # nothing evaluated on reading


# ------------------------------------------------------------------ round trips

CLUSTER_FILE = {
    "name": "my-cluster",
    "accelerator": "h100-sxm-80gb",
    "levels": [
        {"name": "node", "size": 4, "bandwidth_GBps": 450, "latency_us": 1, "kind": "nvlink4"},
        {
            "name": "leaf",
            "size": 4,
            "bandwidth_GBps": 48.7,
            "latency_us": 2.7,
            "oversubscription": 2.0,
            "kind": "infiniband",
        },
    ],
}
OWN_ACCELERATOR = {
    "name": "chip",
    "peak_bf16_TFLOPS": 333.3,
    "peak_fp32_TFLOPS": 41.7,
    "hbm_GB": 96,
    "hbm_bandwidth_TBps": 3.35,
    "matmul_efficiency": 0.77,
    "matmul_half_dim": 64,
    "memory_efficiency": 0.83,
    "reserved_GiB": 1.5,
    "source": "a made-up datasheet",
}
TORUS = {
    "name": "ring-of-rings",
    "accelerator": "tpuv4-nest",
    "torus": {"dims": [4, 4], "link_bandwidth_GBps": 45.3, "hop_latency_us": 0.7, "kind": "ici"},
}
# NVLink pairs (0, 2) and (1, 3) on one switch: the ranks are renumbered (device_order 0, 2, 1, 3)
GRAPH = {
    "name": "pairs",
    "accelerator": "a100-80gb",
    "graph": {
        "devices": 4,
        "edges": [
            [0, 2, 100, 1.3],
            [1, 3, 100, 1.3],
            [0, 4, 12.5, 2.1],
            [1, 4, 12.5, 2.1],
            [2, 4, 12.5, 2.1],
            [3, 4, 12.5, 2.1],
        ],
    },
}


@pytest.mark.parametrize("model", [*model_names(), QWEN3])
def test_round_trip_every_catalog_model_and_a_config_json(model) -> None:
    _round_trip(_plan(model, "h100-spine-leaf"))


@pytest.mark.parametrize("cluster", cluster_names())
def test_round_trip_every_catalog_cluster(cluster) -> None:
    job = dataclasses.replace(JOB, dtype=api.default_dtype(api.resolve_cluster(cluster)))  # fp16 on V100s
    _round_trip(_plan("llama2-7b", cluster, ParallelDims(tp=2, pp=2, dp=2), job=job))


@pytest.mark.parametrize(
    "definition",
    [CLUSTER_FILE, CLUSTER_FILE | {"accelerator": OWN_ACCELERATOR}, TORUS, GRAPH],
    ids=["levels", "own accelerator", "torus", "graph"],
)
def test_round_trip_cluster_files(definition, tmp_path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(definition))
    cluster = api.resolve_cluster(str(path))
    plan = _plan(
        "llama2-7b", cluster, ParallelDims(tp=2, dp=2), job=Job(global_batch_size=16, seq_len=512, dtype="bf16")
    )
    _round_trip(plan)
    assert cluster_from_dict(plan.to_dict()["cluster_definition"]).topology == plan.cluster.topology
    assert Plan.from_dict(_saved(plan)).cluster.device_order == ((0, 2, 1, 3) if definition is GRAPH else None)


def test_round_trip_a_cluster_cut_to_fewer_devices_than_it_has() -> None:
    """Planned on 16 of dgx-a100's devices, 12 used: the cluster read back has 16, not 12 or all."""
    plan = _idle_plan()
    _round_trip(plan)
    assert Plan.from_dict(_saved(plan)).cluster.devices == 16


JOBS = [
    Job(16, 512, dtype=dtype, optimizer=optimizer, settings=RunSettings(grad_dtype=grad, flash_attention=flash))
    for dtype, grad in (("bf16", "fp32"), ("fp16", "fp16"), ("fp32", "fp32"), ("bf16", "bf16"))
    for optimizer in Optimizer
    for flash in (True, False)
]
JOBS += [
    Job(16, 512, settings=RunSettings(grad_dtype="bf16", tp_comm_overlap=True, fp8_recipe=recipe, fp8_params=True))
    for recipe in Fp8Recipe
]
JOBS += [Job(16, 512, settings=RunSettings(overlap_grad_reduce=False, overlap_param_gather=False))]


@pytest.mark.parametrize(
    "job",
    JOBS,
    ids=lambda j: (
        f"{j.dtype}-{j.settings.grad_dtype}-{j.optimizer.value}-{j.settings.flash_attention}-"
        f"{j.settings.fp8_recipe}-{j.settings.tp_comm_overlap}-{j.settings.overlap_grad_reduce}"
    ),
)
def test_round_trip_every_job_setting(job) -> None:
    cluster = "dgx-b200" if job.settings.fp8_recipe is Fp8Recipe.MXFP8 else "h100-spine-leaf"  # MXFP8: Blackwell
    plan = _plan("llama2-7b", cluster, ParallelDims(tp=2, sp=True, pp=2, dp=2), job=job)
    _round_trip(plan)
    assert Plan.from_dict(_saved(plan)).job == job


DIMS = [
    ParallelDims(pp=4, dp=2, schedule=Schedule.GPIPE, recompute=Recompute.FULL),
    ParallelDims(pp=4, dp=2, schedule=Schedule.INTERLEAVED, virtual_stages=2, layers_per_stage=(8, 6, 8, 10)),
    ParallelDims(tp=2, sp=True, pp=2, dp=2, zero=ZeroStage.OPTIMIZER, recompute=Recompute.SELECTIVE),
    ParallelDims(tp=2, cp=2, dp=2, zero=ZeroStage.GRADIENTS, micro_batch_size=2),
    ParallelDims(dp=8, zero=ZeroStage.PARAMETERS),
]


@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d.schedule.value}-z{int(d.zero)}-{d.recompute.value}")
@pytest.mark.parametrize("order", [("tp", "cp", "ep", "dp", "pp"), ("tp", "cp", "ep", "pp", "dp")])
def test_round_trip_every_schedule_zero_and_rank_order(dims, order) -> None:
    plan = _plan("llama2-7b", "h100-spine-leaf", dims, order=order)
    _round_trip(plan)
    assert Plan.from_dict(_saved(plan)).dims.layers_per_stage == plan.dims.layers_per_stage


def test_round_trip_a_calibrated_model() -> None:
    spec = dataclasses.replace(api.resolve_model("llama2-7b"), traced_flops_scale=1.0213, traced_activation_scale=0.97)
    plan = _plan(spec, "h100-spine-leaf")
    _round_trip(plan)
    assert Plan.from_dict(_saved(plan)).model.traced_activation_scale == 0.97


def test_a_model_no_config_json_describes_is_refused_by_name() -> None:
    odd = dataclasses.replace(api.resolve_model("llama2-7b"), norm="layernorm")
    with pytest.raises(ConfigError, match="llama config.json: its norm 'layernorm'") as err:
        config_dict(odd)
    assert err.value.field == "norm"


# ------------------------------------------------------------------ schema /1


def _v1(plan: Plan) -> dict:
    data = _saved(plan)
    for key in V1_ONLY:
        data.pop(key, None)
    return data | {"schema": SCHEMA_V1}


def test_v1_plans_resolve_model_and_cluster_by_name() -> None:
    plan = _idle_plan()
    assert Plan.from_dict(_v1(plan)) == plan


def test_v1_plan_of_a_config_json_needs_the_model_given(capsys, tmp_path) -> None:
    """A /1 plan names a config.json model by its name only: one line, as before; --model fixes it."""
    config = tmp_path / "my-qwen3-moe.json"  # a name the catalog does not hold
    config.write_text(Path(QWEN3).read_text())
    plan = _plan(str(config), "h100-spine-leaf")
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(_v1(plan)))
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "megatron", "--out", str(tmp_path / "a")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "unknown model 'my-qwen3-moe'" in err
    code, _, err = run_cli(
        capsys, ["export", str(saved), "--framework", "megatron", "--out", str(tmp_path / "b"), "--model", str(config)]
    )
    assert code == 0, err
    assert Plan.from_dict(_v1(plan), model=str(config)) == plan


# ------------------------------------------------------------------ the plan file, read strictly


def _changed(data: dict, path: str, value) -> dict:
    """``data`` with the field at ``path`` (dots and [i]) set to ``value``, or removed when value is ...."""
    out = json.loads(json.dumps(data))
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return out


@pytest.fixture(scope="module")
def saved() -> dict:
    return _saved(_plan("mixtral-8x7b", "h100-spine-leaf"))


@pytest.mark.parametrize(
    "path, value, named",
    [
        ("schema", "nestplan.plan/3", "schema"),
        ("model_config", ..., "'model_config'"),
        ("model_config", [1], "model_config"),
        ("model_config.hidden_size", 4096.0, "hidden_size"),
        ("model_config.num_local_experts", 10**6, "num_local_experts"),
        ("model_config.model_type", "t5", "model_type"),
        ("model_calibration.traced_flops_scale", 0.0, "model_calibration.traced_flops_scale"),
        ("model_calibration", ..., "'model_calibration'"),
        ("cluster_definition", ..., "'cluster_definition'"),
        ("cluster_definition.levels.0.size", 0, "size"),
        ("cluster_definition.levels.0.bandwidth_GBps", float("1e300"), "bandwidth_GBps"),
        ("cluster_definition.accelerator.hbm_GiB", -1, "hbm_GiB"),
        ("cluster_definition.accelerator.colour", "red", "colour"),
        ("cluster_definition.name", "other", "cluster"),
        ("devices_total", 64, "devices_total"),
        ("device_order", [0, 0], "device_order"),
        ("job.optimizer", ..., "'job.optimizer'"),
        ("stages.1.layers", [0, 7], "stages[1].layers"),
        ("stages.0.devices", 3, "stages[0].devices"),
        ("stages.0.memory_breakdown_bytes.weights", -5.0, "stages[0].memory_breakdown_bytes.weights"),
        ("prediction.breakdown_s", {"a b\u2028": 1.0}, "prediction.breakdown_s term"),
        ("placement.levels_spanned.tp", 99, "placement.levels_spanned.tp"),
        ("placement.pp_boundary_levels", [], "placement.pp_boundary_levels"),
        ("search.candidates", -1, "search.candidates"),
        ("parallel.layers_per_stage", [16, 15], "layers"),
    ],
)
def test_bad_fields_are_refused_by_name(saved, path, value, named) -> None:
    with pytest.raises(ConfigError) as err:
        Plan.from_dict(_changed(saved, path, value))
    assert named in str(err.value) and "\n" not in str(err.value), str(err.value)


# ------------------------------------------------------------------ the command line and the API


def _write_cluster(tmp_path: Path) -> Path:
    """64 H100s: 8 nodes of 8 on one leaf."""
    path = tmp_path / "my-cluster.toml"
    path.write_text(
        'name = "my-cluster"\naccelerator = "h100-sxm-80gb"\n'
        '[[levels]]\nname = "node"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = 1\nkind = "nvlink4"\n'
        '[[levels]]\nname = "leaf"\nsize = 8\nbandwidth_GBps = 50\nlatency_us = 3\nkind = "infiniband"\n'
    )
    return path


def test_export_of_a_config_json_plan_on_a_cluster_file_needs_nothing_else(capsys, tmp_path) -> None:
    """The issue's case: today's "unknown model" is gone; the saved plan exports as `plan --export` does."""
    cluster = _write_cluster(tmp_path)
    args = [
        "plan",
        "--model",
        QWEN3,
        "--cluster",
        str(cluster),
        "--devices",
        "64",
        "--global-batch-size",
        "64",
        "--seq-len",
        "2048",
        "--top",
        "0",
    ]
    code, out, err = run_cli(capsys, args + ["--json", "--export", "megatron", "--out", str(tmp_path / "fresh")])
    assert code == 0, err
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    data = json.loads(out)
    assert data["schema"] == SCHEMA and data["model_config"]["model_type"] == "qwen3_moe"
    # --json prints the plan file itself, its runner-ups and the search's counters (which the plan reader
    # does not read back)
    assert isinstance(data.pop("runners_up"), list) and data.pop("search_stats")["enumerated"] > 0
    assert Plan.from_dict(data).to_dict() == data
    code, out, err = run_cli(capsys, ["export", str(saved), "--framework", "megatron", "--out", str(tmp_path / "d")])
    assert code == 0, err
    script = (tmp_path / "d" / "launch_megatron.sh").read_text()
    assert "# plan: qwen3-235b-a22b on my-cluster, " in script and "--num-experts 128" in script
    assert script == (tmp_path / "fresh" / "launch_megatron.sh").read_text()


def test_plan_export_needs_no_json_round_trip(capsys, tmp_path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("plan --export read the plan back from JSON")

    monkeypatch.setattr(Plan, "from_dict", refuse)
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
            "--top",
            "0",
            "--export",
            "deepspeed",
            "--out",
            str(tmp_path),
        ],
    )
    assert code == 0, err
    assert (tmp_path / "ds_config.json").exists()


def test_a_saved_plan_plots_and_exports(tmp_path) -> None:
    read = Plan.from_dict(_saved(_plan("llama2-7b", "h100-spine-leaf", ParallelDims(tp=2, pp=2, dp=2))))
    paths = api.plot_plan(read, tmp_path / "plots")
    assert [p.name for p in paths] == ["timeline.png", "memory.png", "placement.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    written, _ = api.export_plan(read, "torchtitan", tmp_path / "launch")
    assert written[0].name == "launch_torchtitan.sh"


def test_load_plan_reads_a_file_and_takes_overrides(tmp_path) -> None:
    plan = _idle_plan()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    assert api.load_plan(path) == plan
    bigger = api.resolve_cluster("dgx-a100", 32)
    assert api.load_plan(path, cluster=bigger).cluster == bigger  # a Cluster given is used as it is


def test_compare_takes_objects() -> None:
    spec, cluster = api.resolve_model("bert-large"), api.resolve_cluster("v100-spine-leaf")
    [result] = api.compare([api.CompareCase(spec, cluster, (8,))], baselines=("manual",), global_batch_size=64)
    assert result.title == "bert-large on v100-spine-leaf"
    assert {row.planner for row in result.rows} == {"nestplan", "manual"}
