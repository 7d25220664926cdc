"""Exports that depend on how a framework lays out layers and ranks: torchtitan's stage split and
batch, experts without tensor parallelism, Megatron-core's expert grid and its rank-order limits."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.export import megatron, nemo, torchtitan
from nestplan.export.plan import ExportInput
from nestplan.export.torchtitan import titan_split
from nestplan.job import Job
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.placement import REPLICA_MAJOR, STAGE_MAJOR


def _plan(model: str, devices: int, dims: ParallelDims, seq: int = 4096, batch: int = 1024, order=STAGE_MAJOR) -> Plan:
    job = Job(global_batch_size=batch, seq_len=seq)
    return api.evaluate_full(model, "h100-spine-leaf", dims, job, devices=devices, axis_order=order).plan


def _input(plan: Plan) -> ExportInput:
    return ExportInput(plan, "test")


def _titan(plan: Plan) -> tuple[dict, list[str]]:
    flags, _, notes = torchtitan.all_flags(_input(plan))
    return dict(flags), notes


def test_titan_split_follows_torchtitan() -> None:
    """torchtitan 0.3.0's defaults (one layer fewer on the first and last stage) and the weights that
    give an even or an uneven split."""
    assert titan_split(80, 4, 1, 1) == [20, 21, 20, 19]
    assert titan_split(80, 4, 0, 0) == [20, 20, 20, 20]
    assert titan_split(80, 4, 2, 2) == [19, 21, 21, 19]
    assert titan_split(8, 4, 3, 0) is None  # the first stage would give up more than it has


@pytest.mark.parametrize("split", [(20, 20, 20, 20), (19, 21, 21, 19), (21, 20, 20, 19)])
def test_torchtitan_runs_the_costed_split(split) -> None:
    flags, notes = _titan(_plan("llama3-70b", 256, ParallelDims(tp=8, pp=4, dp=8, layers_per_stage=split)))
    first = flags["--parallelism.pipeline-parallel-first-stage-less-layers"]
    last = flags["--parallelism.pipeline-parallel-last-stage-less-layers"]
    assert titan_split(80, 4, first, last) == list(split)
    assert not any("cannot express" in n for n in notes)


def test_torchtitan_interleaved_stage_count() -> None:
    """Interleaved: ceil((layers + first + last) / layers-per-stage) must be pp x v stages."""
    plan = _plan(
        "mixtral-8x7b",
        128,
        ParallelDims(cp=2, ep=4, pp=4, dp=4, schedule="interleaved", virtual_stages=2),
        seq=8192,
        batch=4096,
    )
    flags, _ = _titan(plan)
    lps = flags["--parallelism.pipeline-parallel-layers-per-stage"]
    weights = (
        flags["--parallelism.pipeline-parallel-first-stage-less-layers"]
        + flags["--parallelism.pipeline-parallel-last-stage-less-layers"]
    )
    assert -(-(32 + weights) // lps) == 8
    assert flags["--parallelism.pipeline-parallel-schedule"] == "Interleaved1F1B"


def test_torchtitan_accumulates_microbatches_without_pipeline() -> None:
    flags, _ = _titan(_plan("llama2-7b", 64, ParallelDims(tp=8, dp=8, micro_batch_size=2), batch=256))
    assert flags["--training.local-batch-size"] == 2  # 16 accumulation steps of 2 x 8 replicas
    assert flags["--training.global-batch-size"] == 256


def test_torchtitan_experts_absorb_tensor_parallelism() -> None:
    plan = _plan("mixtral-8x7b", 64, ParallelDims(tp=2, ep=4, dp=2, pp=4), seq=4096, batch=256)
    flags, notes = _titan(plan)
    assert flags["--parallelism.expert-parallel-degree"] == 8
    assert any("no expert tensor parallelism" in n for n in notes)


def test_torchtitan_refuses_experts_it_cannot_shard(capsys, tmp_path) -> None:
    """Mixtral's 8 experts over ep 4 x tp 4: torchtitan would need 16 whole-expert shards."""
    plan = _plan("mixtral-8x7b", 128, ParallelDims(tp=4, ep=4, dp=2, pp=4), seq=4096, batch=256)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan.to_dict()))
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", "torchtitan", "--out", str(tmp_path / "o")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no expert tensor parallelism" in err


def test_megatron_expert_grid_note_names_the_levels() -> None:
    """Megatron-core's expert groups are ep ranks tp apart (cp folded in), nestplan's tp x cp apart."""
    plan = _plan("mixtral-8x7b", 128, ParallelDims(tp=2, cp=2, ep=4, pp=2, dp=4), seq=8192, batch=1024)
    _, notes = megatron.all_flags(_input(plan))
    note = next(n for n in notes if "expert-parallel group" in n)
    assert "4 ranks 2 apart (within a node)" in note and "4 ranks 4 apart (within a leaf)" in note
    assert "another level" in note
    plan = _plan("mixtral-8x7b", 128, ParallelDims(tp=2, ep=4, pp=2, dp=8), seq=8192, batch=1024)
    assert not any("expert-parallel group" in n for n in megatron.all_flags(_input(plan))[1])


def test_megatron_replica_major_with_experts_needs_ep_equal_cp(tmp_path) -> None:
    """Megatron-core refuses --use-tp-pp-dp-mapping with pp > 1 unless the expert and dense
    data-parallel sizes agree (ep = cp): the export falls back to its default order and says so."""
    plan = _plan("mixtral-8x7b", 128, ParallelDims(ep=4, pp=4, dp=8), order=REPLICA_MAJOR)
    flags, notes = megatron.all_flags(_input(plan))
    assert "--use-tp-pp-dp-mapping" not in dict(flags)
    assert any(n.startswith("RANK LAYOUT DIFFERS") and "needs ep = cp" in n for n in notes)
    _, result = api.export_plan(plan, "megatron", tmp_path)
    assert any("nestplan predicts step" in n for n in result.notes)
    dense = _plan("llama2-7b", 64, ParallelDims(tp=2, pp=4, dp=8), order=REPLICA_MAJOR)
    assert "--use-tp-pp-dp-mapping" in dict(megatron.all_flags(_input(dense))[0])


def test_nemo_sets_the_replica_major_mapping() -> None:
    plan = _plan("llama2-7b", 64, ParallelDims(tp=2, pp=4, dp=8), order=REPLICA_MAJOR)
    items, notes = nemo.overrides(_input(plan))
    assert ("dist.use_tp_pp_dp_mapping", True) in items
    assert not any(n.startswith("RANK LAYOUT") for n in notes)
