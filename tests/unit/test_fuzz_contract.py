"""The CLI's contract under random and mutated input (a hypothesis-driven fuzzer).

The contract, whatever the arguments and files:
- the exit code is 0 (done), 1 (a check failed: ``validate --tolerance``), 2 (bad input) or 3 (nothing
  fits), never a traceback;
- exit 2 or 3 prints exactly one line on stderr, with no control character in it;
- ``--json`` prints valid JSON (no NaN/Infinity) on stdout;
- no file is written outside the paths asked for (``--out``, ``--plot``, ``--report``, OUTPUT.json):
  the commands run in an empty folder that holds only those afterwards (nothing beside them, no
  temporary left behind);
- every case returns within HANG_S seconds (an alarm turns a hang into a failure).

It reaches every input surface: command lines (evaluate, plan and random words), model files (a catalog
config.json mutated, and config files whose names are hostile: ``$``, bidi overrides, zero-width
characters, ``=`` and other formula prefixes, very long), cluster files, plan JSON for export, sweep specs
(mutated from a seed the reader accepts; a test checks that most mutations get past its first checks),
``validate`` runs files (hostile ids, values at the bounds), NEST solver inputs, ``--plot`` and ``--report``,
and large valid values (batch 2^24, sequence 2^21, 2^20 devices on a cluster that has them). Mutations
replace one value with a hostile one (huge, negative, non-finite, wrong type, deep nesting, control
characters, shell metacharacters), truncate the text, or make it invalid UTF-8. The fast suite draws a
few examples of each (``FUZZ``, a handful where a case plans and draws); a longer campaign of the same
kind runs under the ``slow`` marker. Both draw the same examples on every run unless pytest runs with
``--hypothesis-profile=explore`` (tests/conftest.py). The surfaces added for issue 30 and the campaign are in
test_fuzz_surfaces.py, which imports this file's strategies and checks.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_helpers import run_cli, with_options
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from nestplan.catalog import entry_path

HANG_S = 60
HOSTILE_STRINGS = [
    "",
    " ",
    "x\ny",
    "\x1b[31mred",
    "a" * 5000,
    "$(touch pwned)",
    "'; rm -rf x; '",
    "[/bold]",
    "../../etc/passwd",
    "\u2028",
    "nan",
    "inf",
    "-1",
    "0",
    "1e999",
    "\ufffd",
]
HOSTILE_NUMBERS = [0, -1, -(2**63), 2**63, 2**1000, 1e308, -1e308, 0.5, 1.5, 2.0, 1e-320, True, False, None]
HOSTILE_VALUES = HOSTILE_STRINGS + HOSTILE_NUMBERS + [[], {}, [1, 2], {"a": 1}]
SMALL = [
    "--model",
    "llama3-8b",
    "--cluster",
    "dgx-a100",
    "--devices",
    "16",
    "--global-batch-size",
    "64",
    "--seq-len",
    "2048",
]
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FUZZ_SLOW = settings(FUZZ, max_examples=2000)


@contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def fail(*_):
        raise TimeoutError(f"a command ran over {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _no_constants(name: str) -> float:
    raise AssertionError(f"--json printed {name}")


def check_contract(capsys, argv: list[str]) -> tuple[int, str]:
    """Run ``nestplan argv`` and assert the contract; (exit code, stdout)."""
    with _alarm(HANG_S):
        code, out, err = run_cli(capsys, argv)
    assert code in (0, 2, 3) or (code == 1 and "--tolerance" in argv), (argv, code, err)
    if currently_in_test_context():
        event(f"exit {code}")  # --hypothesis-show-statistics shows how often each path ran
    assert "Traceback" not in err, (argv, err)
    if code in (2, 3):
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)
        assert not any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in lines[0]), (argv, err)
    if code == 0 and "--json" in argv:
        json.loads(out, parse_constant=_no_constants)
    return code, out


@contextmanager
def _inside(folder: Path) -> Iterator[None]:
    """Run with ``folder`` as the working directory (a command's relative outputs land there)."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def check_writes(capsys, argv: list[str], folder: Path, allowed: set[str]) -> tuple[int, str]:
    """:func:`check_contract` run inside ``folder`` (which holds the inputs), then: nothing in it but the
    inputs and the outputs ``allowed`` (names of ``folder``'s entries)."""
    inputs = {p.name for p in folder.iterdir()}
    with _inside(folder):
        result = check_contract(capsys, argv)
    stray = {p.name for p in folder.iterdir()} - inputs - allowed
    assert not stray, (argv, stray)
    return result


# ---------------------------------------------------------------------------
# command lines

OPTION_VALUES = st.one_of(
    st.sampled_from(
        [
            "1",
            "2",
            "8",
            "16",
            "0",
            "-3",
            "1_000",
            "+4",
            "2.0",
            "1e20",
            str(2**64),
            "99999999999999999999",
            "nan",
            "x",
            "",
            "\n",
            "\x1b[2J",
        ]
    ),
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=12),
)
EVALUATE_OPTIONS = [
    "--tp",
    "--pp",
    "--dp",
    "--cp",
    "--ep",
    "--mbs",
    "--zero",
    "--virtual-stages",
    "--devices",
    "--global-batch-size",
    "--seq-len",
    "--layers-per-stage",
    "--dtype",
    "--recompute",
    "--schedule",
    "--axis-order",
    "--model",
    "--cluster",
    "--optimizer",
]
PLAN_OPTIONS = [
    "--devices",
    "--global-batch-size",
    "--seq-len",
    "--dtype",
    "--top",
    "--model",
    "--cluster",
    "--export",
    "--optimizer",
]


