"""`nestplan sweep` on hostile input: bounded specs, broken stores and folders, orphaned workers,
report cells shown literally."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_cli
from rich.console import Console

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.sweep import run as run_module
from nestplan.sweep import store as store_module
from nestplan.sweep.report import report_table
from nestplan.sweep.spec import MAX_CASES, MAX_RANGE_VALUES, load_spec, spec_from_dict
from nestplan.sweep.store import Store

SMALL = (
    'models = ["bert-large"]\ndevices = [8]\nglobal_batch_size = [64]\nseq_len = [512]\n'
    '[[clusters]]\nbase = "dgx-a100"\n'
)
INPUTS = {
    "key": "k",
    "model": "bert-large",
    "cluster": "dgx-a100",
    "label": "dgx-a100",
    "accelerator": None,
    "overrides": {},
    "devices": 8,
    "global_batch_size": 64,
    "seq_len": 512,
    "hbm_GiB": None,
}


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    code, _, err = run_cli(capsys, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "text,named",
    [
        (SMALL.replace("devices = [8]", "devices = {from = 1, to = 1e9, step = 1}"), f"{MAX_RANGE_VALUES:,} values"),
        (
            SMALL.replace("devices = [8]", "devices = {from = 1, to = 10000, step = 1}").replace(
                "seq_len = [512]", "seq_len = {from = 512, to = 1024, step = 32}"
            ),
            f"at most {MAX_CASES:,}",
        ),
        (SMALL.replace("devices = [8]", "devices = {from = 1e20, to = 2e20, step = 1}"), "values"),  # x + 1 == x
        (SMALL + '[clusters.sweep]\n"node.latency_us" = {from = 0, to = 10, times = 2}\n', "from > 0"),
        (SMALL.replace("devices = [8]", "devices = [9223372036854775807]"), "devices"),
        (SMALL.replace("devices = [8]", "devices = 1e300"), "devices"),
        (SMALL.replace("seq_len = [512]", "seq_len = [4194304]"), "seq_len"),
        (SMALL + "hbm_GiB = [1e308]\n", "hbm_GiB"),
        (SMALL + '[clusters.set]\n"node.bandwidth_GBps" = 1e300\n', "node.bandwidth_GBps"),
        (SMALL + '[clusters.set]\n"node.size" = [4, 8]\n', "node.size"),  # a fixed field is one number
        ("x = " + "[" * 500 + "]" * 500 + "\n" + SMALL, "nested"),
        (SMALL.replace('["bert-large"]', '["bert-\\u001b[31mlarge"]'), "control"),
    ],
    ids=[
        "range-1e9",
        "cases",
        "range-stuck",
        "times-from-0",
        "devices-2^63",
        "devices-1e300",
        "seq-len",
        "hbm-1e308",
        "bandwidth-1e300",
        "fixed-list",
        "nested",
        "escape-in-name",
    ],
)
def test_bad_spec_is_one_line_and_writes_nothing(capsys, tmp_path, text, named) -> None:
    out = tmp_path / "out"
    err = _one_line_exit_2(capsys, ["sweep", str(_spec(tmp_path, text)), "--out", str(out), "--workers", "1"])
    assert named in err
    assert not out.exists()


def test_largest_range_is_kept_whole_not_cut(tmp_path) -> None:
    spec = load_spec(
        _spec(tmp_path, SMALL.replace("devices = [8]", f"devices = {{from = 1, to = {MAX_RANGE_VALUES}, step = 1}}"))
    )
    assert spec.devices == tuple(range(1, MAX_RANGE_VALUES + 1))


def test_names_with_control_characters_are_refused_from_a_dict() -> None:
    data = {"models": ["bert-large"], "devices": [8], "clusters": [{"base": "dgx-a100", "label": "a\x1b[2Jb"}]}
    with pytest.raises(ConfigError, match="control character"):
        spec_from_dict(data)


def test_store_that_is_not_a_database(capsys, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.sqlite").write_text("not a database\n" * 100)
    err = _one_line_exit_2(capsys, ["sweep", str(_spec(tmp_path, SMALL)), "--out", str(out), "--workers", "1"])
    assert "results.sqlite" in err and "not a database" in err
    err = _one_line_exit_2(capsys, ["sweep", "report", str(out)])
    assert "results.sqlite" in err


def test_store_with_another_schema_is_refused_and_left_unchanged(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    db = sqlite3.connect(out / "results.sqlite")
    db.execute("CREATE TABLE results (key TEXT, value REAL)")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="another schema"):
        api.sweep(_spec(tmp_path, SMALL), out, workers=1)
    db = sqlite3.connect(out / "results.sqlite")
    assert [r[1] for r in db.execute("PRAGMA table_info(results)")] == ["key", "value"]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    db.close()


def test_output_folder_that_is_a_file(tmp_path) -> None:
    out = tmp_path / "out"
    out.write_text("a file\n")
    with pytest.raises(ConfigError, match="folder .*out' cannot be made"):
        api.sweep(_spec(tmp_path, SMALL), out, workers=1)


def test_read_only_store_is_one_config_error(monkeypatch, tmp_path) -> None:
    Store(tmp_path / "results.sqlite").close()
    connect = sqlite3.connect
    monkeypatch.setattr(
        store_module.sqlite3,
        "connect",  # what a read-only file or folder gives, even to root
        lambda path, **kwargs: connect(f"file:{path}?mode=ro", uri=True, **kwargs),
    )
    solved = []
    monkeypatch.setattr(run_module, "solve", lambda *args: solved.append(args))
    with pytest.raises(ConfigError, match="results.sqlite.*readonly"):
        api.sweep(_spec(tmp_path, SMALL), tmp_path, workers=1)
    assert solved == []  # refused before the first case, not after it


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder(capsys, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o500)
    try:
        err = _one_line_exit_2(capsys, ["sweep", str(_spec(tmp_path, SMALL)), "--out", str(out), "--workers", "1"])
    finally:
        out.chmod(0o700)
    assert "results.sqlite" in err


def test_full_disk_while_saving_a_case_is_one_config_error(monkeypatch, tmp_path) -> None:
    connect = sqlite3.connect

    def small_disk(*args, **kwargs):  # a database that may not grow beyond 4 pages: SQLITE_FULL
        db = connect(*args, **kwargs)
        db.execute("PRAGMA max_page_count = 4")
        return db

    monkeypatch.setattr(store_module.sqlite3, "connect", small_disk)
    store = Store(tmp_path / "results.sqlite")
    with pytest.raises(ConfigError, match="results.sqlite.*full"):
        for i in range(100):
            store.put(dict(INPUTS, key=f"k{i}"), {"status": "error", "error": "x" * 1500})
    store.close()


def test_row_a_report_cannot_show_is_one_line(capsys, tmp_path) -> None:
    store = Store(tmp_path / "results.sqlite")
    store.put(INPUTS, {"status": "error", "error": "boom"})
    store.close()
    db = sqlite3.connect(tmp_path / "results.sqlite")
    db.execute('UPDATE results SET overrides = \'{"a": "x"}\'')
    db.commit()
    db.close()
    err = _one_line_exit_2(capsys, ["sweep", "report", str(tmp_path)])
    assert "results.sqlite" in err and "overrides" in err


def _render(table) -> str:
    console = Console(file=io.StringIO(), width=300, color_system=None)
    console.print(table)
    return console.file.getvalue()


def test_report_table_shows_names_and_swept_values_literally() -> None:
    plan = {"tp": 8, "sp": True, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "micro_batch_size": 1, "zero_stage": 1}
    ok = {
        "model": "bert-large",
        "label": "a100",
        "accelerator": None,
        "hbm_GiB": None,
        "devices": 16,
        "overrides": {"fabric.bandwidth_GBps": 100},
        "status": "ok",
        "tokens_per_s_per_device": 1234.5,
        "mfu": 0.41,
        "plan": plan,
    }
    odd = dict(ok, model="m[/]x", label="[bold]loud", overrides={}, status="error", plan=None)
    text = _render(report_table([ok, dict(ok, overrides={"fabric.bandwidth_GBps": 200}), odd], "sweep [/]out: 3"))
    assert "a100 [fabric.bandwidth_GBps=100]" in text and "a100 [fabric.bandwidth_GBps=200]" in text
    assert "m[/]x" in text and "[bold]loud" in text and "sweep [/]out: 3" in text
    assert "tp8+sp pp2 dp1 mbs1 zero1" in text and "41.0%" in text


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (psutil where installed, else Linux's /proc)."""
    try:
        import psutil
    except ImportError:
        tasks = Path(f"/proc/{pid}/task")
        return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
    return [p.pid for p in psutil.Process(pid).children()]


