"""The published runs files (../shared/reference/measured, README there) read by `nestplan validate` from
another folder: every row of the llm-foundry file (tokens/s/GPU, cluster files beside it) and of the
DGX H100 file evaluates. Skipped, saying why, where the shared folder is absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nestplan.validate import validate

MEASURED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "measured"


def _given(name: str) -> Path:
    path = MEASURED / name
    if not path.exists():
        pytest.skip(f"the published runs are not here ({path}): the NEST workspace's shared folder is absent")
    return path


def test_the_llmfoundry_rows_evaluate_from_another_folder(tmp_path, monkeypatch) -> None:
    path = _given("llmfoundry_mpt_fsdp.json")
    monkeypatch.chdir(tmp_path)
    results = validate(path)
    assert len(results) == 60 and [r.problem for r in results if r.run is None] == []
    a100_40gb = [r for r in results if "-a100-40-" in r.id]
    assert len(a100_40gb) == 16 and {r.run.cluster.name for r in a100_40gb} == {"llmfoundry-a100-40gb-roce"}
    published = {row["id"]: row["published"] for row in json.loads(path.read_text())["rows"]}
    for r in results:  # published as tokens/s/GPU, converted to a step time with the row's tokens per step
        assert published[r.id]["metric"] == "tokens_per_s_per_gpu"
        assert r.measured_tokens_per_s_per_gpu == pytest.approx(published[r.id]["value"])
        assert r.run.measured_step_s == pytest.approx(published[r.id]["step_time_s"])


def test_the_dgx_h100_rows_evaluate_from_another_folder(tmp_path, monkeypatch) -> None:
    path = _given("dgxc_benchmarking_h100_v24.11.json")
    monkeypatch.chdir(tmp_path)
    assert [r.problem for r in validate(path) if r.run is None] == []