def _mutated(base: list[str], options: list[str], data) -> list[str]:
    changes = data.draw(st.lists(st.tuples(st.sampled_from(options), OPTION_VALUES), min_size=1, max_size=3))
    return with_options(base, [x for pair in changes for x in pair])


@FUZZ
@given(data=st.data())
def test_evaluate_options(capsys, data) -> None:
    base = ["evaluate", *SMALL, "--tp", "2", "--pp", "2", "--dp", "4", "--json"]
    check_contract(capsys, _mutated(base, EVALUATE_OPTIONS, data))


@FUZZ
@given(data=st.data())
def test_plan_options(capsys, tmp_path_factory, data) -> None:
    folder = tmp_path_factory.mktemp("export")
    base = ["plan", *SMALL, "--top", "2", "--json", "--out", "o"]
    argv = _mutated(base, PLAN_OPTIONS, data)
    check_writes(capsys, argv, folder, {argv[argv.index("--out") + 1]})


@FUZZ
@given(
    argv=st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "plan",
                    "evaluate",
                    "export",
                    "list",
                    "sweep",
                    "nest-solve",
                    "trace",
                    "compare",
                    "--json",
                    "--help",
                    "--version",
                    "models",
                    "report",
                    "--model",
                    "--cluster",
                    "--devices",
                    "--framework",
                ]
            ),
            st.sampled_from(HOSTILE_STRINGS),
        ),
        max_size=6,
    )
)
def test_random_command_lines(capsys, argv) -> None:
    if "trace" in argv or "compare" in argv:  # those run for minutes by design on valid input
        argv = [a for a in argv if a not in ("trace", "compare")] or ["list"]
    try:
        check_contract(capsys, argv)
    except SystemExit:  # --help / --version exit 0 inside click before main's handler
        pass


# ---------------------------------------------------------------------------
# files


def _paths(doc) -> list[tuple]:
    """Every key path to a leaf or container in a JSON-like document."""
    found = [()]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += [(k, *rest) for rest in _paths(v)]
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += [(i, *rest) for rest in _paths(v)]
    return found


def _replace(doc, path: tuple, value):
    if not path:
        return value
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = _replace(doc[path[0]], path[1:], value)
    return copy


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@st.composite
def mutated_json(draw, doc) -> bytes:
    """``doc`` with one value replaced, or its text truncated, deeply nested or not UTF-8."""
    how = draw(st.sampled_from(["replace", "replace", "replace", "truncate", "deep", "bytes"]))
    text = json.dumps(doc)
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))].encode()
    if how == "deep":
        return text.replace("[", _deep(draw(st.sampled_from([100, 5000, 200000]))) + ", [", 1).encode()
    if how == "bytes":
        cut = draw(st.integers(0, len(text)))
        return text[:cut].encode() + b"\xff\xfe" + text[cut:].encode()
    path = draw(st.sampled_from(_paths(doc)))
    value = draw(st.sampled_from(HOSTILE_VALUES))
    mutated = _replace(doc, path, value)
    raw = json.dumps(mutated, allow_nan=True)
    if value == 1e308 and draw(st.booleans()):
        raw = raw.replace("1e+308", draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"])))
    return raw.encode()


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value and abs(value) != float("inf") else "nan"
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return '""'
    return json.dumps(value) if isinstance(value, list) else "{ a = 1 }"


@st.composite
def mutated_toml(draw, text: str) -> bytes:
    """A TOML file with one ``key = value`` line's value replaced, or truncated, nested or not UTF-8."""
    how = draw(st.sampled_from(["replace", "replace", "replace", "truncate", "deep", "bytes"]))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))].encode()
    if how == "deep":
        return (text + "\nzz = " + _deep(draw(st.sampled_from([100, 5000, 200000]))) + "\n").encode()
    if how == "bytes":
        cut = draw(st.integers(0, len(text)))
        return text[:cut].encode() + b"\xc3\x28" + text[cut:].encode()
    i = draw(st.sampled_from(_assignments(text)))
    return _replace_line(text, i, draw(st.sampled_from(HOSTILE_VALUES))).encode()


