"""Defects found by trying nestplan as a new user would (issue 13), one test each:
1. an export re-truncated the cluster it was given to the devices the plan uses;
2. the plan JSON did not carry the job's optimizer, gradient dtype and flash attention, so exports
   of it ran Adam with flash attention whatever was costed;
3. interleaved 1F1B with as many microbatches as stages was charged too few microbatches in flight;
4. the search cached ZeRO-2 terms without the replica count, and skipped a configuration's other
   ZeRO-2 replica counts once one fitted."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.memory import in_flight_microbatches
from nestplan.cost.schedules.periodic import FORWARD, simulate
from nestplan.cost.terms import graph_terms
from nestplan.errors import ConfigError
from nestplan.export import deepspeed, megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.job import Job, Optimizer
from nestplan.plan import SCHEMA_V1, Plan
from nestplan.search.engine import run
from nestplan.search.physical import Group, PhysicalSearchModel
from nestplan.strategy.subgraph import SubGraph
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, Schedule, ZeroStage
from nestplan.strategy.placement import STAGE_MAJOR
from nestplan.settings import SETTING_NAMES, RunSettings

# the issue's case: the planner leaves 4 of the 16 devices idle (dp 12), which no dgx-a100 truncation allows
ISSUE_PLAN = [
    "plan",
    "--model",
    "llama3-8b",
    "--cluster",
    "dgx-a100",
    "--devices",
    "16",
    "--global-batch-size",
    "12",
    "--seq-len",
    "2048",
]


# ---------------------------------------------------------------- 1. the cluster an export is given


def _idle_devices_plan(job: Job) -> Plan:
    """A plan on 12 of dgx-a100's 16 devices (dp 12), made on the 16-device cluster."""
    spec = api.resolve_model("llama3-8b")
    cluster = api.resolve_cluster("dgx-a100", 16)
    pred = evaluate_plan(spec, cluster, ParallelDims(dp=12, zero=1), job)
    return api.Evaluation(spec, cluster, job, pred, 0.0).plan


def test_plan_and_export_on_fewer_devices_than_the_cluster(capsys, tmp_path) -> None:
    code, out, err = run_cli(capsys, ISSUE_PLAN + ["--json", "--export", "megatron", "--out", str(tmp_path / "a")])
    assert code == 0, err
    data = json.loads(out)
    assert data["devices_used"] < data["devices_total"] == 16
    assert (tmp_path / "a" / "launch_megatron.sh").exists()
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "megatron", "--out", str(tmp_path / "b")])
    assert code == 0, err
    assert (tmp_path / "a" / "launch_megatron.sh").read_text() == (tmp_path / "b" / "launch_megatron.sh").read_text()


def test_export_uses_the_cluster_object_it_is_given(tmp_path) -> None:
    plan = _idle_devices_plan(Job(global_batch_size=12, seq_len=2048))
    assert plan.devices_used == 12 and plan.cluster.devices == 16
    for framework in ("megatron", "torchtitan", "deepspeed", "nemo"):
        paths, _ = api.export_plan(plan, framework, tmp_path / framework)
        assert paths
    named = Plan.from_dict(plan.to_dict(), cluster="dgx-a100")  # a cluster named: loaded with 16 devices
    assert named.cluster == plan.cluster
    paths, _ = api.export_plan(named, "megatron", tmp_path / "named")
    assert paths[0].read_text() == (tmp_path / "megatron" / "launch_megatron.sh").read_text()


def test_export_refuses_a_cluster_smaller_than_the_plan() -> None:
    plan = _idle_devices_plan(Job(global_batch_size=12, seq_len=2048))
    with pytest.raises(ConfigError, match="uses 12 devices but cluster"):
        dataclasses.replace(plan, cluster=api.resolve_cluster("dgx-a100", 8))
    with pytest.raises(ConfigError, match="uses 12 devices but cluster"):
        Plan.from_dict(plan.to_dict(), cluster=api.resolve_cluster("dgx-a100", 8))


def test_plan_json_devices_total_is_checked() -> None:
    plan = _idle_devices_plan(Job(global_batch_size=12, seq_len=2048)).to_dict()
    for value, named in ((8, "devices_total"), (None, "'devices_total'"), (16.0, "devices_total")):
        bad = json.loads(json.dumps(plan))
        if value is None:
            del bad["devices_total"]
        else:
            bad["devices_total"] = value
        with pytest.raises(ConfigError, match=named):
            Plan.from_dict(bad)


# ---------------------------------------------------------------- 2. the job's settings in the plan JSON

SGD_EAGER = Job(
    global_batch_size=12,
    seq_len=2048,
    optimizer=Optimizer.SGD,
    settings=RunSettings(flash_attention=False, grad_dtype="bf16"),
)


def test_plan_json_carries_every_job_setting() -> None:
    plan = _idle_devices_plan(SGD_EAGER).to_dict()
    what = {"global_batch_size": 12, "seq_len": 2048, "dtype": "bf16", "optimizer": "sgd"}
    settings = {name: plan["job"][name] for name in SETTING_NAMES}
    assert plan["job"] == {**what, **settings}  # what is trained, and every run setting by name
    assert settings == {**RunSettings().to_dict(), "grad_dtype": "bf16", "flash_attention": False}
    assert settings["cp_comm_type"] == "p2p" and settings["fp8_recipe"] is None  # enums as their strings
    assert Plan.from_dict(plan).job == SGD_EAGER


