"""Issue 30, part 3: plan --top bounded by the layer count, the finalists' refinement bounded in cells, and
a late output failure (after the search, with notes to print) leaving one line and no file behind."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan import api, outputs
from nestplan.catalog import entry_path
from nestplan.errors import ConfigError
from nestplan.search import planner
from nestplan.search.engine import Candidate
from nestplan.search.stats import SearchStats

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-a100", "--devices", "16"]
PLAN += ["--global-batch-size", "64", "--seq-len", "2048", "--top", "1"]


def test_top_is_refused_above_the_runner_up_layers_in_one_line(tmp_path) -> None:
    config = json.loads(entry_path("model", "llama2-7b").read_text())
    config.update(num_hidden_layers=1024, hidden_size=256, num_attention_heads=4, num_key_value_heads=4)
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(config))
    most = api.planning.MAX_TOP_LAYERS // 1024
    with pytest.raises(ConfigError, match=f"at most {most} runner-ups") as info:
        api.plan(str(path), "dgx-h100", devices=64, top=most + 1)
    assert info.value.limit == most and "\n" not in str(info.value)


class _Engine:
    def __init__(self) -> None:
        self.stats = SearchStats()
        self.refined: list[Candidate] = []

    def refine(self, cand: Candidate) -> Candidate:
        self.refined.append(cand)
        return cand


def test_the_refinement_stops_at_its_cells_and_counts_the_rest() -> None:
    finalists = [Candidate(float(i), (i,), None, (1,) * p) for i, p in enumerate((4, 8, 2, 4))]
    engine = _Engine()
    cells = 11**2  # 10 layers: (layers + 1)^2 cells per stage
    kept = planner._refined(engine, finalists, 10, budget=7 * cells)
    assert kept == finalists  # in their order, refined or not
    assert [len(c.parts) for c in engine.refined] == [4, 2]  # 8 stages no longer fit; 2 after them still do
    assert engine.stats.unrefined == 2


def _fail_for(monkeypatch, name: str) -> None:
    real = outputs.write_text

    def write_text(path, text, option, executable=False):
        if str(path).endswith(name):
            raise PermissionError(13, "Permission denied")
        return real(path, text, option, executable)

    monkeypatch.setattr(outputs, "write_text", write_text)


def test_a_late_report_failure_leaves_no_export_no_plots_and_one_line(capsys, tmp_path, monkeypatch) -> None:
    _fail_for(monkeypatch, "page.html")
    out, plots, page = tmp_path / "export", tmp_path / "plots", tmp_path / "page.html"
    argv = PLAN + ["--export", "megatron", "--out", str(out), "--plot", str(plots), "--report", str(page)]
    code, stdout, err = run_cli(capsys, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--report" in err, err
    assert stdout == "" and list(tmp_path.iterdir()) == []


def test_a_late_failure_keeps_what_was_in_the_folders_before(capsys, tmp_path, monkeypatch) -> None:
    _fail_for(monkeypatch, "page.html")
    out = tmp_path / "export"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    code, _, err = run_cli(
        capsys, PLAN + ["--export", "megatron", "--out", str(out), "--report", str(out / "page.html")]
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_notes_are_printed_once_every_output_is_written(capsys, tmp_path) -> None:
    page = tmp_path / "page.html"
    code, stdout, err = run_cli(
        capsys, PLAN + ["--export", "megatron", "--out", str(tmp_path / "o"), "--report", str(page)]
    )
    assert code == 0 and page.is_file() and (tmp_path / "o").is_dir()
    assert err.strip().splitlines()[-1] == f"nestplan: wrote the report {page}"
    assert "wrote: " in stdout


def test_a_range_of_sizes_keeps_the_same_top_bound(tmp_path) -> None:
    from nestplan.api.run import plan_range

    spec = api.resolve_model("llama2-7b")
    with pytest.raises(ConfigError, match="at most 512 runner-ups"):
        plan_range(spec, api.resolve_cluster("dgx-h100", 64), None, None, (8, 64), None, top=513)
