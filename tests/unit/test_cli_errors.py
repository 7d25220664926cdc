"""The command line's trust contract: bounded, strictly parsed numbers; one-line errors with control
characters escaped; output paths that fail cleanly; the plan printed before plots; --version,
python -m nestplan, the catalog tables, unwrapped piped output, plain help, the fit verdict of
evaluate, Megatron-LM's dp convention."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli, with_options

import nestplan
from nestplan import api
from nestplan.errors import ConfigError
from nestplan.job import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LEN, Job
from nestplan.settings import RunSettings

EVALUATE = [
    "evaluate",
    "--model",
    "gpt3-175b",
    "--cluster",
    "dgx-a100",
    "--devices",
    "64",
    "--tp",
    "8",
    "--pp",
    "8",
    "--dp",
    "1",
    "--global-batch-size",
    "64",
    "--recompute",
    "full",
]
PLAN = ["plan", "--model", "bert-large", "--cluster", "v100-spine-leaf", "--global-batch-size", "64"]
COMPARE = [
    "compare",
    "--model",
    "bert-large",
    "--cluster",
    "v100-spine-leaf",
    "--devices",
    "8",
    "--global-batch-size",
    "64",
    "--baselines",
    "manual",
]
# GPT-3 on 64 A100s without recomputation: 215 GiB per device of 80
NOT_FITTING = with_options(EVALUATE, ["--pp", "2", "--dp", "4", "--recompute", "none"])
# Mixtral on 512 H100s, tp 4 x pp 4 x ep 8: Megatron-LM's dp 32 is nestplan's dp 4
MIXTRAL = [
    "evaluate",
    "--model",
    "mixtral-8x7b",
    "--cluster",
    "h100-spine-leaf",
    "--devices",
    "512",
    "--tp",
    "4",
    "--pp",
    "4",
    "--ep",
    "8",
    "--global-batch-size",
    "1024",
    "--seq-len",
    "4096",
]
HOSTILE = "bad\x1b[2J\nvalue\u2028"


def _one_line(err: str) -> str:
    """The single line of stderr, checked free of tracebacks and raw control characters."""
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert "Traceback" not in err and "\x1b" not in err and "\u2028" not in err, err
    return lines[0]


def _fails(capsys, argv: list[str], needle: str, code: int = 2) -> tuple[str, str]:
    got, out, err = run_cli(capsys, argv)
    assert got == code, (got, err)
    line = _one_line(err)
    assert needle in line, line
    return out, line


# -- 1. bounds on every numeric option ------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needle",
    [
        (with_options(PLAN, ["--top", "101"]), "--top 101 is out of range; allowed: 0..100"),
        (with_options(PLAN, ["--top", "100000000000000000000"]), "--top 100000000000000000000 is out of range"),
        (with_options(PLAN, ["--devices", "1048577"]), "--devices 1048577 is out of range"),
        (with_options(PLAN, ["--global-batch-size", str(MAX_GLOBAL_BATCH_SIZE + 1)]), "--global-batch-size"),
        (with_options(PLAN, ["--seq-len", str(MAX_SEQ_LEN + 1)]), "--seq-len 2097153 is out of range"),
        (with_options(EVALUATE, ["--seq-len", "0"]), "--seq-len 0 is out of range; allowed: 1..2097152"),
        (with_options(EVALUATE, ["--mbs", "0"]), "--mbs 0 is out of range"),
        (with_options(EVALUATE, ["--tp", "0"]), "--tp 0 is out of range"),
        (with_options(EVALUATE, ["--dp", "99999999"]), "--dp 99999999 is out of range"),
        (with_options(EVALUATE, ["--zero", "4"]), "--zero 4 is out of range; allowed: 0..3"),
        (with_options(EVALUATE, ["--virtual-stages", "1025"]), "--virtual-stages 1025 is out of range"),
        (with_options(COMPARE, ["--devices", "8,0"]), "--devices 0 is out of range"),
        (with_options(COMPARE, ["--mbs", ",".join(["1"] * 65)]), "--mbs has 65 entries; at most 64"),
        (["sweep", "spec.toml", "--workers", "0"], "--workers 0 is out of range; allowed: 1..1024"),
        (["sweep", "spec.toml", "--workers", "1025"], "--workers 1025 is out of range"),
        (["trace", "--model", "bert-large", "--seq-len", "0"], "--seq-len 0 is out of range"),
    ],
)
def test_numeric_options_are_bounded(capsys, argv, needle) -> None:
    out, _ = _fails(capsys, argv, needle)
    assert out == ""


def test_api_enforces_the_job_bounds() -> None:
    spec = api.resolve_model("gpt3-175b")
    with pytest.raises(ConfigError, match="seq_len must be a positive integer"):
        api.make_job(spec, 64, 0)  # 0 is an error, not "the model's default"
    assert api.make_job(spec, 64).seq_len == 2048
    with pytest.raises(ConfigError, match="global_batch_size must be a positive integer up to 16,777,216"):
        Job(global_batch_size=MAX_GLOBAL_BATCH_SIZE + 1, seq_len=2048)
    with pytest.raises(ConfigError, match="seq_len"):
        Job(global_batch_size=64, seq_len=MAX_SEQ_LEN + 1)
    with pytest.raises(ConfigError, match=r"top must be an integer in 0\.\.100"):
        api.plan("bert-large", "v100-spine-leaf", global_batch_size=64, top=10**20)
    with pytest.raises(ConfigError, match=r"workers must be an integer in 1\.\.1024"):
        api.sweep("spec.toml", "out", workers=10**6)


def test_sequence_beyond_the_learned_positions(capsys) -> None:
    bert, llama = api.resolve_model("bert-large"), api.resolve_model("llama3-8b")
    with pytest.raises(ConfigError, match="seq-len 1024 exceeds the 512 positions bert-large has learned"):
        api.make_job(bert, 64, 1024)
    assert api.make_job(bert, 64, 512).seq_len == 512
    assert api.make_job(llama, 64, 65536).seq_len == 65536  # rotary positions: no table to run out of
    _fails(capsys, with_options(PLAN, ["--seq-len", "513"]), "seq-len 513 exceeds the 512 positions")
    _fails(capsys, with_options(EVALUATE, ["--seq-len", "4096"]), "seq-len 4096 exceeds the 2048 positions gpt3-175b")


# -- 2. strict integers ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1_000", "+4", "2.0", " 4", "4 ", "1e3", "0x10", "\u0664", "four", ""])
def test_integers_are_plain_decimal_digits(capsys, value) -> None:
    _, line = _fails(capsys, with_options(EVALUATE, ["--global-batch-size", value]), "--global-batch-size '")
    assert "is not a plain decimal integer" in line


@pytest.mark.parametrize(
    "argv, needle",
    [
        (with_options(COMPARE, ["--devices", "8,+16"]), "--devices '+16' is not a plain decimal integer"),
        (with_options(COMPARE, ["--mbs", "1_0"]), "--mbs '1_0' is not a plain decimal integer"),
        (
            with_options(EVALUATE, ["--layers-per-stage", "12,12,12,12,12,12,12,1e1"]),
            "--layers-per-stage '1e1' is not a plain decimal integer",
        ),
    ],
)
def test_integer_lists_are_plain_decimal_digits(capsys, argv, needle) -> None:
    _fails(capsys, argv, needle)


# -- 3. one-line errors, control characters escaped -----------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        with_options(EVALUATE, ["--model", HOSTILE]),
        with_options(EVALUATE, ["--cluster", HOSTILE]),
        with_options(EVALUATE, ["--dtype", HOSTILE]),
        with_options(EVALUATE, ["--axis-order", HOSTILE]),
        with_options(EVALUATE, ["--layers-per-stage", HOSTILE]),
        with_options(EVALUATE, ["--recompute", HOSTILE]),
        with_options(EVALUATE, ["--schedule", HOSTILE]),
        with_options(EVALUATE, ["--optimizer", HOSTILE]),
        with_options(EVALUATE, ["--tp", HOSTILE]),
        with_options(PLAN, ["--export", HOSTILE]),
        with_options(COMPARE, ["--baselines", HOSTILE]),
        with_options(COMPARE, ["--devices", HOSTILE]),
        ["export", HOSTILE, "--framework", "megatron"],
        ["list", HOSTILE],
        ["nest-solve", HOSTILE],
        ["sweep", HOSTILE],
        EVALUATE + [HOSTILE],
        [f"--{HOSTILE}"],
    ],
)
def test_control_characters_are_escaped(capsys, argv) -> None:
    code, out, err = run_cli(capsys, argv)
    assert code == 2 and out == ""
    assert "\\x1b" in _one_line(err)


def test_export_reads_the_plan_through_the_bounded_reader(capsys, tmp_path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"schema": "nestplan.plan/1", "x": NaN}')
    _fails(
        capsys, ["export", str(plan), "--framework", "megatron", "--out", str(tmp_path / "o")], f"plan file '{plan}'"
    )
    plan.write_text("[1, 2]")
    _fails(
        capsys,
        ["export", str(plan), "--framework", "megatron", "--out", str(tmp_path / "o")],
        "the top level must be an object",
    )


# -- 3. output paths ------------------------------------------------------------------------------
@pytest.fixture
def saved_plan(capsys, tmp_path) -> Path:
    code, out, err = run_cli(capsys, PLAN + ["--json"])
    assert code == 0, err
    path = tmp_path / "plan.json"
    path.write_text(out)
    return path


def test_output_paths_that_cannot_be_written(capsys, tmp_path, saved_plan) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    a_folder = tmp_path / "a-folder"
    a_folder.mkdir()
    too_long = tmp_path / ("x" * 300)
    cases = [
        (EVALUATE + ["--plot", str(a_file)], f"--plot '{a_file}' is not a folder"),
        (EVALUATE + ["--plot", str(a_file / "plots")], f"'{a_file}' is not a folder"),
        (EVALUATE + ["--plot", str(too_long)], "cannot be written: File name too long"),
        (PLAN + ["--export", "megatron", "--out", str(a_file)], f"--out '{a_file}' is not a folder"),
        (["export", str(saved_plan), "--framework", "nemo", "--out", str(too_long / "x")], "File name too long"),
        (COMPARE + ["--csv", str(a_folder)], f"--csv '{a_folder}' is a folder; a file name is needed"),
        (COMPARE + ["--plot", str(a_file / "c.png")], f"'{a_file}' is not a folder"),
        (["nest-solve", "missing.json", str(a_folder)], f"OUTPUT.json '{a_folder}' is a folder"),
        (["sweep", "spec.toml", "--out", str(a_file)], f"--out '{a_file}' is not a folder"),
    ]
    for argv, needle in cases:
        out, _ = _fails(capsys, argv, needle)
        assert out == ""


def test_unwritable_output_is_refused_before_the_work(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("nestplan.cli.output.os.access", lambda path, mode: False)
    monkeypatch.setattr(api, "plan", lambda *a, **k: pytest.fail("searched before checking --plot"))
    _fails(capsys, PLAN + ["--plot", str(tmp_path / "plots")], f"'{tmp_path}' is not writable")


def test_full_disk_leaves_no_half_written_file(capsys, tmp_path, monkeypatch) -> None:
    from matplotlib.figure import Figure

    def half_then_full(self, path, **kwargs):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(Figure, "savefig", half_then_full)
    plots = tmp_path / "plots"
    out, line = _fails(capsys, EVALUATE + ["--plot", str(plots)], "cannot be written: No space left on device")
    assert out == ""  # the outputs are written before anything is printed: a failure prints only its line
    assert not plots.exists() and list(tmp_path.glob(".nestplan-*")) == []  # no empty folder left behind
    table = tmp_path / "c.png"
    _fails(capsys, COMPARE + ["--plot", str(table)], "No space left on device")
    assert list(tmp_path.glob("*.png")) == [] and list(tmp_path.glob(".nestplan-*")) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_nest_solve_output_on_a_full_device(capsys, tmp_path) -> None:
    from test_nest_compat import _tiny

    source = tmp_path / "in.json"
    source.write_text(json.dumps(_tiny()))
    _fails(capsys, ["nest-solve", str(source), "/dev/full"], "OUTPUT.json '/dev/full' cannot be written: No space")


def test_an_unforeseen_os_error_is_one_line(capsys, monkeypatch) -> None:
    def broken(kind):
        raise OSError(errno.EIO, "Input/output error", "/catalog/\x1b[31m")

    monkeypatch.setattr(api, "catalog_entries", broken)
    _fails(capsys, ["list", "models"], "nestplan: error: Input/output error ('/catalog/\\x1b[31m')")


# -- 4. the outputs before the plan: a late --plot failure prints its line only (issue 30) ---------------
@pytest.mark.parametrize("argv", [EVALUATE, PLAN + ["--json"]])
def test_a_plot_failure_prints_no_plan(capsys, tmp_path, monkeypatch, argv) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out, line = _fails(capsys, argv + ["--plot", str(tmp_path / "p")], "needs matplotlib")
    assert out == "" and list(tmp_path.iterdir()) == []


# -- 5. --version, python -m nestplan -------------------------------------------------------------
def test_version(capsys) -> None:
    code, out, _ = run_cli(capsys, ["--version"])
    assert code == 0 and out == f"nestplan {nestplan.__version__}\n"
    assert nestplan.__version__[0].isdigit()


def test_python_dash_m() -> None:
    done = subprocess.run([sys.executable, "-m", "nestplan", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == f"nestplan {nestplan.__version__}\n"


# -- 6. the catalog as tables ---------------------------------------------------------------------
def test_list_tables(capsys) -> None:
    code, out, _ = run_cli(capsys, ["list", "models"])
    row = next(line for line in out.splitlines() if " mixtral-8x7b " in line)
    assert code == 0 and "mixtral" in row and "46.7" in row and " 8 " in row and "Mixtral-8x7B" in row
    _, out, _ = run_cli(capsys, ["list", "accelerators"])
    row = next(line for line in out.splitlines() if " h100-sxm-80gb " in line)
    assert "990" in row and "80" in row and "3.35" in row
    _, out, _ = run_cli(capsys, ["list", "clusters"])
    row = next(line for line in out.splitlines() if " h100-spine-leaf " in line)
    assert "h100-sxm-80gb" in row and "1,024" in row and "node 8 x leaf 4 x spine 32" in row


def test_list_json_and_names(capsys) -> None:
    code, out, _ = run_cli(capsys, ["list", "clusters", "--json"])
    entries = json.loads(out)
    assert code == 0 and [e["name"] for e in entries] == api.catalog_names("clusters")
    llama = next(e for e in entries if e["name"] == "llama3-h100")
    assert llama["devices"] == 24576 and [lv["size"] for lv in llama["levels"]] == [8, 2, 192, 8]
    _, out, _ = run_cli(capsys, ["list", "accelerators", "--names"])
    assert out.split("\n")[:-1] == api.catalog_names("accelerators")


# -- 7. no wrapping on a pipe ---------------------------------------------------------------------
def test_piped_rows_stay_one_line(capsys) -> None:
    code, out, _ = run_cli(capsys, PLAN + ["--top", "3"])
    runner_ups = [line for line in out.splitlines() if line.startswith("│") and "ZeRO" in line]
    assert code == 0 and len(runner_ups) == 3
    assert all("tp-cp-ep" in line or "tp-cp-ep-dp-pp" in line for line in runner_ups)
    assert max(len(line) for line in out.splitlines()) > 80
    _, out, _ = run_cli(capsys, ["list", "models"])
    row = next(line for line in out.splitlines() if " bert-large " in line)
    assert "BERT-Large of Devlin" in row


# -- 8. help text keeps its brackets --------------------------------------------------------------
def test_help_shows_the_extra_name(capsys) -> None:
    code, out, _ = run_cli(capsys, ["plan", "--help"])
    assert code == 0 and "(extra [trace])" in " ".join(out.split())


def test_no_arguments_print_the_help(capsys) -> None:
    code, out, err = run_cli(capsys, [])
    assert code == 2 and out.startswith("Usage: nestplan") and "\n  list " in out
    assert _one_line(err) == "nestplan: error: no command given; choose one of the commands listed above"


# -- 9. evaluate of a plan that does not fit ------------------------------------------------------
def test_evaluate_not_fitting_warns_first_and_exits_0(capsys) -> None:
    code, out, err = run_cli(capsys, NOT_FITTING)
    assert code == 0
    assert _one_line(err).startswith("nestplan: warning: the plan does not fit: 215.33 GiB per device exceeds 80.00")
    assert "does not fit" in out.splitlines()[0]
    code, out, err = run_cli(capsys, NOT_FITTING + ["--json"])
    assert code == 0 and json.loads(out)["prediction"]["fits"] is False and "does not fit" in err


def test_evaluate_fitting_says_so_in_the_headline(capsys) -> None:
    code, out, err = run_cli(capsys, EVALUATE)
    assert code == 0 and err == "" and "fits in memory" in out.splitlines()[0]


# -- 10. --dp beside --ep: Megatron-LM's convention -----------------------------------------------
def test_megatron_dp_is_converted_with_a_note(capsys) -> None:
    code, out, err = run_cli(capsys, MIXTRAL + ["--dp", "32", "--json"])
    assert code == 0, err
    assert json.loads(out)["parallel"]["dp"] == 4 and json.loads(out)["devices_used"] == 512
    assert "read as Megatron-LM's data-parallel size" in _one_line(err) and "= 4" in err


def test_nestplan_dp_is_taken_as_it_is(capsys) -> None:
    code, out, err = run_cli(capsys, MIXTRAL + ["--dp", "4", "--json"])
    assert code == 0 and err == "" and json.loads(out)["parallel"]["dp"] == 4


def test_dp_matching_neither_convention_explains_both(capsys) -> None:
    _, line = _fails(capsys, MIXTRAL + ["--dp", "16"], "= 2048, not the 512 devices asked for")
    assert "Megatron-LM's dp counts them" in line and "nestplan's dp 4, which is Megatron-LM's dp 32" in line


# -- 11. compare in the library -------------------------------------------------------------------
def test_compare_runs_each_baseline_once() -> None:
    [result] = api.compare(
        [api.CompareCase("bert-large", "v100-spine-leaf", (8,))], ["manual", "manual", "MANUAL"], global_batch_size=64
    )
    assert [r.planner for r in result.rows] == ["nestplan", "manual"] and result.tag == "bert-large_v100-spine-leaf"


def test_job_takes_the_optimizer_by_name_and_refuses_others() -> None:
    """A plain string is the same optimizer as the enum (it was costed as SGD when compared by identity)."""
    from nestplan.errors import ConfigError
    from nestplan.job import Job, Optimizer

    assert Job(8, 1024, optimizer="adam").optimizer is Optimizer.ADAM
    assert Job(8, 1024, optimizer="adam").optimizer_state_bytes == 12
    for bad in ("lion", 3, None):
        with pytest.raises(ConfigError, match="optimizer"):
            Job(8, 1024, optimizer=bad)
    with pytest.raises(ConfigError, match="flash_attention"):
        Job(8, 1024, settings=RunSettings(flash_attention="no"))


def test_megatron_dp_note_waits_for_the_evaluation(capsys) -> None:
    """Found by the fuzzer: a dense model with --ep 2 and Megatron's dp printed the conversion note and
    then the error, two lines; an error is the only line."""
    _, line = _fails(
        capsys,
        [
            "evaluate",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-a100",
            "--devices",
            "16",
            "--tp",
            "2",
            "--pp",
            "2",
            "--dp",
            "4",
            "--ep",
            "2",
            "--global-batch-size",
            "64",
            "--seq-len",
            "2048",
        ],
        "mixture-of-experts",
    )
    assert "note" not in line