def test_cli_plan_exports_the_optimizer_and_attention_it_costed(capsys, tmp_path) -> None:
    code, _, err = run_cli(
        capsys, ISSUE_PLAN + ["--optimizer", "sgd", "--no-flash", "--export", "megatron", "--out", str(tmp_path)]
    )
    assert code == 0, err
    text = (tmp_path / "launch_megatron.sh").read_text()
    assert "--optimizer sgd" in text and "--attention-backend unfused" in text
    assert "--optimizer adam" not in text and "--attention-backend flash" not in text


def _inputs(job: Job) -> ExportInput:
    return ExportInput(_idle_devices_plan(job), "test")


def _pinned(name: str) -> set[str]:
    lines = (Path(megatron.__file__).parent / name).read_text().splitlines()
    return {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}


def test_every_exporter_uses_the_job_settings() -> None:
    inp = _inputs(SGD_EAGER)
    flags = dict(megatron.all_flags(inp)[0])
    assert flags["--optimizer"] == "sgd" and flags["--attention-backend"] == "unfused"
    assert "--grad-reduce-in-bf16" in flags and "--accumulate-allreduce-grads-in-fp32" not in flags
    assert set(flags) <= _pinned("megatron_flags.txt")
    items = dict(nemo.overrides(inp)[0])
    assert items["optimizer.optimizer"] == "sgd" and items["model.attention_backend"] == "unfused"
    assert set(items) <= _pinned("megatron_bridge_keys.txt")
    _, _, notes = torchtitan.all_flags(inp)
    assert any("costed sgd" in n for n in notes) and any("attention without one" in n for n in notes)
    assert any("costed bf16 gradients" in n for n in notes)
    cfg = deepspeed.config(inp.plan)
    assert cfg["optimizer"] == {"type": "SGD"} and cfg["zero_allow_untested_optimizer"] is True
    assert cfg["data_types"] == {"grad_accum_dtype": "bf16"}
    assert any("attention without a fused kernel" in n for n in deepspeed.notes_for(inp))


def test_default_job_settings_export_as_before() -> None:
    inp = _inputs(Job(global_batch_size=12, seq_len=2048))
    flags = dict(megatron.all_flags(inp)[0])
    assert flags["--optimizer"] == "adam" and flags["--attention-backend"] == "flash"
    assert "--accumulate-allreduce-grads-in-fp32" in flags
    _, _, notes = torchtitan.all_flags(inp)
    assert not any("costed" in n and ("adam" in n or "gradients" in n or "attention" in n) for n in notes)
    cfg = deepspeed.config(inp.plan)
    assert cfg["optimizer"] == {"type": "Adam"} and "zero_allow_untested_optimizer" not in cfg


def test_an_older_plan_without_the_settings_reads_as_adam_with_flash() -> None:
    plan = _idle_devices_plan(SGD_EAGER).to_dict()
    plan["schema"] = SCHEMA_V1
    for key in ("grad_dtype", "optimizer", "flash_attention"):
        del plan["job"][key]
    job = Plan.from_dict(plan).job
    assert (job.optimizer, job.settings.flash_attention, job.settings.grad_dtype) == (Optimizer.ADAM, True, "fp32")


@pytest.mark.parametrize(
    "key,value",
    [
        ("optimizer", "lamb"),
        ("optimizer", 1),
        ("grad_dtype", "int8"),
        ("flash_attention", "yes"),
        ("flash_attention", 1),
    ],
)
def test_job_settings_outside_their_allowed_values_are_refused(key, value) -> None:
    plan = _idle_devices_plan(Job(global_batch_size=12, seq_len=2048)).to_dict()
    plan["job"][key] = value
    with pytest.raises(ConfigError, match=f"job.{key}") as err:
        Plan.from_dict(plan)
    assert err.value.field == f"job.{key}"


def test_exporters_check_the_optimizer_themselves(monkeypatch) -> None:
    """Defence in depth: an optimizer nestplan costs but an exporter does not know (here SGD, with the
    exporters' tables narrowed to Adam) is refused by Megatron-LM, NeMo and DeepSpeed, not written."""
    monkeypatch.setattr(megatron, "OPTIMIZERS", ("adam",))
    monkeypatch.setattr(deepspeed, "OPTIMIZERS", {"adam": "Adam"})
    inp = _inputs(SGD_EAGER)
    for fn in (megatron.export, nemo.export, deepspeed.export):
        with pytest.raises(ConfigError, match="optimizer"):
            fn(inp)


# ---------------------------------------------------------------- 3. microbatches in flight

CASES = (
    [(Schedule.ONE_F_ONE_B, p, m, 1) for p in (1, 2, 3, 4, 8) for m in (1, 2, p, p + 3, 3 * p)]
    + [(Schedule.GPIPE, p, m, 1) for p in (1, 2, 4, 8) for m in (1, 3, p, 2 * p + 1)]
    + [(Schedule.INTERLEAVED, p, m, v) for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p) for v in (2, 3, 4)]
)


