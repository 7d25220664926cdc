"""The whole run in the HTML report: a plan with a run has its figures (days, GPU-hours, cost, energy,
goodput, checkpoint interval, interruptions); a device range its table and a plot of days and cost against
devices; a comparison with runs their columns."""

from __future__ import annotations

import base64
import importlib.util
import re

from cli_helpers import run_cli

from nestplan.report.html import compare_report
from nestplan.search.compare import CompareRow

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
RANGE = ["plan", "--model", "llama3-8b", "--cluster", "h100-spine-leaf", "--global-batch-size", "64"]
RANGE += ["--seq-len", "2048", "--tokens", "1e11", "--top", "0", "--price-per-gpu-hour", "2"]


def _section(page: str, anchor: str) -> str:
    start = page.index(f'<section id="{anchor}">')
    return page[start : page.index("</section>", start)]


def test_a_range_report_shows_the_run_the_table_and_the_plot(capsys, tmp_path) -> None:
    target = tmp_path / "report.html"
    code, out, _ = run_cli(capsys, RANGE + ["--devices-range", "8..64", "--objective", "cost", "--report", str(target)])
    assert code == 0
    page = target.read_text()
    run = _section(page, "run")
    for figure in ("wall-clock", "GPU-hours", "energy", "cost", "goodput", "checkpoint interval", "interruptions"):
        assert f'<td class="text">{figure}</td>' in run
    devices = _section(page, "devices")
    assert devices.count("<tr>") == 1 + 4 and "chosen" in devices and "objective <b>cost</b>" in devices
    if HAS_MATPLOTLIB:
        [png] = re.findall(r'src="data:image/png;base64,([^"]+)"', devices)
        assert base64.b64decode(png).startswith(b"\x89PNG")


def test_a_plan_without_a_run_has_neither_section(capsys, tmp_path) -> None:
    target = tmp_path / "report.html"
    code, _, _ = run_cli(capsys, RANGE[:9] + ["--devices", "8", "--top", "0", "--report", str(target)])
    page = target.read_text()
    assert code == 0 and 'id="run"' not in page and 'id="devices"' not in page


def test_a_comparisons_page_shows_each_rows_run() -> None:
    class Case:
        title = "m on c"
        rows = [
            CompareRow("m", "c", 64, 1, "nestplan", True, 2000.0, 0.1, "tp1", 3.5, 5376.0, 9.0, 10752.0, 0.97),
            CompareRow("m", "c", 64, 1, "alpa", False, 0.0, 0.0, "-"),
        ]
        normalised = [1.0, 0.0]

    case = _section(compare_report([Case()]), "case-0")
    assert "<th>goodput</th>" in case and "<td>3.5</td><td>5,376</td><td>9</td><td>$10,752</td><td>97.0%</td>" in case
    assert "<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>" in case
