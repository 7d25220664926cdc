"""`nestplan sweep`: spec validation, store and resume, kill -9, local vs Ray, report."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.errors import ConfigError
from nestplan.sweep.spec import expand, load_spec

SPEC = """
name = "test"
models = ["bert-large", "llama2-7b"]
devices = [8, 16, 32]
global_batch_size = [64]
seq_len = [512]

[[clusters]]
base = "h100-spine-leaf"
label = "spine-leaf"
[clusters.set]
"spine.size" = 8
[clusters.sweep]
"spine.oversubscription" = [1, 2, 4]
"leaf.size" = [1, 2, 4]
"""
QUICK_SPEC = (
    SPEC.replace("devices = [8, 16, 32]", "devices = [8, 16]")  # 16 cases: 2 models x 4 variants x 2
    .replace('"spine.oversubscription" = [1, 2, 4]', '"spine.oversubscription" = [1, 2]')
    .replace('"leaf.size" = [1, 2, 4]', '"leaf.size" = [1, 2]')
)
QUICK_CASES = 16
RESULT_COLUMNS = "key, status, tokens_per_s, step_time_s, mfu, peak_memory_GiB, plan, error"


def _write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _results(store: Path) -> dict:
    db = sqlite3.connect(store)
    try:
        return {row[0]: row[1:] for row in db.execute(f"SELECT {RESULT_COLUMNS} FROM results")}
    finally:
        db.close()


def test_spec_expands_every_combination(tmp_path) -> None:
    cases = expand(load_spec(_write(tmp_path, SPEC)))
    assert len(cases) == 2 * 9 * 3
    assert len({c.key for c in cases}) == len(cases)
    assert dict(cases[0].overrides)["spine.size"] == 8


@pytest.mark.parametrize(
    "text,named",
    [
        ('models = ["bert-large"]\ndevices = [8]\nbogus = 1\n[[clusters]]\nbase = "dgx-a100"\n', "bogus"),
        ('models = ["bert-large"]\ndevices = [0]\n[[clusters]]\nbase = "dgx-a100"\n', "devices"),
        ('models = ["bert-large"]\ndevices = [8]\n[[clusters]]\nbase = "dgx-a100"\nfoo = 2\n', "foo"),
        (
            'models = ["bert-large"]\ndevices = [8]\n[[clusters]]\nbase = "dgx-a100"\n[clusters.sweep]\n"node.speed" = [1]\n',
            "node.speed",
        ),
        (
            'models = ["bert-large"]\ndevices = [8]\n[[clusters]]\nbase = "dgx-a100"\n[clusters.sweep]\n"spine.size" = [2]\n',
            "spine",
        ),
        ('models = ["no-such-model"]\ndevices = [8]\n[[clusters]]\nbase = "dgx-a100"\n', "no-such-model"),
    ],
)
def test_bad_spec_one_line_exit_2_nothing_written(capsys, tmp_path, text, named) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, ["sweep", str(_write(tmp_path, text)), "--out", str(out)])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and named in err
    assert not out.exists()


def test_failures_are_recorded_and_resume_skips_finished(tmp_path) -> None:
    spec = _write(
        tmp_path,
        'keep = ["breakdown", "stages"]\n'
        + SPEC.replace("devices = [8, 16, 32]", "devices = [8, 4096]")
        .replace('"spine.oversubscription" = [1, 2, 4]', '"spine.oversubscription" = [1]')
        .replace('"leaf.size" = [1, 2, 4]', '"leaf.size" = [2]'),
    )
    first = api.sweep(spec, tmp_path / "out", workers=1)
    assert (first.total, first.skipped, first.finished) == (4, 0, 4)
    rows = {k: v for k, v in _results(first.store).items()}
    statuses = sorted(v[0] for v in rows.values())
    assert statuses == ["error", "error", "ok", "ok"]  # 4,096 devices do not exist in the variant
    assert all("fewer than" in v[-1] for v in rows.values() if v[0] == "error")
    db = sqlite3.connect(first.store)
    details = [json.loads(d) for (d,) in db.execute("SELECT details FROM results WHERE status = 'ok'")]
    db.close()
    assert all(set(d) == {"breakdown", "stages"} and d["breakdown"]["optimizer"] > 0 for d in details)
    again = api.sweep(spec, tmp_path / "out", workers=2)
    assert (again.skipped, again.finished) == (4, 0)
    assert _results(first.store) == rows


@pytest.mark.slow
def test_kill_minus_9_then_resume_loses_and_repeats_nothing(tmp_path) -> None:
    spec = _write(tmp_path, QUICK_SPEC)
    out = tmp_path / "out"
    store = out / "results.sqlite"
    cmd = [sys.executable, "-m", "nestplan.cli", "sweep", str(spec), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    before: dict = {}
    while time.time() < deadline:
        if store.exists():
            try:
                before = _results(store)
            except sqlite3.OperationalError:
                before = {}
            if len(before) >= 3:
                break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, mid-sweep
    proc.wait()
    assert 3 <= len(before) < QUICK_CASES, "the sweep should have been killed part-way"
    kept = _results(store)
    assert set(before) <= set(kept)
    summary = api.sweep(spec, out, workers=2)
    assert summary.skipped == len(kept) and summary.skipped + summary.finished == QUICK_CASES
    after = _results(store)
    assert len(after) == QUICK_CASES and all(after[k] == v for k, v in kept.items())
    db = sqlite3.connect(store)
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM results").fetchone() == (QUICK_CASES, QUICK_CASES)
    db.close()


@pytest.mark.slow
def test_ray_and_local_processes_give_identical_results(tmp_path) -> None:
    pytest.importorskip("ray", reason="needs the [ray] extra: pip install -e '.[ray]'")
    spec = _write(tmp_path, QUICK_SPEC)
    local = api.sweep(spec, tmp_path / "local", workers=2)
    on_ray = api.sweep(spec, tmp_path / "ray", ray="local")
    assert local.finished == on_ray.finished == QUICK_CASES and local.failed == 0
    assert _results(local.store) == _results(on_ray.store)


def test_report_table_csv_and_plots(capsys, tmp_path) -> None:
    spec = _write(tmp_path, QUICK_SPEC.replace('models = ["bert-large", "llama2-7b"]', 'models = ["bert-large"]'))
    api.sweep(spec, tmp_path / "out", workers=2)
    code, out, _ = run_cli(capsys, ["sweep", "report", str(tmp_path / "out")])
    assert code == 0 and "bert-large" in out
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "results.csv" in names and "throughput.png" in names
    assert "heatmap_bert-large_leaf.size_spine.oversubscription.png" in names
    assert len((tmp_path / "out" / "results.csv").read_text().splitlines()) == 1 + QUICK_CASES // 2
    code, _, err = run_cli(capsys, ["sweep", "report", str(tmp_path / "nothing")])
    assert code == 2 and "results.sqlite" in err


def test_ranges_and_accelerator(tmp_path) -> None:
    spec = load_spec(
        _write(
            tmp_path,
            """
models = ["bert-large"]
devices = {from = 8, to = 64, times = 2}
[[clusters]]
base = "h100-spine-leaf"
accelerator = "h200-141gb"
[clusters.sweep]
"spine.oversubscription" = {from = 1, to = 4, step = 1}
""",
        )
    )
    assert spec.devices == (8, 16, 32, 64)
    assert spec.clusters[0].swept == (("spine.oversubscription", (1, 2, 3, 4)),)
    from nestplan.sweep.run import build_cluster

    case = expand(spec)[0]
    assert build_cluster(case).accelerator.name == "h200-141gb"
    with pytest.raises(ConfigError, match="range"):
        load_spec(
            _write(
                tmp_path,
                'models = ["bert-large"]\ndevices = {from = 8, to = 4, step = 1}\n[[clusters]]\nbase = "dgx-a100"\n',
                "bad.toml",
            )
        )


def test_load_spec_rejects_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec(tmp_path / "missing.toml")