def _held_from_timeline(timeline, stage: int) -> int:
    """The most microbatch-chunks whose forward has run and whose backward has not, on one stage."""
    mine = timeline.stage == stage
    ends, kinds = timeline.end_s[mine], timeline.kind[mine]
    order = np.argsort(ends, kind="stable")
    return int(np.cumsum(np.where(kinds[order] == FORWARD, 1, -1)).max())


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_in_flight_microbatches_match_the_simulated_schedule(schedule, p, m, v) -> None:
    rng = np.random.default_rng(p * 1000 + m * 10 + v)
    fwd, bwd = rng.uniform(0.5, 1.5, p), rng.uniform(1.0, 3.0, p)
    _, timeline = simulate(fwd, bwd, m, schedule, v, record=True)
    for stage in range(p):
        assert in_flight_microbatches(schedule, stage, p, m, v) * v == _held_from_timeline(timeline, stage), stage


def test_in_flight_microbatches_work_on_arrays() -> None:
    """The search's tables ask for every (depth, stage) at once: the same numbers elementwise."""
    depth, stage = np.arange(1, 9)[:, None], np.arange(8)[None, :]
    for schedule, v in ((Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2)):
        table = in_flight_microbatches(schedule, stage, depth, 4, v)
        for p in range(1, 9):
            assert [table[p - 1, s] for s in range(p)] == [
                in_flight_microbatches(schedule, s, p, 4, v) for s in range(p)
            ]


def test_interleaved_with_as_many_microbatches_as_stages_holds_them_all() -> None:
    """Llama-2-7B tp8 pp4 v2, 4 microbatches: every forward runs first, so every stage holds the
    activations of all 4 microbatches, as GPipe does."""
    model = api.resolve_model("llama2-7b")
    cluster = api.resolve_cluster("h100-spine-leaf", 32)
    job = Job(global_batch_size=4, seq_len=4096)
    base = dict(tp=8, sp=True, pp=4, dp=1)
    interleaved = evaluate_plan(model, cluster, ParallelDims(**base, schedule="interleaved", virtual_stages=2), job)
    gpipe = evaluate_plan(model, cluster, ParallelDims(**base, schedule="gpipe"), job)
    assert interleaved.num_microbatches == 4
    for a, b in zip(interleaved.stages, gpipe.stages):
        assert a.memory_bytes["activations"] == pytest.approx(b.memory_bytes["activations"], rel=1e-12)


# ---------------------------------------------------------------- 4. ZeRO-2 in the search


def test_zero2_terms_are_cached_per_replica_count() -> None:
    """GPT-3 175B tp8 on 128 H100s: a ZeRO-2 block's exposed reduce-scatter is 0 with one replica
    and tens of ms with 16; asked in that order, the search must not reuse the first."""
    model, cluster = api.resolve_model("gpt3-175b"), api.resolve_cluster("h100-spine-leaf", 128)
    job = Job(global_batch_size=256, seq_len=2048)
    cost = PhysicalSearchModel(model, cluster, job, 128)
    sub = SubGraph(tp=8, sp=True, recompute=Recompute.NONE)
    seen = []
    for d in (1, 16):
        g = Group(sub, STAGE_MAJOR, ZeroStage.GRADIENTS, d, 256 // d, 4)
        fresh = graph_terms(model, cluster, g.dims(), job, cost._groups(g, 1))
        assert cost.terms(g) == fresh
        seen.append(cost.terms(g).blocks[model.block_kind(0)].components["zero_comm"])
    assert seen[0] == 0.0 < seen[1]


@dataclass
class _Stats:
    solve_time_s: float = 0.0


@dataclass
class _RecordingEngine:
    """Runs nothing: records the groups it is asked for; a group 'fits' when its name says so."""

    asked: list = field(default_factory=list)
    stats: _Stats = field(default_factory=_Stats)

    def run_group(self, group, key) -> bool:
        self.asked.append(group)
        return group.endswith("fits")

    def best(self) -> list:
        return []


def test_escalation_searches_every_replica_count_of_the_first_stage_that_fits() -> None:
    groups = [
        ("a", ("a", 0, 1), "z0 d1", 0),
        ("a", ("a", 1, 1), "z1 d1", 1),
        ("a", ("a", 2, 1), "z2 d1 fits", 2),
        ("a", ("a", 2, 2), "z2 d2", 2),
        ("a", ("a", 2, 4), "z2 d4 fits", 2),
        ("a", ("a", 3, 1), "z3 d1", 3),
        ("a", ("a", 3, 2), "z3 d2", 3),
        ("b", ("b", 0, 1), "b z0 fits", 0),
        ("b", ("b", 2, 1), "b z2", 2),
    ]
    engine = _RecordingEngine()
    run(engine, groups)
    assert engine.asked == ["z0 d1", "z1 d1", "z2 d1 fits", "z2 d2", "z2 d4 fits", "b z0 fits"]