def _running(pid: int) -> bool:
    """True while ``pid`` runs (an exited process nobody reaped, a zombie, does not count)."""
    try:
        import psutil
    except ImportError:
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lists child processes through psutil or /proc")
def test_workers_exit_when_only_the_driver_is_killed(tmp_path) -> None:
    spec = _spec(
        tmp_path,
        SMALL.replace("devices = [8]", "devices = [8, 16, 32, 64]").replace(
            '"bert-large"', '"bert-large", "llama2-7b", "llama3-8b"'
        )
        + '[clusters.sweep]\n"node.latency_us" = [1, 2, 3, 4, 5]\n',
    )
    store = tmp_path / "out" / "results.sqlite"
    cmd = [sys.executable, "-m", "nestplan.cli", "sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "2"]
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and driver.poll() is None:  # until both workers have solved something
            workers = _children(driver.pid)
            if len(workers) >= 2 and store.exists() and store.stat().st_size > 0:
                break
            time.sleep(0.1)
        assert driver.poll() is None and len(workers) >= 2, "the sweep should be running with its workers"
        os.kill(driver.pid, signal.SIGKILL)  # the driver only: its workers are not signalled
        driver.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(_running(w) for w in workers):
            time.sleep(0.1)
        assert not [w for w in workers if _running(w)], "workers outlived their driver"
    finally:
        for w in workers:
            if _running(w):
                os.kill(w, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()


def test_device_memory_at_or_below_the_reserve_is_a_failed_case_not_a_negative_budget(tmp_path) -> None:
    """hbm_GiB 1 on an A100 (2 GiB reserved) would leave -1 GiB for the plan: the case fails with the reason."""
    from nestplan.sweep.run import build_cluster
    from nestplan.sweep.spec import expand

    spec = spec_from_dict(
        {
            "models": ["bert-large"],
            "devices": [8],
            "global_batch_size": [64],
            "seq_len": [512],
            "hbm_GiB": [1],
            "clusters": [{"base": "dgx-a100"}],
        }
    )
    with pytest.raises(ConfigError, match="hbm_GiB 1 is not above the 2 GiB"):
        build_cluster(expand(spec)[0])
