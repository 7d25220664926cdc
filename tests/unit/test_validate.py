"""`nestplan validate`: measured runs against predictions, bad rows one line each, the rest evaluated."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan.errors import ConfigError
from nestplan.validate import summarise, validate

LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}
GOOD = {
    "id": "good",
    "model_name": "Llama 8-layer",
    "model_config": LLAMA,
    "cluster": "dgx-h100",
    "gpus": 8,
    "tp": 2,
    "pp": 1,
    "vp": 1,
    "cp": 1,
    "ep": 1,
    "dp": 4,
    "sp": True,
    "recompute": "none",
    "zero": 1,
    "mbs": 1,
    "global_batch": 32,
    "seq_len": 4096,
    "precision": "bf16",
    "layers_per_stage": None,
    "axis_order": "tp,cp,ep,dp,pp",
    "grad_reduce_dtype": "bf16",
    "tp_comm_overlap": True,
    "flash": True,
    "published": {"metric": "step_time_s", "value": 1.0},
}


def _write(tmp_path, rows) -> str:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def test_good_rows_are_evaluated_and_bad_rows_reported_one_line_each(tmp_path) -> None:
    missing = {k: v for k, v in GOOD.items() if k != "seq_len"} | {"id": "missing"}
    family = GOOD | {"id": "family", "model_config": LLAMA | {"model_type": "t5"}}
    product = GOOD | {"id": "product", "gpus": 16}
    fp8 = GOOD | {"id": "fp8", "precision": "fp8"}
    results = validate(_write(tmp_path, [GOOD, missing, family, product, "not a row", fp8]))
    by_id = {r.id: r for r in results}
    assert by_id["good"].run is not None and by_id["good"].predicted_step_s > 0
    assert by_id["fp8"].run.job.fp8 and by_id["fp8"].predicted_step_s < by_id["good"].predicted_step_s
    assert "seq_len" in by_id["missing"].problem
    assert "t5" in by_id["family"].problem
    assert "gpus" in by_id["product"].problem
    assert "row 5" in by_id["row 5"].problem
    assert all("\n" not in (r.problem or "") for r in results)


def test_error_is_predicted_throughput_over_measured(tmp_path) -> None:
    (good,) = validate(_write(tmp_path, [GOOD]))
    assert good.error == pytest.approx(1.0 / good.predicted_step_s - 1)
    assert good.measured_tokens_per_s_per_gpu == pytest.approx(32 * 4096 / 1.0 / 8)


def test_summaries_group_the_evaluated_rows(tmp_path) -> None:
    slow = GOOD | {"id": "slow", "published": {"metric": "step_time_s", "value": 2.0}}
    results = validate(_write(tmp_path, [GOOD, slow, {"id": "bad"}]))
    (all_rows,) = summarise(results, lambda r: "all")
    errors = sorted(abs(r.error) for r in results if r.error is not None)
    assert all_rows.rows == 2 and all_rows.max_abs == pytest.approx(errors[-1])


def test_a_file_without_rows_is_one_error(tmp_path) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": []}))
    with pytest.raises(ConfigError, match="rows"):
        validate(str(path))


def test_cli_prints_the_table_and_json(capsys, tmp_path) -> None:
    path = _write(tmp_path, [GOOD, {"id": "bad"}])
    code, out, err = run_cli(capsys, ["validate", path])
    assert code == 0, err
    assert "good" in out and "bad: not evaluated" in out and "median |error|" in out
    code, out, err = run_cli(capsys, ["validate", path, "--json"])
    data = json.loads(out)
    assert [r["evaluated"] for r in data["rows"]] == [True, False]
    assert data["summaries"][0]["group"] == "all"
    code, out, err = run_cli(capsys, ["validate", str(tmp_path / "absent.json")])
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_a_misspelled_column_is_refused_by_name_and_the_other_rows_evaluated(tmp_path) -> None:
    typo = GOOD | {"id": "typo", "tp_comm_overlapp": True}
    results = validate(_write(tmp_path, [GOOD, typo]))
    by_id = {r.id: r for r in results}
    assert by_id["good"].run is not None
    assert by_id["typo"].run is None and "unknown field 'tp_comm_overlapp'" in by_id["typo"].problem
    assert "\n" not in by_id["typo"].problem


def test_every_run_setting_is_a_column_under_its_name_or_its_alias(tmp_path) -> None:
    from nestplan.settings import setting_table
    from nestplan.validate import ROW_COLUMNS, SETTING_ALIASES

    assert SETTING_ALIASES == {"grad_dtype": "grad_reduce_dtype", "flash_attention": "flash"}
    assert {entry.name for entry in setting_table()} | set(SETTING_ALIASES.values()) <= set(ROW_COLUMNS)
    own = {k: v for k, v in GOOD.items() if k not in ("grad_reduce_dtype", "flash")}
    named = own | {"id": "named", "grad_dtype": "bf16", "flash_attention": False, "overlap_grad_reduce": False}
    named |= {"moe_dispatcher": "alltoall", "optimizer_state": "bf16"}
    both = GOOD | {"id": "both", "flash_attention": True}
    aliased = GOOD | {"id": "aliased", "flash": False}
    results = {r.id: r for r in validate(_write(tmp_path, [named, both, aliased]))}
    settings = results["named"].run.job.settings
    assert settings.overlap_grad_reduce is False and settings.optimizer_state.value == "bf16"
    assert settings.grad_dtype == "bf16" and settings.flash_attention is False
    assert "'flash_attention' or its alias 'flash'" in results["both"].problem
    assert results["aliased"].run.job.settings.flash_attention is False
    assert results["aliased"].run.job.settings.grad_dtype == "bf16"


def test_formats_doc_lists_every_settings_column() -> None:
    from pathlib import Path

    from nestplan.settings import setting_table
    from nestplan.validate import SETTING_ALIASES

    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    section = text.split("## Runs file (JSON)", 1)[1].split("\n## ", 1)[0]
    settings = text.split("## Run settings", 1)[1].split("\n## ", 1)[0]
    assert "[Run settings](#run-settings)" in section  # the columns are the settings table's names
    for name in [entry.name for entry in setting_table()]:
        assert f"| `{name}` |" in settings, name
    for name in SETTING_ALIASES.values():
        assert f"`{name}`" in section, name
