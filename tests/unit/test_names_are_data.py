"""Names are data (issue 30): a model's name never becomes mathtext in a figure, never hides an invisible
character in an error line, a generated file or the HTML report, and never becomes a spreadsheet formula."""

from __future__ import annotations

import csv
import json

import pytest
from cli_helpers import run_cli

from nestplan.errors import printable
from nestplan.report.cells import csv_cell
from nestplan.report.compare import write_csv as write_compare_csv
from nestplan.search.compare import CompareRow
from nestplan.sweep.report import write_csv as write_sweep_csv

SMALL = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
EVALUATE = ["evaluate", "--cluster", "dgx-h100", "--devices", "8", "--tp", "2", "--dp", "4"]
EVALUATE += ["--global-batch-size", "16", "--seq-len", "1024"]
HIDDEN = "evil\u202egnp.exe\u200b"  # a right-to-left override and a zero-width space


def _model(tmp_path, name: str) -> str:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**SMALL, "name": name}), encoding="utf-8")
    return str(path)


def test_a_name_with_dollars_and_backslashes_draws_every_plot_and_the_report(capsys, tmp_path) -> None:
    """matplotlib would read ``$\\foo$`` as mathtext and fail on the unknown symbol: the text is drawn as written."""
    model = _model(tmp_path, "a$\\foo$b")
    argv = [*EVALUATE, "--model", model, "--plot", str(tmp_path / "plots"), "--report", str(tmp_path / "r.html")]
    code, _, err = run_cli(capsys, argv)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["memory.png", "placement.png", "timeline.png"]
    assert "a$\\foo$b" in (tmp_path / "r.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\u00ad", "\U000e0041", "\x1b"])
def test_printable_shows_every_invisible_character_as_its_escape(char) -> None:
    shown = printable(f"a{char}b")
    assert shown == f"a{repr(char)[1:-1]}b" and shown.isascii()
    assert printable("plain name 日本 $x$ \\ =") == "plain name 日本 $x$ \\ ="


def test_hidden_characters_reach_no_error_line_report_or_generated_file(capsys, tmp_path) -> None:
    model = _model(tmp_path, HIDDEN)
    code, _, err = run_cli(capsys, [*EVALUATE[:5], "--ep", "2", "--dp", "4", *EVALUATE[-4:], "--model", model])
    assert code == 2 and "evil\\u202egnp.exe\\u200b" in err and "\u202e" not in err
    report, saved = tmp_path / "r.html", tmp_path / "plan.json"
    code, out, err = run_cli(capsys, [*EVALUATE, "--model", model, "--report", str(report), "--json"])
    assert code == 0, err
    saved.write_text(out, encoding="utf-8")
    page = report.read_text(encoding="utf-8")
    assert "\u202e" not in page and "\u200b" not in page and "evil\\u202egnp.exe\\u200b" in page
    for framework in ("megatron", "torchtitan", "deepspeed", "nemo"):
        folder = tmp_path / framework
        code, _, err = run_cli(capsys, ["export", str(saved), "--framework", framework, "--out", str(folder)])
        assert code == 0, err
        assert "\u202e" not in err
        for written in folder.iterdir():
            text = written.read_text(encoding="utf-8")
            assert "\u202e" not in text and "\u200b" not in text, written.name


@pytest.mark.parametrize("text", ["=1+1", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1", "\r=1", "-cmd"])
def test_a_cell_a_spreadsheet_would_run_is_written_as_text(text) -> None:
    assert csv_cell(text) == "'" + text


@pytest.mark.parametrize("value", ["-1.5", "+3", "1e-3", "-", "llama3-8b", "a=b", 7, -2.5, None])
def test_numbers_and_plain_names_are_written_as_they_are(value) -> None:
    assert csv_cell(value) == value


def test_every_csv_nestplan_writes_neutralises_formulas(tmp_path) -> None:
    row = CompareRow(
        model='=HYPERLINK("http://x","y")',
        cluster="@c",
        devices=8,
        micro_batch_size=1,
        planner="nestplan",
        feasible=True,
        tokens_per_s=1.0,
        solve_time_s=0.1,
        plan="-",
    )
    write_compare_csv(tmp_path / "compare.csv", [row], [1.0])
    _write_sweep(tmp_path / "results.csv", {"model": "+cmd", "label": "-x", "accelerator": "@h100", "hbm_GiB": 0})
    expected = {
        "compare.csv": ['\'=HYPERLINK("http://x","y")', "'@c"],
        "results.csv": ["'+cmd", "'-x @h100"],
    }
    for name, hostile in expected.items():
        with open(tmp_path / name, newline="", encoding="utf-8") as fh:
            cells = [cell for row in csv.reader(fh) for cell in row]
        assert set(hostile) <= set(cells), (name, cells)
        assert not any(cell.startswith(("=", "+", "@")) for cell in cells), (name, cells)


def _write_sweep(path, row) -> None:
    from nestplan.sweep.report import CSV_FIELDS

    full = {field: 0 for field in CSV_FIELDS} | row | {"overrides": {}, "plan": None}
    write_sweep_csv([full], path)


def _export(capsys, tmp_path, model: str, framework: str) -> str:
    """The text of every file ``nestplan export --framework`` writes for an evaluated plan of ``model``."""
    saved, folder = tmp_path / "plan.json", tmp_path / framework
    code, out, err = run_cli(capsys, [*EVALUATE[:5], "--tp", "8", *EVALUATE[-4:], "--model", model, "--json"])
    assert code == 0, err
    saved.write_text(out, encoding="utf-8")
    code, _, err = run_cli(capsys, ["export", str(saved), "--framework", framework, "--out", str(folder)])
    assert code == 0, err
    return "".join(p.read_text(encoding="utf-8") for p in sorted(folder.iterdir()))


def test_a_small_model_named_like_a_shipped_one_exports_its_own_architecture(capsys, tmp_path) -> None:
    """A 4-layer config.json named ``llama3-8b`` is not Llama 3 8B: torchtitan builds its sizes, Megatron-Bridge
    runs the generic recipe with its fields."""
    model = _model(tmp_path, "llama3-8b")
    titan = _export(capsys, tmp_path, model, "torchtitan")
    assert 'model_registry("8B")\n' not in titan and "n_layers=4, dim=512" in titan
    assert "RECIPE=vanilla_gpt_pretrain_config" in _export(capsys, tmp_path, model, "nemo")


def test_a_shipped_architecture_under_another_name_exports_as_that_model(capsys, tmp_path) -> None:
    from nestplan.model.config import config_dict, load_model

    path = tmp_path / "mine.json"  # torchtitan's 8B flavour is Llama 3.1's (its "llama" RoPE scaling)
    path.write_text(json.dumps({**config_dict(load_model("llama3.1-8b")), "name": "my-own-run"}), encoding="utf-8")
    titan = _export(capsys, tmp_path, str(path), "torchtitan")
    assert '    return model_registry("8B")\n' in titan and "config_registry.llama3_8b()" in titan
    path.write_text(json.dumps({**config_dict(load_model("llama3-8b")), "name": "my-own-run"}), encoding="utf-8")
    assert "RECIPE=llama3_8b_pretrain_config" in _export(capsys, tmp_path, str(path), "nemo")
