"""The HTML report (``--report``, ``nestplan.report.html``): its sections, its escaping of every
input string, that it needs nothing from the network, and that headless Chromium renders it
without console errors (skipped, with the reason, where Chromium, chromedriver or selenium is absent)."""

from __future__ import annotations

import html
import importlib.util
import io
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cli_helpers import run_cli
from nestplan import api
from nestplan.export import FRAMEWORKS
from nestplan.job import Job
from nestplan.cost.run import RunLength
from nestplan.report.answer import answer_lines, best_alternative, changes
from nestplan.report.html import compare_report, plan_report
from nestplan.search.compare import CompareRow
from nestplan.strategy.describe import describe
from nestplan.strategy.dims import ParallelDims
from nestplan.strategy.enums import Recompute, ZeroStage

HOSTILE = "<script>alert('x')</script>"
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
    "--global-batch-size",
    "64",
    "--recompute",
    "full",
]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def _evaluation(zero: ZeroStage = ZeroStage.OPTIMIZER):
    dims = ParallelDims(tp=8, pp=8, zero=zero, recompute=Recompute.FULL)
    return api.evaluate_full("gpt3-175b", "dgx-a100", dims, Job(global_batch_size=64, seq_len=2048), devices=64)


@pytest.fixture(scope="module")
def evaluated():
    return _evaluation().plan


@pytest.fixture(scope="module")
def page(evaluated):
    """The evaluated plan's report, built once for the tests that only read it."""
    return plan_report(evaluated)


@pytest.fixture(scope="module")
def searched():
    return api.plan("llama2-7b", "h100-spine-leaf", devices=16, global_batch_size=64, seq_len=2048, top=3)


def _attribute_values(page: str, name: str) -> list[str]:
    return re.findall(rf'\b{name}="([^"]*)"', page)


def _section(page: str, anchor: str) -> str:
    match = re.search(rf'<section id="{anchor}">(.*?)</section>', page, re.S)
    assert match, f"no section {anchor}"
    return match[1]


# -- content --------------------------------------------------------------------------------------
def test_plan_page_has_every_section_with_the_plans_figures(evaluated, page):
    for anchor in ("plan", "prediction", "memory", "pictures", "exports", "validation", "plan-json"):
        assert f'<section id="{anchor}">' in page
    p = evaluated.predicted
    assert f"{p.step_time_s:.4f} s" in _section(page, "prediction")
    assert f"{p.mfu:.1%}" in _section(page, "prediction")
    memory = _section(page, "memory")
    assert memory.count("<tr>") == 1 + evaluated.dims.pp  # the header and a row per stage
    assert "E+0-" in memory and "+H</td>" in memory
    assert f"rank order {'-'.join(evaluated.axis_order)} (fastest axis first)" in _section(page, "plan")
    assert 'id="runners-up"' not in page  # an evaluation has none


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_pictures_are_inlined_pngs(page):
    pictures = _section(page, "pictures")
    sources = _attribute_values(pictures, "src")
    assert len(sources) == 3  # timeline, memory, placement
    assert all(s.startswith("data:image/png;base64,iVBORw0KGgo") for s in sources)  # base64 of the PNG signature


