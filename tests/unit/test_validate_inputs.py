"""`nestplan validate`'s inputs as a user relies on them: both published metrics, every key known or refused
by name, files relative to the runs file, the model by name or file, measured memory, bounded values and
work, and the --tolerance verdict."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli
from test_validate import GOOD, LLAMA, _write

from nestplan.errors import ConfigError
from nestplan.units import GiB
from nestplan.validate import MAX_CHUNKS, misses, read_runs, validate
from nestplan.validate import rows as rows_module

TOKENS_PER_STEP = GOOD["global_batch"] * GOOD["seq_len"]
CLUSTER_TOML = """
name = "small-h100"
accelerator = "h100-sxm-80gb"

[[levels]]
name = "node"
size = 8
bandwidth_GBps = 450
latency_us = 1

[[levels]]
name = "fabric"
size = 4
bandwidth_GBps = 50
latency_us = 5
"""


def _by_id(results) -> dict:
    return {r.id: r for r in results}


def _published(**given) -> dict:
    return GOOD | {"id": given.pop("id", "row"), "published": given}


def test_tokens_per_gpu_is_converted_with_the_rows_tokens_per_step(tmp_path) -> None:
    tokens = _published(id="tokens", metric="tokens_per_s_per_gpu", value=TOKENS_PER_STEP / 2.0 / GOOD["gpus"])
    step = _published(id="step", metric="step_time_s", value=2.0)
    results = _by_id(validate(_write(tmp_path, [tokens, step])))
    assert results["tokens"].run.measured_step_s == pytest.approx(2.0)
    assert results["tokens"].error == pytest.approx(results["step"].error)


def test_a_derived_figure_must_agree_with_the_value(tmp_path) -> None:
    per_gpu = TOKENS_PER_STEP / 2.0 / GOOD["gpus"]
    rounded = _published(id="rounded", metric="step_time_s", value=2.0, tokens_per_s_per_gpu=round(per_gpu * 1.005))
    typo = _published(id="typo", metric="step_time_s", value=2.0, tokens_per_s_per_gpu=per_gpu / 10)
    own = _published(id="own", metric="tokens_per_s_per_gpu", value=per_gpu, step_time_s=20.0)
    results = _by_id(validate(_write(tmp_path, [rounded, typo, own])))
    assert results["rounded"].run is not None
    assert "'published.tokens_per_s_per_gpu'" in results["typo"].problem and "1%" in results["typo"].problem
    assert "'published.step_time_s' is 20" in results["own"].problem


def test_unknown_keys_are_refused_by_name_at_every_level(tmp_path) -> None:
    misspelt = _published(id="misspelt", metric="step_time_s", valeu=1.0)
    metric = _published(id="metric", metric="seconds", value=1.0)
    results = _by_id(validate(_write(tmp_path, [GOOD, misspelt, metric])))
    assert results["good"].run is not None
    assert "unknown field 'published.valeu'" in results["misspelt"].problem
    assert "'published.metric' is 'seconds'; allowed: step_time_s, tokens_per_s_per_gpu" in results["metric"].problem
    path = tmp_path / "top.json"
    path.write_text(json.dumps({"rows": [GOOD], "sources": {}}))
    with pytest.raises(ConfigError, match="unknown field 'sources'"):
        validate(path)


@pytest.mark.parametrize(
    ("metric", "value"),
    [
        ("step_time_s", 5e-324),
        ("step_time_s", 1e300),
        ("tokens_per_s_per_gpu", 1e308),
        ("tokens_per_s_per_gpu", 5e-324),
    ],
)
def test_published_values_are_bounded_so_every_figure_is_finite(capsys, tmp_path, metric, value) -> None:
    path = _write(tmp_path, [GOOD, _published(id="extreme", metric=metric, value=value)])
    code, out, err = run_cli(capsys, ["validate", path, "--json"])
    assert code == 0, err
    extreme = json.loads(out)["rows"][1]
    assert not extreme["evaluated"] and "is outside [1e-06, 1e+07] s" in extreme["problem"]


def test_the_work_is_bounded_before_any_row_is_evaluated(tmp_path, monkeypatch) -> None:
    deep = GOOD | {"pp": 1024, "vp": 1, "dp": 1, "gpus": 2048}  # never evaluated: refused up front
    count = MAX_CHUNKS // 1024 + 1
    with pytest.raises(ConfigError, match=f"{count * 1024:,} pipeline chunks .* at most {MAX_CHUNKS:,}"):
        read_runs(_write(tmp_path, [deep | {"id": f"r{i}"} for i in range(count)]))
    monkeypatch.setattr(rows_module, "MAX_RUNS", 2)
    with pytest.raises(ConfigError, match="'rows' must be a list of 1 to 2 entries, got 3"):
        read_runs(_write(tmp_path, [GOOD | {"id": f"r{i}"} for i in range(3)]))
    with pytest.raises(ConfigError, match="'rows' must be a list of 1 to 2 entries, got 0"):
        read_runs(_write(tmp_path, []))


def test_a_repeated_id_is_that_rows_problem(tmp_path) -> None:
    first, second = validate(_write(tmp_path, [GOOD, GOOD]))
    assert first.run is not None and second.problem == "good: id repeats row 1's"


def test_files_are_read_relative_to_the_runs_file(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "measured"
    (folder / "clusters").mkdir(parents=True)
    (folder / "clusters" / "small.toml").write_text(CLUSTER_TOML)
    (folder / "models" / "eight").mkdir(parents=True)
    (folder / "models" / "eight" / "config.json").write_text(json.dumps(LLAMA))
    (folder / "models" / "llama.json").write_text(json.dumps(LLAMA))
    own = {k: v for k, v in GOOD.items() if k != "model_config"} | {"cluster": "clusters/small.toml"}
    rows = [
        own | {"id": "file", "model": "models/llama.json"},
        own | {"id": "folder", "model": "models/eight", "model_name": "eight layers"},
        own | {"id": "catalog", "model": "llama3-8b", "model_name": None},
        own | {"id": "absent", "model": "models/absent.json"},
        GOOD | {"id": "both", "model": "llama3-8b"},
        own | {"id": "neither"},
    ]
    (folder / "runs.json").write_text(json.dumps({"rows": rows}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    results = _by_id(validate("../measured/runs.json"))
    assert results["file"].run.cluster.name == "small-h100" and results["file"].run.model.name == "Llama 8-layer"
    assert results["folder"].run.model.name == "eight layers"
    assert results["catalog"].run.model.name == "llama3-8b" and results["catalog"].run.model.num_layers == 32
    assert "model file 'models/absent.json' not found" in results["absent"].problem
    assert "measured/models/absent.json" in results["absent"].problem
    assert "found model and model_config" in results["both"].problem
    assert "found neither" in results["neither"].problem


def test_a_cluster_file_missing_beside_the_runs_file_names_where_it_was_looked_for(tmp_path) -> None:
    (result,) = validate(_write(tmp_path, [GOOD | {"cluster": "clusters/absent.toml"}]))
    assert "cluster file 'clusters/absent.toml' not found" in result.problem
    assert str(tmp_path / "clusters" / "absent.toml") in result.problem


def test_measured_memory_is_compared_with_the_prediction_it_counts(tmp_path) -> None:
    device = _published(id="device", metric="step_time_s", value=1.0, memory_GiB=20.0, memory_metric="device")
    allocated = device | {"id": "allocated", "published": device["published"] | {"memory_metric": "allocated"}}
    half = device["published"] | {"memory_metric": None}
    rows = [device, allocated, GOOD, _published(id="alone", metric="step_time_s", value=1.0, memory_metric="device")]
    rows += [device | {"id": "unnamed", "published": half}]
    rows += [device | {"id": "huge", "published": device["published"] | {"memory_GiB": 1e9}}]
    results = _by_id(validate(_write(tmp_path, rows)))
    device, allocated = results["device"], results["allocated"]
    reserve = 2.0 * GiB  # the catalog's reserved_GiB of the H100
    assert device.predicted_memory_bytes == device.peak_memory_bytes
    assert allocated.predicted_memory_bytes == pytest.approx(device.peak_memory_bytes - reserve)
    assert device.memory_error == pytest.approx(device.peak_memory_bytes / (20 * GiB) - 1)
    assert results["good"].memory_error is None and results["good"].to_dict()["memory_error"] is None
    assert "missing field 'published.memory_GiB'" in results["alone"].problem
    assert "missing field 'published.memory_metric'" in results["unnamed"].problem
    assert "'published.memory_GiB' must be a number in [0.001, 1.04858e+06]" in results["huge"].problem


def test_a_row_misses_the_tolerance_by_its_error_its_memory_its_fit_or_not_being_evaluated(tmp_path) -> None:
    (good,) = validate(_write(tmp_path, [GOOD]))
    exact = good.predicted_step_s  # a measurement the prediction matches
    matched = _published(id="matched", metric="step_time_s", value=exact)
    slow = _published(id="slow", metric="step_time_s", value=exact * 1.2)
    memory = _published(id="memory", metric="step_time_s", value=exact, memory_GiB=1.0, memory_metric="device")
    tight = GOOD | {"id": "tight", "mbs": 32, "global_batch": 128, "published": {"metric": "step_time_s", "value": 1}}
    results = validate(_write(tmp_path, [matched, slow, memory, tight, {"id": "broken"}]))
    missed = {m.id: m.reason for m in misses(results, 10)}
    assert "matched" not in missed
    assert missed["slow"] == "step time error +20.0%"
    assert missed["memory"].startswith("memory error +")
    assert "predicted not to fit" in missed["tight"] and missed["broken"] == "not evaluated"
    assert {m.id for m in misses(results, 25)} == {"memory", "tight", "broken"}
    for wrong in (0, -5, 1001, True):
        with pytest.raises(ConfigError, match="--tolerance must be a percentage in"):
            misses(results, wrong)


def test_cli_tolerance_exits_1_naming_the_rows_that_miss_it(capsys, tmp_path) -> None:
    (good,) = validate(_write(tmp_path, [GOOD]))
    matched = _published(id="matched", metric="step_time_s", value=good.predicted_step_s)
    slow = _published(id="slow", metric="step_time_s", value=good.predicted_step_s * 1.2)
    path = _write(tmp_path, [matched, slow])
    code, out, err = run_cli(capsys, ["validate", path, "--tolerance", "10"])
    assert code == 1, err
    assert "tolerance 10%: 1 of 2 rows miss it" in out and "slow: step time error +20.0%" in out
    code, out, err = run_cli(capsys, ["validate", path, "--tolerance", "25"])
    assert code == 0 and "tolerance 25%: all 2 rows within it" in out
    code, out, err = run_cli(capsys, ["validate", path, "--tolerance", "10", "--json"])
    verdict = json.loads(out)["tolerance"]
    assert code == 1 and verdict == {"percent": 10.0, "passed": False, "missed": [verdict["missed"][0]]}
    assert verdict["missed"][0]["id"] == "slow"
    code, out, err = run_cli(capsys, ["validate", path])
    assert code == 0 and "tolerance" not in out
    code, out, err = run_cli(capsys, ["validate", path, "--tolerance", "0"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "(0, 1000]" in err