def _assignments(text: str) -> list[int]:
    """The numbers of ``text``'s ``key = value`` lines."""
    return [i for i, line in enumerate(text.splitlines()) if "=" in line and not line.lstrip().startswith("#")]


def _replace_line(text: str, i: int, value) -> str:
    """``text`` with line ``i``'s value replaced by ``value`` written as TOML."""
    lines = text.splitlines()
    key = lines[i].split("=", 1)[0]
    lines[i] = f"{key}= {_toml_value(value)}"
    return "\n".join(lines)


CONFIG = json.loads(entry_path("model", "llama3-8b").read_text())
CLUSTER_TOML = """name = "fuzz-cluster"
accelerator = "a100-80gb"
[[levels]]
name = "node"
size = 8
bandwidth_GBps = 300
latency_us = 1
[[levels]]
name = "fabric"
size = 4
bandwidth_GBps = 25
latency_us = 5
oversubscription = 1.0
"""
SWEEP_TOML = """name = "fuzz"
models = ["llama3-8b"]
devices = [8]
global_batch_size = [16]
seq_len = [1024]
keep = ["memory"]
[[clusters]]
base = "dgx-a100"
label = "a100"
[clusters.set]
"fabric.oversubscription" = 1
"""


@FUZZ
@given(raw=mutated_json(CONFIG))
def test_model_config_files(capsys, tmp_path_factory, raw) -> None:
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_bytes(raw)
    check_contract(capsys, ["evaluate", *SMALL[2:], "--model", str(path), "--tp", "8", "--dp", "2", "--json"])


@FUZZ
@given(raw=mutated_toml(CLUSTER_TOML))
def test_cluster_files(capsys, tmp_path_factory, raw) -> None:
    cluster_case(capsys, tmp_path_factory.mktemp("cluster"), raw)


def cluster_case(capsys, folder: Path, raw: bytes) -> None:
    """Evaluate a plan on the cluster file ``raw``."""
    (folder / "cluster.toml").write_bytes(raw)
    argv = ["evaluate", "--model", "llama3-8b", "--cluster", "cluster.toml", "--devices", "16", "--tp", "8"]
    check_writes(
        capsys, argv + ["--dp", "2", "--global-batch-size", "64", "--seq-len", "2048", "--json"], folder, set()
    )


def saved_plan() -> dict:
    """A small plan's JSON, as ``plan --json`` prints it (the seed of the export mutations)."""
    from nestplan import api

    spec = api.resolve_model("llama3-8b")
    cluster = api.resolve_cluster("dgx-a100", 16)
    return api.plan(spec, cluster, api.make_job(spec, 64, 2048), top=0).to_dict()


@pytest.fixture(scope="module")
def plan_json() -> dict:
    return saved_plan()


@FUZZ
@given(data=st.data())
def test_plan_files_for_export(capsys, tmp_path_factory, plan_json, data) -> None:
    folder = tmp_path_factory.mktemp("plan")
    (folder / "plan.json").write_bytes(data.draw(mutated_json(plan_json)))
    framework = data.draw(st.sampled_from(["megatron", "torchtitan", "deepspeed", "nemo"]))
    check_writes(capsys, ["export", "plan.json", "--framework", framework, "--out", "o"], folder, {"o"})


@FUZZ
@given(raw=mutated_toml(SWEEP_TOML))
def test_sweep_specs(capsys, tmp_path_factory, raw) -> None:
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "spec.toml").write_bytes(raw)
    check_writes(capsys, ["sweep", "spec.toml", "--out", "out", "--workers", "1"], folder, {"out"})


NEST_CASE = Path(__file__).resolve().parents[3] / "shared/reference/nest-artifact-cases/tpuv4_fatTree_gpt3_64_mbs1_seq"


@pytest.mark.skipif(not NEST_CASE.is_dir(), reason="the NEST authors' cases live in ../shared/reference (absent)")
@FUZZ
@given(data=st.data())
def test_nest_solver_inputs(capsys, tmp_path_factory, data) -> None:
    doc = json.loads((NEST_CASE / "dp_input.json").read_text())
    folder = tmp_path_factory.mktemp("nest")
    (folder / "in.json").write_bytes(data.draw(mutated_json(doc)))
    check_contract(capsys, ["nest-solve", str(folder / "in.json"), str(folder / "out.json")])