def test_without_matplotlib_the_page_says_so_in_one_line(evaluated, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    pictures = _section(plan_report(evaluated), "pictures")
    assert "<img" not in pictures
    assert pictures == "<h2>Pictures</h2><p>No pictures: matplotlib is not installed (pip install matplotlib).</p>"


def test_every_framework_export_is_on_the_page_with_its_notes(evaluated, page, tmp_path):
    exports = _section(page, "exports")
    for framework in FRAMEWORKS:
        assert f"<h3>{framework}</h3>" in exports
        paths, result = api.export_plan(evaluated, framework, tmp_path / framework)  # what nestplan export writes
        for path in paths:
            assert f"<summary>{path.name}</summary><pre>{html.escape(path.read_text())}</pre>" in exports
        for note in result.notes:
            assert f"<li>{html.escape(note)}</li>" in exports


def test_a_framework_that_cannot_run_the_plan_gives_its_reason_and_the_others_still_export(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no pictures: this page is read for its exports only
    plan = _evaluation(ZeroStage.GRADIENTS).plan  # DeepSpeed's pipeline engine takes ZeRO 0 and 1 only
    exports = _section(plan_report(plan), "exports")
    assert '<h3>deepspeed</h3><p class="note">not exported: cannot export to' in exports
    assert "launch_megatron.sh" in exports


def test_runners_up_say_why_each_lost(searched):
    page = plan_report(searched.plan, searched.runners_up)
    rows = _section(page, "runners-up").split("<tr>")[2:]
    assert len(rows) == len(searched.runners_up) > 0
    assert all(re.search(r"tie: same predicted time|[a-z_]+ \+[0-9.]+ s", row) for row in rows)


def test_validation_names_the_measured_set_of_the_accelerator_and_the_validate_command(evaluated, page, monkeypatch):
    validation = _section(page, "validation")
    assert "Korthikanti et al. 2022" in validation and "a100-80gb" in validation
    assert "nestplan validate RUNS.json" in validation
    other = replace(
        evaluated,
        cluster=replace(evaluated.cluster, accelerator=replace(evaluated.cluster.accelerator, name="my-accelerator")),
    )
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no pictures: this page is read for its text only
    assert "No published runs on my-accelerator" in _section(plan_report(other), "validation")


def test_names_from_the_input_are_escaped(evaluated):
    """In the text, the tables, the exports' files and notes and the plan JSON alike."""
    hostile = replace(
        evaluated, model=replace(evaluated.model, name=HOSTILE), cluster=replace(evaluated.cluster, name=HOSTILE + "&")
    )
    page = plan_report(hostile)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "&lt;/script&gt;&amp;" in page


def test_the_page_needs_nothing_from_the_network(page):
    links = _attribute_values(page, "src") + _attribute_values(page, "href")
    assert links and all(link.startswith(("data:", "#")) for link in links)
    assert not re.search(r"<(script|iframe|object|embed)\b|@import|url\(", page, re.I)


@dataclass(frozen=True)
class _Comparison:
    title: str
    rows: list[CompareRow]
    normalised: list[float]


def test_compare_page_has_a_table_and_a_figure_per_case_and_escapes_titles():
    rows = [
        CompareRow("m", "c", 64, 1, "nestplan", True, 2000.0, 0.1, "tp1 pp1 dp64 z1 none"),
        CompareRow("m", "c", 64, 1, "manual", True, 1000.0, 0.0, "tp8 pp1 dp8 z0 none"),
        CompareRow("m", "c", 64, 1, "alpa", False, 0.0, 0.0, "-"),
    ]
    page = compare_report([_Comparison(HOSTILE, rows, [2.0, 1.0, 0.0])])
    case = _section(page, "case-0")
    assert "<td>2,000</td><td>2.00</td>" in case and '<td class="text">alpa</td><td>-</td><td>-</td>' in case
    assert "<script" not in page.lower()
    if HAS_MATPLOTLIB:
        assert _attribute_values(case, "src")[0].startswith("data:image/png;base64,")


# -- the answer first (report/answer.py) ----------------------------------------------------------
def _runner_up(best, step_factor: float, order: tuple[str, ...] | None = None, **changed):
    """``best`` as a runner-up: its step scaled, its placement's rank order or its degrees changed."""
    placement = best.placement if order is None else replace(best.placement, axis_order=order)
    return replace(
        best, step_time_s=best.step_time_s * step_factor, plan=replace(best.plan, **changed), placement=placement
    )


def _why(plan, runners_up) -> str:
    return dict(answer_lines(plan, runners_up))["why this plan"]


def test_the_answer_opens_the_page_before_any_figure(searched):
    page = plan_report(searched.plan, searched.runners_up)
    answer = _section(page, "answer")
    assert page.index('<section id="answer">') < page.index("<nav>") < page.index('<section id="plan">')
    assert "<img" not in page[: page.index('<section id="pictures">')]
    p = searched.plan.predicted
    for label in ("what to run", "predicted step", "memory", "why this plan"):
        assert f"<th>{label}</th>" in answer
    assert f"{p.step_time_s:.3f} s, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}" in answer
    assert html.escape(str(searched.plan.trust["note"]), quote=True) in answer
    assert describe(searched.plan.dims, searched.plan.axis_order, long=True) in answer
    assert "fits in memory (" in answer and "% headroom)" in answer
    assert "whole run" not in answer  # no run asked


def test_an_evaluation_says_no_why_and_a_run_gives_its_days_and_cost(evaluated):
    lines = dict(answer_lines(evaluated))
    assert "why this plan" not in lines and "whole run" not in lines
    run = evaluated.with_run(RunLength(tokens=1e11))
    assert dict(answer_lines(run))["whole run"].startswith(f"{run.run.days:.2f} days, cost ")


def test_a_runner_up_differing_only_by_rank_order_is_skipped(searched):
    plan, best = searched.plan, searched.best
    twin = _runner_up(best, 1.001, order=("tp", "cp", "ep", "pp", "dp"))
    other = _runner_up(best, 1.2, recompute=Recompute.FULL, micro_batch_size=4)
    alternative = best_alternative(plan, [twin, other])
    assert changes(plan, twin) == ()
    assert alternative.changes == ("recompute full → none", "mbs 4 → 8")
    assert alternative.slower_s == pytest.approx(0.2 * best.step_time_s) and not alternative.tie
    why = _why(plan, [twin, other])
    assert why.startswith("the best runner-up that differs in more than rank order (recompute full → none, mbs 4 → 8;")
    assert f"is {0.2 * best.step_time_s:.3f} s (20.0%) slower per step" in why


def test_no_runner_up_other_than_rank_order_twins(searched):
    plan, best = searched.plan, searched.best
    twins = [_runner_up(best, 1.01, order=("tp", "cp", "ep", "pp", "dp")), _runner_up(best, 1.02)]
    assert best_alternative(plan, twins) is None
    assert _why(plan, twins).startswith("no other plan to compare with: the 2 runner-ups kept differ from it in rank")
    assert _why(plan, ()) == "no runner-up to compare with (--top K keeps K of them)"


def test_a_runner_up_within_the_trust_band_is_a_tie(searched):
    plan, best = searched.plan, searched.best
    band = float(plan.trust["median_error"])
    close = _runner_up(best, 1 + band / 2, zero=ZeroStage.NONE)
    assert best_alternative(plan, [close]).tie
    assert _why(plan, [close]).startswith("a tie: the best runner-up that differs in more than rank order (ZeRO 0 → 1;")
    far = _runner_up(best, 1 + 2 * band, zero=ZeroStage.NONE)
    assert not best_alternative(plan, [far]).tie


def test_a_run_setting_is_a_difference(searched):
    plan, best = searched.plan, searched.best
    other = replace(_runner_up(best, 1.3), settings=replace(best.settings, tp_comm_overlap=True))
    assert changes(plan, other) == ("tp comm overlap True → False",)


# -- the command line -----------------------------------------------------------------------------
def test_evaluate_writes_the_report_and_names_it_on_stderr(capsys, tmp_path):
    target = tmp_path / "out" / "report.html"
    code, _, err = run_cli(capsys, EVALUATE + ["--report", str(target)])
    assert code == 0
    assert err == f"nestplan: wrote the report {target}\n"
    page = target.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'id="exports"' in page
    assert [p.name for p in target.parent.iterdir()] == ["report.html"]  # no partial file left


def test_report_on_a_folder_is_refused_before_any_work(capsys, tmp_path):
    code, out, err = run_cli(
        capsys,
        ["plan", "--model", "llama2-7b", "--cluster", "h100-spine-leaf", "--devices", "16", "--report", str(tmp_path)],
    )
    assert code == 2 and out == ""
    assert err.startswith("nestplan: error: --report") and "is a folder" in err


def test_compare_writes_one_report(capsys, tmp_path):
    target = tmp_path / "compare.html"
    code, _, err = run_cli(
        capsys,
        [
            "compare",
            "--model",
            "llama2-7b",
            "--cluster",
            "h100-spine-leaf",
            "--devices",
            "16",
            "--baselines",
            "manual",
            "--global-batch-size",
            "64",
            "--report",
            str(target),
        ],
    )
    assert code == 0 and "wrote the report" in err
    assert '<section id="case-0"><h2>llama2-7b on h100-spine-leaf</h2>' in target.read_text()


# -- in a real browser ----------------------------------------------------------------------------
def _browser():
    """Headless Chromium through Debian's chromedriver, or a skip naming what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            pytest.skip(f"{path} is absent (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


def _distinct_colours(png: bytes) -> int:
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
    with image.open(io.BytesIO(png)) as shot:
        return len(shot.convert("RGB").getcolors(maxcolors=1 << 24))


def test_chromium_renders_the_report_without_console_errors(searched, tmp_path):
    target = tmp_path / "report.html"
    target.write_text(plan_report(searched.plan, searched.runners_up), encoding="utf-8")
    driver = _browser()
    try:
        driver.get(target.as_uri())
        title = driver.title
        images = driver.execute_script("return Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
        png = driver.get_screenshot_as_png()
        (tmp_path / "screenshot.png").write_bytes(png)
        log = driver.get_log("browser")
    finally:
        driver.quit()
    assert title == "nestplan report: llama2-7b on h100-spine-leaf"
    severe = [entry for entry in log if entry["level"] == "SEVERE"]
    assert not severe, f"console errors: {severe}"
    assert _distinct_colours(png) > 50  # text, tables and a heading rule: far from a blank page
    assert images == ([True, True, True] if HAS_MATPLOTLIB else [])  # every inlined figure decoded
