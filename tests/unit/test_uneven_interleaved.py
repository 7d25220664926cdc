"""Uneven interleaved layouts: layers given per virtual stage (pp x v counts in model order, chunk c
of stage s = virtual stage c * pp + s), from the command line (NxK shorthand) through the
dimensions, the evaluator, the schedule simulation and the memory rule to the plan JSON, the
planner's end-balanced layouts and the exports."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.cli.parse import MAX_STAGES
from nestplan.cli.parse import parse_layers
from nestplan.cost.evaluator import evaluate_plan
from nestplan.cost.schedules import warmup_forwards
from nestplan.cost.schedules.periodic import BACKWARD, FORWARD, simulate
from nestplan.errors import ConfigError
from nestplan.export import deepspeed, megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.export.torchtitan import titan_split
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.cost.schedules.families import ends_balanced_layout
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Schedule

LLAMA3_LAYOUT = (0,) + (1,) * 126 + (0,)  # Dubey et al. 2024, section 3.3.2: pp 16 x v 8, 126 layers
NEMO_405B_LAYOUT = (1,) + (2,) * 62 + (1,)  # NeMo's 405B recipe: embedding and loss counted as layers, pp 8 x v 8


def _interleaved(pp: int, v: int, layers: tuple[int, ...] | None, **kw) -> ParallelDims:
    return ParallelDims(pp=pp, schedule=Schedule.INTERLEAVED, virtual_stages=v, layers_per_stage=layers, **kw)


# -- the command line -------------------------------------------------------------------------------
def test_shorthand_repeats_a_count() -> None:
    assert parse_layers("1,2x62,1") == NEMO_405B_LAYOUT
    assert parse_layers("0, 1x126 ,0") == LLAMA3_LAYOUT
    assert parse_layers("7,8x14,7") == (7,) + (8,) * 14 + (7,)
    assert parse_layers("3x1") == (3,)
    assert parse_layers(None) is None


@pytest.mark.parametrize(
    "text, needle",
    [
        ("2x0", "--layers-per-stage 0 is out of range; allowed: 1..1024"),
        ("2x", "--layers-per-stage '2x' is not a plain decimal integer or NxK"),
        ("x3", "--layers-per-stage 'x3' is not a plain decimal integer or NxK"),
        ("2X3", "--layers-per-stage '2X3' is not a plain decimal integer or NxK"),
        ("2x3x4", "--layers-per-stage '2x3x4' is not a plain decimal integer or NxK"),
        ("-1,3", "--layers-per-stage '-1' is not a plain decimal integer or NxK"),
        ("1,,2", "--layers-per-stage '' is not a plain decimal integer or NxK"),
        ("1x1000,1x25", f"--layers-per-stage has more than {MAX_STAGES} entries"),
        ("1x99999999999999999999", "--layers-per-stage 99999999999999999999 is out of range"),
    ],
)
def test_shorthand_errors_name_the_option(text, needle) -> None:
    with pytest.raises(ConfigError) as err:
        parse_layers(text)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_evaluates_a_layout_and_refuses_a_bad_one(capsys) -> None:
    base = [
        "evaluate",
        "--model",
        "llama2-7b",
        "--cluster",
        "h100-spine-leaf",
        "--devices",
        "16",
        "--tp",
        "2",
        "--pp",
        "4",
        "--dp",
        "2",
        "--virtual-stages",
        "2",
        "--global-batch-size",
        "64",
        "--json",
    ]
    code, out, _ = run_cli(capsys, base + ["--layers-per-stage", "3,5,3,5x2,3,5,3"])
    assert code == 0
    assert json.loads(out)["parallel"]["layers_per_stage"] == [3, 5, 3, 5, 5, 3, 5, 3]
    code, _, err = run_cli(capsys, base + ["--layers-per-stage", "3,0,4x4,6,7"])
    assert code == 2
    assert err.count("\n") == 1 and "layers-per-stage gives a virtual stage between the first and the last" in err


# -- the dimensions ---------------------------------------------------------------------------------
def test_layers_per_virtual_stage_give_each_stage_its_chunks() -> None:
    d = _interleaved(4, 2, (3, 4, 4, 4, 4, 4, 4, 3))
    assert d.per_virtual_stage
    assert d.virtual_stage_layers(30) == (3, 4, 4, 4, 4, 4, 4, 3)
    assert d.stage_layers(30) == (7, 8, 8, 7)  # chunks 0 and 1 of stage s: entries s and 4 + s
    even = _interleaved(4, 2, (8, 8, 8, 8))
    assert not even.per_virtual_stage
    assert even.virtual_stage_layers(32) == (4,) * 8


def test_a_layout_even_within_every_stage_is_the_per_stage_plan() -> None:
    assert _interleaved(4, 2, (3, 4, 5, 6, 3, 4, 5, 6)) == _interleaved(4, 2, (6, 8, 10, 12))


@pytest.mark.parametrize(
    "pp, v, layers, needle",
    [
        (4, 2, (3, 4, 4), "has 3 entries; allowed: pp 4 or pp x v = 8"),
        (4, 1, (1,) * 8, "has 8 entries; allowed: pp 4 (pp x v entries need v > 1)"),
        (4, 2, (3, 4, 4, 0, 4, 4, 4, 5), "gives a virtual stage between the first and the last no layer"),
        (4, 2, (0, 10, 10, 8), "gives a stage no layer"),
        (4, 2, (-1, 4, 4, 4, 4, 4, 4, 5), "has a negative count -1"),
    ],
)
def test_layouts_that_cannot_run_are_refused(pp, v, layers, needle) -> None:
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    with pytest.raises(ConfigError, match=re.escape(needle)) as err:
        ParallelDims(pp=pp, schedule=schedule, virtual_stages=v, layers_per_stage=layers)
    assert err.value.field == "layers_per_stage"


def test_only_the_ends_may_hold_no_block() -> None:
    """Megatron-LM's layout allows the first virtual stage to hold only the embedding ('E|') and the
    last only the loss ('|L'); Llama 3 ran exactly that."""
    d = _interleaved(16, 8, LLAMA3_LAYOUT)
    assert d.stage_layers(126) == (7,) + (8,) * 14 + (7,)
    with pytest.raises(ConfigError, match="sums to 126 but the model has 128"):
        d.stage_layers(128)


# -- the evaluator ----------------------------------------------------------------------------------
def _llama2(dims: ParallelDims, batch: int = 64):
    model = api.resolve_model("llama2-7b")
    cluster = api.resolve_cluster("h100-spine-leaf", 32)
    job = Job(global_batch_size=batch, seq_len=2048)
    return model, cluster, job, evaluate_plan(model, cluster, dims, job)


def test_evaluator_gives_the_even_plan_for_an_even_layout() -> None:
    base = dict(tp=2, dp=4, sp=True, zero=1)
    _, _, _, per_stage = _llama2(_interleaved(4, 2, None, **base))
    _, _, _, per_virtual = _llama2(_interleaved(4, 2, (4,) * 8, **base))
    assert per_virtual.step_time_s == per_stage.step_time_s
    assert per_virtual.stages == per_stage.stages


def test_chunks_add_up_to_the_stages_of_the_same_blocks() -> None:
    """Per virtual stage, a stage holds the same blocks, embedding and head as the per-stage plan with
    its totals: every component but the transfers, the parameters and the step end agree; the
    transfers differ only in the first chunk receiving and the last sending nothing."""
    base = dict(tp=2, dp=4, sp=True, zero=1)
    _, _, _, uneven = _llama2(_interleaved(4, 2, (3, 5, 3, 5, 5, 3, 5, 3), **base))
    _, _, _, even = _llama2(_interleaved(4, 2, (8, 8, 8, 8), **base))
    for a, b in zip(uneven.stages, even.stages):
        for term, seconds in b.components_s.items():
            if term != "pp_comm":
                assert a.components_s[term] == pytest.approx(seconds, rel=1e-12), term
        assert a.memory_bytes["weights"] == pytest.approx(b.memory_bytes["weights"], rel=1e-12)
    assert uneven.stages[0].components_s["pp_comm"] < even.stages[0].components_s["pp_comm"]
    assert uneven.stages[1].components_s["pp_comm"] == pytest.approx(even.stages[1].components_s["pp_comm"])
    assert uneven.breakdown_s["optimizer"] == pytest.approx(even.breakdown_s["optimizer"], rel=1e-12)
    assert uneven.step_time_s != even.step_time_s


def test_llama3_405b_on_16384_gpus_evaluates() -> None:
    """Llama 3 405B as trained (Dubey et al. 2024, Table 4 and section 3.3.2: tp 8, cp 1, pp 16,
    dp 128 on 16,384 H100s, sequence 8,192, 16M tokens per batch; one layer fewer on the first and
    the last stage, whose first and last chunk hold only the embedding and the head): interleaving
    over 8 chunks removes most of the bubble of 16 stages running 16 microbatches each."""
    model = api.resolve_model("llama3.1-405b")
    cluster = api.resolve_cluster("llama3-h100", 16384)
    job = Job(global_batch_size=2048, seq_len=8192)
    base = dict(tp=8, dp=128, sp=True, zero=1, recompute="full")
    ours = evaluate_plan(model, cluster, _interleaved(16, 8, LLAMA3_LAYOUT, **base), job)
    plain = evaluate_plan(model, cluster, ParallelDims(pp=16, layers_per_stage=(7,) + (8,) * 14 + (7,), **base), job)
    assert ours.num_microbatches == 16
    assert [s.last_layer - s.first_layer + 1 for s in ours.stages] == [7] + [8] * 14 + [7]
    assert ours.stages[0].has_embedding and ours.stages[-1].has_head
    assert ours.fits
    assert ours.breakdown_s["pipeline_bubble"] < 0.25 * plain.breakdown_s["pipeline_bubble"]
    assert ours.step_time_s < plain.step_time_s


# -- the schedule simulation ------------------------------------------------------------------------
def _operation_by_operation(fwd: np.ndarray, bwd: np.ndarray, m: int, v: int) -> float:
    """An independent list simulation of Megatron-LM's interleaved 1F1B: each device takes its next
    operation once its input has arrived, in the order of schedules.py (warm-up forwards, then one
    forward and one backward, then the remaining backwards; forward k runs chunk (k mod p v) div p
    of microbatch (k div p v) p + k mod p, backward k chunk v - 1 minus that)."""
    p = fwd.shape[0]
    total = m * v

    def op(kind: int, k: int) -> tuple[int, int, int]:
        chunk = (k % (p * v)) // p
        return kind, chunk if kind == FORWARD else v - 1 - chunk, (k // (p * v)) * p + k % p

    sequences = []
    for s in range(p):
        w = int(warmup_forwards(Schedule.INTERLEAVED, s, p, m, v))
        seq = [op(FORWARD, k) for k in range(w)]
        for j in range(total - w):
            seq += [op(FORWARD, w + j), op(BACKWARD, j)]
        seq += [op(BACKWARD, k) for k in range(total - w, total)]
        sequences.append(seq)
    done: dict[tuple[int, int, int, int], float] = {}
    free, nxt = [0.0] * p, [0] * p
    while any(nxt[s] < len(sequences[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(sequences[s]):
                kind, c, j = sequences[s][nxt[s]]
                if kind == FORWARD:
                    dep = (s - 1, FORWARD, c, j) if s else ((p - 1, FORWARD, c - 1, j) if c else None)
                else:
                    dep = (s + 1, BACKWARD, c, j) if s < p - 1 else ((0, BACKWARD, c + 1, j) if c < v - 1 else None)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] if dep else 0.0)
                free[s] = done[(s, kind, c, j)] = start + (fwd if kind == FORWARD else bwd)[s, c]
                nxt[s] += 1
                progressed = True
        assert progressed, "the schedule deadlocked"
    return max(free)


@pytest.mark.parametrize("p, v, groups", [(2, 2, 1), (2, 3, 5), (4, 2, 3), (4, 4, 9), (3, 8, 2), (8, 2, 40)])
def test_simulation_with_chunk_times_runs_every_operation(p, v, groups) -> None:
    """Random per-(stage, chunk) times: the fast path (periods skipped), the full recording and an
    independent operation-by-operation run give one makespan."""
    rng = np.random.default_rng(p * 10 + v)
    m = p * groups
    for _ in range(3):
        fwd, bwd = rng.uniform(0.1, 2.0, (p, v)), rng.uniform(0.1, 3.0, (p, v))
        fast, _ = simulate(fwd, bwd, m, Schedule.INTERLEAVED, v)
        full, timeline = simulate(fwd, bwd, m, Schedule.INTERLEAVED, v, record=True)
        assert fast == pytest.approx(full, rel=1e-11)
        assert full == pytest.approx(_operation_by_operation(fwd, bwd, m, v), rel=1e-12)
        took = timeline.end_s - timeline.start_s
        chunk_time = np.where(
            timeline.kind == FORWARD, fwd[timeline.stage, timeline.chunk], bwd[timeline.stage, timeline.chunk]
        )
        assert took == pytest.approx(chunk_time, rel=1e-9)


def test_equal_chunk_times_are_the_per_stage_times() -> None:
    rng = np.random.default_rng(5)
    fwd, bwd = rng.uniform(0.1, 2.0, 4), rng.uniform(0.1, 3.0, 4)
    per_stage, _ = simulate(fwd, bwd, 12, Schedule.INTERLEAVED, 3)
    per_chunk, _ = simulate(
        np.repeat(fwd[:, None] / 3, 3, axis=1), np.repeat(bwd[:, None] / 3, 3, axis=1), 12, Schedule.INTERLEAVED, 3
    )
    assert per_chunk == per_stage


# -- the plan JSON ----------------------------------------------------------------------------------
def _plan(dims: ParallelDims, model: str = "llama2-7b", devices: int = 32, batch: int = 64) -> Plan:
    job = Job(global_batch_size=batch, seq_len=2048)
    return api.evaluate_full(model, "h100-spine-leaf", dims, job, devices=devices).plan


LAYOUT = _interleaved(4, 2, (3, 5, 3, 5, 5, 3, 5, 3), tp=2, dp=4, sp=True, zero=1)


def test_plan_json_keeps_the_layout() -> None:
    plan = _plan(LAYOUT)
    data = plan.to_dict()
    assert data["parallel"]["layers_per_stage"] == [3, 5, 3, 5, 5, 3, 5, 3]
    assert [s["layers"] for s in data["stages"]] == [[0, 7], [8, 15], [16, 23], [24, 31]]
    again = Plan.from_dict(json.loads(json.dumps(data)))
    assert again.dims == plan.dims
    assert again.predicted.step_time_s == plan.predicted.step_time_s


@pytest.mark.parametrize(
    "layers, needle",
    [
        ([3, 5, 3, 5, 5, 3], "has 6 entries; allowed: pp 4 or pp x v = 8"),
        ([3, 5, 0, 5, 5, 3, 5, 6], "gives a virtual stage between the first and the last no layer"),
        ([3, 5, 3, 5, 5, 3, 5, -3], "parallel.layers_per_stage[7]"),
    ],
)
def test_plan_json_refuses_bad_layouts(layers, needle) -> None:
    data = _plan(LAYOUT).to_dict()
    data["parallel"]["layers_per_stage"] = layers
    with pytest.raises(ConfigError) as err:
        Plan.from_dict(data)
    assert needle in str(err.value)
    assert str(err.value.field).startswith("parallel.layers_per_stage")


# -- the planner ------------------------------------------------------------------------------------
def test_end_balanced_layouts_are_the_published_ones() -> None:
    assert ends_balanced_layout(126, 16, 8) == LLAMA3_LAYOUT
    assert ends_balanced_layout(126, 8, 8) == NEMO_405B_LAYOUT
    assert ends_balanced_layout(94, 8, 3) == (3,) + (4,) * 22 + (3,)  # Megatron-Bridge's Qwen3: 24 virtual stages
    assert ends_balanced_layout(126, 8, 3) is None  # 128 is not a multiple of 24
    assert ends_balanced_layout(30, 8, 1) is None  # no interleaving


def test_planner_returns_an_end_balanced_layout() -> None:
    """Llama 3.1 405B on 1,024 H100s (256 sequences of 4,096 tokens): deep pipelines of few
    microbatches per replica, and 126 layers that split into no interleaved stages evenly; with the
    embedding and the head counted as layers they do, and the planner's best plan is such a layout."""
    model = api.resolve_model("llama3.1-405b")
    cluster = api.resolve_cluster("llama3-h100", 1024)
    best = api.plan(model, cluster, Job(global_batch_size=256, seq_len=4096)).best
    d = best.plan
    assert d.per_virtual_stage
    assert d.layers_per_stage == ends_balanced_layout(126, d.pp, d.virtual_stages)
    assert best.fits


