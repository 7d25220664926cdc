"""The job file (issue 27, item 4): ``plan --job`` and ``evaluate --job`` equal the same options given as
flags; a flag given as well overrides the file, stated on stderr; unknown keys refused by name; ``--json``
names the job it answered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

JOB = """model = "llama3-8b"
cluster = "dgx-h100"
devices = 16
global_batch_size = 64
seq_len = 4096
optimizer = "adam"

[settings]
framework = "nemo"
tp_comm_overlap = true

[search]
schedules = ["1f1b", "interleaved"]
memory_margin = 0.1
top = 2
"""
FLAGS = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--global-batch-size", "64"]
FLAGS += ["--seq-len", "4096", "--optimizer", "adam", "--framework", "nemo", "--tp-comm-overlap"]
SEARCH = ["--schedules", "1f1b,interleaved", "--memory-margin", "0.1", "--top", "2"]
DEGREES = ["--tp", "2", "--sp", "--dp", "8", "--zero", "1"]


@pytest.fixture
def job(tmp_path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(JOB)
    return path


def _json(capsys, argv: list[str]) -> tuple[dict, str]:
    code, out, err = run_cli(capsys, argv + ["--json"])
    assert code == 0, err
    return json.loads(out), err


def test_plan_from_the_file_is_the_plan_from_the_flags(capsys, job) -> None:
    from_file, _ = _json(capsys, ["plan", "--job", str(job)])
    from_flags, _ = _json(capsys, ["plan", *FLAGS, *SEARCH])
    assert from_file.pop("job_file") == {"path": str(job), "contents": json.loads(json.dumps(_toml(job)))}
    assert from_file["search"].pop("solve_time_s") and from_flags["search"].pop("solve_time_s")
    for stats in (from_file["search_stats"], from_flags["search_stats"]):  # every counter, unrefined finalists too
        assert stats["enumerated"] > 0 and stats["unrefined"] == 0
    assert from_file == from_flags and len(from_file["runners_up"]) == 2


def test_evaluate_from_the_file_is_evaluate_from_the_flags(capsys, job) -> None:
    from_file, _ = _json(capsys, ["evaluate", "--job", str(job), *DEGREES])
    from_flags, _ = _json(capsys, ["evaluate", *FLAGS, *DEGREES])
    assert from_file.pop("job_file")["path"] == str(job)
    assert from_file["prediction"] == from_flags["prediction"] and from_file["job"] == from_flags["job"]


def test_a_flag_given_as_well_overrides_the_file_and_says_so(capsys, job) -> None:
    plan, err = _json(capsys, ["evaluate", "--job", str(job), *DEGREES, "--seq-len", "2048", "--no-tp-comm-overlap"])
    assert plan["job"]["seq_len"] == 2048 and plan["job"]["tp_comm_overlap"] is False
    assert "--seq-len 2048 overrides the job file's seq_len 4096" in err
    assert "--no-tp-comm-overlap overrides the job file's tp_comm_overlap True" in err


def test_a_model_file_is_read_relative_to_the_job_file(capsys, tmp_path) -> None:
    from nestplan.catalog import entry_path

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.json").write_text(entry_path("model", "llama3-8b").read_text())
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('"llama3-8b"', '"models/mine.json"'))
    plan, _ = _json(capsys, ["evaluate", "--job", str(job), *DEGREES])
    assert plan["model_config"]["num_hidden_layers"] == 32


@pytest.mark.parametrize(
    "text,named",
    [
        ("clustr = 'x'\n", "unknown field 'clustr'"),
        ("[settings]\nflash = true\n", "unknown field 'settings.flash'"),
        ("[search]\ntop = 1000\n", "'search.top' must be an integer in 0..100"),
        ("[search]\nschedules = ['zb']\n", "search.schedules[0]"),
        ("[search]\nmemory_margin = 0.9\n", "search.memory_margin"),
        ("devices = 0\n", "'devices' must be an integer"),
        ("optimizer = 'lion'\n", "field 'optimizer'"),
        ("[settings]\ncp_comm_type = 'ring'\n", "cp comm type 'ring'"),
    ],
)
def test_bad_job_files_one_line_exit_2(capsys, tmp_path, text, named) -> None:
    job = tmp_path / "job.toml"
    job.write_text('model = "llama3-8b"\ncluster = "dgx-h100"\n' + text)
    code, _, err = run_cli(capsys, ["plan", "--job", str(job)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err


def test_without_a_job_the_options_are_required(capsys) -> None:
    code, _, err = run_cli(capsys, ["plan", "--cluster", "dgx-h100"])
    assert code == 2 and "plan needs --model (or --job)" in err


def test_the_formats_doc_shows_a_job_file_that_runs(capsys, tmp_path) -> None:
    """docs/formats.md's example job file, as written there, plans."""
    text = (Path(__file__).parents[2] / "docs" / "formats.md").read_text()
    example = text.split("## Job file", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    job = tmp_path / "job.toml"
    job.write_text(example)
    plan, _ = _json(capsys, ["plan", "--job", str(job), "--top", "0"])
    assert plan["job_file"]["contents"]["model"] == plan["model"]


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())
