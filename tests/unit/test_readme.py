"""The newcomer's path: the README starts with the two commands and .ci/run runs exactly those;
the dev install is light and the default test run leaves out the slow tests; the documentation
the README points to is in the repository and its links resolve."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "deepspeed", "ray", "transformers")
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip() and not line.startswith("#")]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def test_readme_opens_with_two_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert "nestplan " in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_commands() -> None:
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in _readme_commands():
        assert command in ci, command


def test_ci_runs_every_test_with_every_extra() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-e '.[all]'" in ci and "python3 -m pytest -m ''" in ci


def test_dev_extra_is_light_and_plots_need_no_extra() -> None:
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    assert not [r for r in extras["dev"] if _package(r) in HEAVY]
    assert "matplotlib" in {_package(r) for r in project["dependencies"]}
    assert {"trace", "ray", "validate", "all"} <= set(extras)
    # exact pins only in `frameworks` (the releases the export tests validate against) and hypothesis in
    # `dev` (the release whose fixed draws the tests make, tests/conftest.py)
    pinned = [
        r
        for name, rs in [("", project["dependencies"]), *extras.items()]
        for r in rs
        if "==" in r and name != "frameworks" and (name, _package(r)) != ("dev", "hypothesis")
    ]
    assert not pinned, pinned


def test_default_run_deselects_the_registered_slow_marker() -> None:
    options = _pyproject()["tool"]["pytest"]["ini_options"]
    args = shlex.split(options["addopts"])
    assert args[args.index("-m") + 1] == "not slow"
    assert "--strict-markers" in args
    assert any(m.startswith("slow:") for m in options["markers"])


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file(), f"{page.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked.read_text()), f"{page.name}: {target}"


def test_the_documentation_is_in_the_repository() -> None:
    """The README and docs/ document the project themselves: no pointer to a design file outside it."""
    assert {p.name for p in DOCS} >= {"design.md", "formats.md", "reading-the-output.md", "workflow.md"}
    for page in [ROOT / "README.md", *DOCS]:
        assert "DESIGN.md" not in page.read_text(), page.name