# -- the exports ------------------------------------------------------------------------------------
def _megatron_counts(layout: str, pp: int) -> list[int]:
    """Transformer layers per virtual stage as Megatron-LM reads --pipeline-model-parallel-layout
    (pipeline_parallel_layer_layout.py, parse_str_to_list: commas dropped, (...)*n then x*n
    unrolled, '|' separates stages, E first, L last)."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), text)
    stages = text.split("|")
    assert stages[0].startswith("E") and stages[-1].endswith("L") and len(stages) % pp == 0
    assert set("".join(stages)) <= set("EtL") and text.count("E") == text.count("L") == 1
    return [s.count("t") for s in stages]


def _llama3_plan() -> Plan:
    dims = _interleaved(16, 8, LLAMA3_LAYOUT, tp=8, dp=128, sp=True, zero=1, recompute="full")
    job = Job(global_batch_size=2048, seq_len=8192)
    return api.evaluate_full("llama3.1-405b", "llama3-h100", dims, job, devices=16384).plan


@pytest.mark.parametrize("make, pp", [(_llama3_plan, 16), (lambda: _plan(LAYOUT), 4)])
def test_megatron_and_nemo_write_the_layout(make, pp) -> None:
    plan = make()
    flags, _ = megatron.all_flags(ExportInput(plan, "test"))
    given = dict(flags)
    counts = _megatron_counts(given["--pipeline-model-parallel-layout"], pp)
    assert tuple(counts) == plan.dims.layers_per_stage
    assert "--num-virtual-stages-per-pipeline-rank" not in given  # Megatron derives v from the layout
    overrides, _ = nemo.overrides(ExportInput(plan, "test"))
    keys = dict(overrides)
    assert keys["model.pipeline_model_parallel_layout"] == given["--pipeline-model-parallel-layout"]
    assert keys["model.virtual_pipeline_model_parallel_size"] == plan.dims.virtual_stages


def test_llama3_layout_is_short() -> None:
    assert megatron.layout(_llama3_plan()) == "E|(t*1|)*126L"


TITAN_LAYOUT = _interleaved(4, 2, (4, 5, 4, 4, 4, 4, 4, 3), tp=2, dp=4, sp=True, zero=1)  # its split of 32 + 1 + 1


@pytest.mark.parametrize("make", [_llama3_plan, lambda: _plan(TITAN_LAYOUT)])
def test_torchtitan_runs_the_layout(make) -> None:
    """torchtitan splits num_layers + first_less + last_less evenly over its stages (loop order:
    virtual stage i on rank i mod pp; ceil(effective layers / layers-per-stage) stages, or 2 per
    rank without that flag): the flags reproduce the costed counts."""
    plan = make()
    flags, _, notes = torchtitan.all_flags(ExportInput(plan, "test"))
    given = dict(flags)
    first = given["--parallelism.pipeline-parallel-first-stage-less-layers"]
    last = given["--parallelism.pipeline-parallel-last-stage-less-layers"]
    per = given.get("--parallelism.pipeline-parallel-layers-per-stage")
    stages = -(-(plan.model.num_layers + first + last) // per) if per else 2 * plan.dims.pp
    assert stages == plan.dims.pp * plan.dims.virtual_stages
    assert tuple(titan_split(plan.model.num_layers, stages, first, last)) == plan.dims.layers_per_stage
    assert not any("cannot express" in n for n in notes)


def test_deepspeed_refuses_the_layout(capsys, tmp_path) -> None:
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(_plan(LAYOUT).to_dict()))
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "deepspeed", "--out", str(tmp_path / "d")])
    assert code == 2 and err.count("\n") == 1
    assert "cannot export to DeepSpeed" in err and "no interleaved schedule" in err
    with pytest.raises(ConfigError):
        deepspeed.check(_plan(LAYOUT), 32)


@pytest.mark.parametrize("framework", ["megatron", "nemo", "torchtitan"])
def test_exported_scripts_parse(capsys, tmp_path, framework) -> None:
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(_llama3_plan().to_dict()))
    out = tmp_path / framework
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", framework, "--out", str(out)])
    assert code == 0, err
    for script in out.glob("*.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert "layers per virtual stage 0,1x126,0" in script.read_text()


def test_replacing_the_schedule_keeps_the_rules() -> None:
    """A layout per virtual stage stays tied to its v: dropping the interleaving refuses it."""
    with pytest.raises(ConfigError, match="has 8 entries"):
        replace(LAYOUT, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1)
