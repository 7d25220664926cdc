"""Plots of one plan (`--plot DIR`): files written, and the timeline is the evaluator's step."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.job import Job
from nestplan.report.plots import device_map, step_timeline
from nestplan.strategy.dims import ParallelDims

PNG = b"\x89PNG\r\n\x1a\n"
JOB = Job(global_batch_size=64, seq_len=2048)


@pytest.mark.parametrize(
    "dims",
    [
        ParallelDims(tp=8, pp=4, dp=2, sp=True),
        ParallelDims(tp=4, pp=8, dp=2, schedule="gpipe", recompute="full", layers_per_stage=(3, 4, 4, 4, 4, 4, 4, 5)),
        ParallelDims(tp=8, pp=4, dp=2, schedule="interleaved", virtual_stages=2, zero=1),
    ],
)
def test_timeline_length_is_the_predicted_step_time(dims) -> None:
    """The recorded schedule plus the step end (from the breakdown's dp_sync and optimizer terms)
    is the step time the evaluator predicts with its fast (steady-state skipping) simulation."""
    pred = api.evaluate("llama2-7b", "dgx-a100", dims, JOB)
    step = step_timeline(pred)
    assert step.total_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert step.step_end_s >= 0
    assert len(step.pipeline.stage) == 2 * dims.pp * dims.virtual_stages * pred.num_microbatches


def test_device_map_covers_the_used_devices() -> None:
    dims = ParallelDims(tp=4, pp=4, dp=3, sp=True)
    pred = api.evaluate("llama2-7b", "dgx-a100", dims, Job(global_batch_size=48, seq_len=2048), devices=48)
    stage, replica = device_map(pred, 64)
    assert np.all(stage[:48] >= 0) and np.all(stage[48:] == -1) and np.all(replica[48:] == -1)
    assert np.bincount(stage[:48]).tolist() == [12] * 4
    assert np.bincount(replica[:48]).tolist() == [16] * 3
    assert np.all(stage[:4] == stage[0])  # tp fastest: a tp group is one stage of one replica


def test_plan_plot_files(tmp_path) -> None:
    report = api.plan("bert-large", "v100-spine-leaf", global_batch_size=64)
    paths = report.plot(tmp_path / "plots")
    assert [p.name for p in paths] == ["timeline.png", "memory.png", "placement.png"]
    for p in paths:
        assert p.stat().st_size > 5_000 and p.read_bytes()[:8] == PNG


def test_cli_plot_options(capsys, tmp_path) -> None:
    code, out, _ = run_cli(
        capsys,
        [
            "evaluate",
            "--model",
            "gpt3-175b",
            "--cluster",
            "dgx-a100",
            "--tp",
            "8",
            "--pp",
            "8",
            "--global-batch-size",
            "64",
            "--recompute",
            "full",
            "--plot",
            str(tmp_path / "e"),
        ],
    )
    assert code == 0 and "timeline.png" in out
    code, out, _ = run_cli(
        capsys,
        [
            "plan",
            "--model",
            "bert-large",
            "--cluster",
            "v100-spine-leaf",
            "--global-batch-size",
            "64",
            "--json",
            "--plot",
            str(tmp_path / "p"),
        ],
    )
    assert code == 0 and out.lstrip().startswith("{")
    for d in ("e", "p"):
        assert sorted(f.name for f in (tmp_path / d).iterdir()) == ["memory.png", "placement.png", "timeline.png"]


def test_timeline_of_an_uneven_interleaved_layout_is_the_evaluators() -> None:
    """The plot records the same per-(stage, chunk) schedule the evaluator costs (Llama 3's layout)."""
    from nestplan import api
    from nestplan.cost.evaluator import evaluate_plan
    from nestplan.job import Job
    from nestplan.report.plots import step_timeline
    from nestplan.strategy.dims import ParallelDims

    dims = ParallelDims(
        tp=8,
        sp=True,
        pp=16,
        dp=8,
        zero=1,
        recompute="full",
        schedule="interleaved",
        virtual_stages=8,
        layers_per_stage=(0,) + (1,) * 126 + (0,),
    )
    pred = evaluate_plan(
        api.resolve_model("llama3.1-405b"),
        api.resolve_cluster("llama3-h100", 1024),
        dims,
        Job(global_batch_size=128, seq_len=8192),
    )
    assert pred.stages[0].chunk_forward_s
    pipeline = pred.step_time_s - pred.breakdown_s["dp_sync"] - pred.breakdown_s["optimizer"]
    assert step_timeline(pred).pipeline.makespan_s == pytest.approx(pipeline, rel=1e-9)


def test_a_wide_nvlink_domain_is_drawn_a_cell_per_host() -> None:
    """An NVL72 rack (72 GPUs, hosts of 4) is a row of 18 host cells, not 72 device cells; without hosts, the
    smallest block that keeps a row at most MAX_ROW_CELLS; a DGX node stays a cell per device."""
    from nestplan.network.topology import Level, Topology
    from nestplan.report import plots

    racks = Topology("nvl72", (Level("rack", 72, 900e9, 1e-6), Level("fabric", 8, 50e9, 5e-6)))
    cells = plots._placement_cells(racks, host=4)
    assert (cells.block, cells.per_row, cells.what) == (4, 18, "host of 4 devices (its first device)")
    assert (plots._placement_cells(racks).block, plots._placement_cells(racks).per_row) == (3, 24)
    nodes = Topology("dgx", (Level("node", 8, 450e9, 1e-6), Level("fabric", 32, 50e9, 5e-6)))
    assert (plots._placement_cells(nodes, host=8).block, plots._placement_cells(nodes, host=8).per_row) == (1, 8)


def test_the_nvl72_placement_figure_stays_page_wide(tmp_path) -> None:
    """DeepSeek-V3's 512 GPUs on GB200 NVL72 racks: host cells with a colour scale, under ~1,700 px wide."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    dims = ParallelDims(tp=2, sp=True, ep=16, etp=1, pp=4, dp=4, layers_per_stage=(15, 16, 15, 15))
    evaluation = api.evaluate_full(
        "deepseek-v3", "gb200-nvl72", dims, Job(global_batch_size=64, seq_len=4096), devices=512
    )
    paths = evaluation.plot(tmp_path)
    with Image.open(paths[2]) as figure:
        assert figure.size[0] <= 1700
