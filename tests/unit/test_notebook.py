"""Results in a notebook: one-line reprs, HTML tables with every name escaped, plain to_dict values,
pickling, nestplan.plan both the plan module and the search, and DataFrames of compare and sweep rows."""

from __future__ import annotations

import inspect
import json
import pickle
import sys
from dataclasses import fields, replace

import pytest

import nestplan
from nestplan import api
from nestplan.errors import ConfigError
from nestplan.plan import Plan
from nestplan.search.compare import CompareRow, normalise
from nestplan.search.compare import to_dataframe as compare_dataframe
from nestplan.sweep.report import CSV_FIELDS, read_rows
from nestplan.sweep.report import to_dataframe as sweep_dataframe
from nestplan.validate import validate
from test_validate import GOOD, _write

MAX_REPR = 200
MARKUP = "<b>bold</b>"


@pytest.fixture(scope="module")
def evaluation() -> api.Evaluation:
    return api.evaluate_full(
        "llama2-7b",
        "dgx-a100",
        nestplan.ParallelDims(tp=2, pp=2, dp=2, recompute="full"),
        nestplan.Job(global_batch_size=16, seq_len=2048),
    )


@pytest.fixture(scope="module")
def report() -> api.PlanReport:
    return nestplan.plan("llama2-7b", "dgx-a100", devices=8, global_batch_size=16, seq_len=2048, top=2)


@pytest.fixture(scope="module")
def comparison() -> api.Comparison:
    rows = [
        CompareRow("llama2-7b", "dgx-a100", 8, 1, "nestplan", True, 4000.0, 0.5, "tp1 pp1 dp8 z1 none"),
        CompareRow("llama2-7b", "dgx-a100", 8, 1, "manual", True, 3200.0, 0.0, "tp8 pp1 dp1 z0 none"),
        CompareRow("llama2-7b", "dgx-a100", 8, 1, "alpa", False, 0.0, 0.1, "-"),
    ]
    return api.Comparison("llama2-7b on dgx-a100", rows, normalise(rows))


def _results(evaluation, report, comparison) -> list:
    return [evaluation.prediction, evaluation.prediction.stages[0], evaluation, report, comparison]


def test_reprs_are_one_short_line(evaluation, report, comparison) -> None:
    for result in _results(evaluation, report, comparison):
        text = repr(result)
        assert "\n" not in text and len(text) < MAX_REPR, text
    step = f"step {evaluation.prediction.step_time_s:.4g} s"
    assert step in repr(evaluation.prediction) and step in repr(evaluation)
    assert "tp2 pp2 dp2 mbs1 zero0 recompute full" in repr(evaluation.prediction)
    assert "2 runner-ups" in repr(report) and "3 rows, nestplan, manual, alpa" in repr(comparison)


def test_reprs_stay_short_and_printable_with_long_names(report) -> None:
    named = replace(
        report,
        model=replace(report.model, name="\x1b[31m" + "m" * 500),
        cluster=replace(report.cluster, name="c" * 500),
    )
    text = repr(named)
    assert len(text) < MAX_REPR and "\x1b" not in text and text.startswith("PlanReport(\\x1b[31m")


def test_html_shows_the_figures_and_escapes_every_name(evaluation, report) -> None:
    pred = evaluation.prediction
    page = pred._repr_html_()
    assert f"{pred.step_time_s:.4g} s" in page and f"{pred.mfu:.1%}" in page
    assert all(term in page for term, secs in pred.breakdown_s.items() if secs)
    assert all(f"<td>{s.layers_text}</td>" in page for s in pred.stages)
    assert [s.layers_text for s in pred.stages] == ["E+0-15", "16-31+H"]
    marked = replace(report, model=replace(report.model, name=MARKUP), cluster=replace(report.cluster, name=MARKUP))
    for result in (marked, replace(evaluation, model=marked.model, cluster=marked.cluster)):
        page = result._repr_html_()
        assert MARKUP not in page and "&lt;b&gt;bold&lt;/b&gt; on &lt;b&gt;bold&lt;/b&gt;" in page
    page = marked._repr_html_()
    assert f"{report.best.step_time_s:.4g} s" in page
    assert all(f"<td>{p.step_time_s:.4g}</td>" in page for p in report.runners_up)


def _json_round_trip(value: dict) -> dict:
    return json.loads(json.dumps(value, allow_nan=False))


def test_to_dict_is_plain_json(evaluation, report, comparison) -> None:
    pred = evaluation.prediction
    data = pred.to_dict()
    assert _json_round_trip(data) == data
    assert data["step_time_s"] == pred.step_time_s and data["mfu"] == pred.mfu and data["fits"] is True
    assert data["plan"]["tp"] == 2 and data["plan"]["recompute"] == "full" and data["plan"]["zero"] == 0
    assert data["breakdown_s"] == dict(pred.breakdown_s)
    assert [s["peak_memory_bytes"] for s in data["stages"]] == [s.peak_memory_bytes for s in pred.stages]
    assert data["placement"]["axis_order"] == list(pred.placement.axis_order)
    for result in (evaluation, report, comparison):
        assert _json_round_trip(result.to_dict()) == result.to_dict()
    assert Plan.from_dict(report.to_dict()) == report.plan  # a PlanReport's dict is the plan file
    rows = comparison.to_dict()["rows"]
    assert [r["planner"] for r in rows] == ["nestplan", "manual", "alpa"]
    assert [r["normalised"] for r in rows] == [1.25, 1.0, 0.0]


def test_validation_rows_to_dict(tmp_path) -> None:
    good, bad = validate(_write(tmp_path, [GOOD, GOOD | {"id": "bad", "gpus": 16}]))
    data = good.to_dict()
    assert _json_round_trip(data) == data
    assert data["evaluated"] and (data["gpus"], data["tp"], data["dp"], data["sp"]) == (8, 2, 4, True)
    assert data["error"] == good.error and data["predicted_step_s"] == good.predicted_step_s
    assert bad.to_dict() == {"id": "bad", "evaluated": False, "problem": bad.problem}


def test_results_pickle(evaluation, report) -> None:
    for result in (evaluation.prediction, evaluation, evaluation.plan, report):
        loaded = pickle.loads(pickle.dumps(result))
        assert loaded == result
        assert loaded.to_dict() == result.to_dict()
    loaded = pickle.loads(pickle.dumps(evaluation.prediction))
    with pytest.raises(TypeError):  # the breakdown is read-only again
        loaded.breakdown_s["optimizer"] = 0.0  # type: ignore[index]


def test_nestplan_plan_is_the_plan_module_and_the_search(report) -> None:
    import nestplan.plan as module

    assert module is sys.modules["nestplan.plan"] is nestplan.plan and nestplan.plan.Plan is Plan
    assert list(inspect.signature(nestplan.plan).parameters)[:3] == ["model", "cluster", "job"]
    again = nestplan.plan("llama2-7b", "dgx-a100", devices=8, global_batch_size=16, seq_len=2048, top=0)
    assert isinstance(again, api.PlanReport) and again.best == report.best


def test_compare_rows_to_dataframe(comparison) -> None:
    pytest.importorskip("pandas", reason="to_dataframe needs pandas, not installed here")
    frame = comparison.to_dataframe()
    assert list(frame.columns) == [f.name for f in fields(CompareRow)] + ["normalised"]
    assert list(frame["planner"]) == ["nestplan", "manual", "alpa"] and list(frame["normalised"]) == [1.25, 1.0, 0.0]
    assert list(compare_dataframe([]).columns) == [f.name for f in fields(CompareRow)]


def test_sweep_rows_to_dataframe(tmp_path) -> None:
    pytest.importorskip("pandas", reason="to_dataframe needs pandas, not installed here")
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "t"\nmodels = ["bert-large"]\ndevices = [8]\nglobal_batch_size = [64]\nseq_len = [512]\n'
        '[[clusters]]\nbase = "h100-spine-leaf"\nlabel = "spine-leaf"\n'
    )
    api.sweep(spec, tmp_path / "out", workers=1)
    rows = read_rows(tmp_path / "out")
    frame = sweep_dataframe(rows)
    assert list(frame.columns) == list(CSV_FIELDS) and len(frame) == 1
    assert frame["model"][0] == "bert-large" and frame["status"][0] == "ok"
    assert frame["tokens_per_s"][0] == rows[0]["tokens_per_s"] and frame["plan"][0].startswith("tp")


def test_to_dataframe_without_pandas_names_what_to_install(monkeypatch, comparison) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    for make in (comparison.to_dataframe, lambda: sweep_dataframe([])):
        with pytest.raises(ConfigError, match="pip install pandas"):
            make()
