"""The fuzzer's second part (test_fuzz_contract.py states the contract it checks): the input surfaces
added since its first campaign (issue 30): config files with hostile names through --plot and --report,
``validate`` runs files (hostile ids, values at and past the bounds), sweep-spec mutations that reach
their own key's check, large valid values; and the slow campaign that draws every kind at random."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_contract import (
    CLUSTER_TOML,
    CONFIG,
    EVALUATE_OPTIONS,
    FUZZ,
    FUZZ_SLOW,
    HOSTILE_STRINGS,
    HOSTILE_VALUES,
    PLAN_OPTIONS,
    SMALL,
    SWEEP_TOML,
    _assignments,
    _mutated,
    _replace_line,
    check_contract,
    check_writes,
    cluster_case,
    mutated_json,
    mutated_toml,
    saved_plan,
)


def test_sweep_mutations_get_past_the_readers_first_checks() -> None:
    """The seed is a spec the reader accepts, so that a mutation reaches the check of the value it
    changed: every one-value replacement is accepted or refused in a line naming its own key (none
    dies on an unknown key or another line's value), and a share of them is accepted outright."""
    from nestplan.errors import ConfigError
    from nestplan.sweep.spec import spec_from_dict

    def read(text: str):
        import tomllib

        return spec_from_dict(tomllib.loads(text))

    read(SWEEP_TOML)
    accepted = own_key = total = 0
    for i in _assignments(SWEEP_TOML):
        key = SWEEP_TOML.splitlines()[i].split("=", 1)[0].strip().strip('"')
        for value in HOSTILE_VALUES:
            total += 1
            try:
                read(_replace_line(SWEEP_TOML, i, value))
                accepted += 1
            except ConfigError as err:
                own_key += key.split(".")[-1] in str(err) or key in str(err)
    assert own_key + accepted == total, (own_key, accepted, total)
    assert accepted >= total // 10, (accepted, total)


HOSTILE_NAMES = [
    "a$\\foo$b",  # matplotlib mathtext
    "$x^2$",
    "\u202eevil\u202c",  # right-to-left override
    "zero\u200bwidth\u2060joiner",
    "=cmd|' -C calc'!A0",  # spreadsheet formulas
    "+1+1",
    "-2",
    "@SUM(A1)",
    "<img src=x onerror=alert(1)>",
    "x" * 240,  # near the file system's 255 bytes
    "\u00e9\u4e2d\U0001f600",
    "bad\udcff\udcfe",  # bytes 0xff 0xfe, not UTF-8, as Python names them (PEP 383)
]
TINY = CONFIG | {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8}
TINY |= {"intermediate_size": 1024, "vocab_size": 1024}
assert not any("/" in name or "\x00" in name for name in HOSTILE_NAMES), "a file name, not a path"
FILE_NAMES = st.one_of(
    st.sampled_from(HOSTILE_NAMES),
    # no other lone surrogates: no file name decodes to one (PEP 383), and none can be written
    st.text(st.characters(exclude_characters="/\x00", exclude_categories=["Cs"]), min_size=1, max_size=60).filter(
        lambda t: t not in (".", "..")
    ),
)


@settings(FUZZ, max_examples=5)  # each plans and draws: a few seconds; the slow campaign draws more
@given(name=FILE_NAMES, command=st.sampled_from(["plan", "evaluate"]))
def test_hostile_model_names_through_plots_and_reports(capsys, tmp_path_factory, name, command) -> None:
    """A config.json whose file name is hostile, planned or evaluated with --plot, --report and --json."""
    _hostile_name_case(capsys, tmp_path_factory.mktemp("names"), name, command)


def _hostile_name_case(capsys, folder: Path, name: str, command: str) -> None:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(TINY))
    argv = [command, "--model", path.name, "--cluster", "dgx-a100", "--devices", "8", "--global-batch-size", "16"]
    argv += ["--seq-len", "1024", "--plot", "p", "--report", "r.html", "--json"]
    argv += ["--top", "1"] if command == "plan" else ["--tp", "2", "--dp", "4"]
    check_writes(capsys, argv, folder, {"p", "r.html"})


def _row(**changed) -> dict:
    """A runs file's row (docs/formats.md, validate) of a 4-layer model on 8 GPUs, with ``changed``."""
    row = {"id": "seed", "model_name": "tiny", "model_config": TINY, "cluster": "dgx-h100", "gpus": 8, "tp": 2}
    row |= {"pp": 1, "vp": 1, "cp": 1, "ep": 1, "dp": 4, "sp": True, "recompute": "none", "mbs": 1}
    row |= {"global_batch": 32, "seq_len": 1024, "precision": "bf16", "axis_order": "tp,cp,ep,dp,pp"}
    return row | {"published": {"metric": "step_time_s", "value": 1.0}} | changed


BOUND_VALUES = [2**20, 2**20 + 1, 4096, 4097, 5e-324, 1e-300, 1e300, 2**53, 2**53 + 1]
RUNS = {"rows": [_row(), _row(id="second", tp=1, dp=8)]}


@st.composite
def mutated_runs(draw) -> bytes:
    """A runs file with a hostile id, a value at or past a bound, or a mutation of any kind."""
    how = draw(st.sampled_from(["id", "bound", "any"]))
    if how == "any":
        return draw(mutated_json(RUNS))
    row = dict(RUNS["rows"][0])
    if how == "id":
        row["id"] = draw(st.sampled_from(HOSTILE_NAMES + HOSTILE_STRINGS))
    else:
        key = draw(st.sampled_from(["gpus", "dp", "mbs", "global_batch", "seq_len", "published"]))
        value = draw(st.sampled_from(BOUND_VALUES))
        row[key] = {"metric": "step_time_s", "value": value} if key == "published" else value
    return json.dumps({"rows": [row, RUNS["rows"][1]]}).encode()


@settings(FUZZ, max_examples=10)
@given(raw=mutated_runs(), tolerance=st.booleans())
def test_validate_runs_files(capsys, tmp_path_factory, raw, tolerance) -> None:
    _validate_case(capsys, tmp_path_factory.mktemp("runs"), raw, tolerance)


def _validate_case(capsys, folder: Path, raw: bytes, tolerance: bool) -> None:
    (folder / "runs.json").write_bytes(raw)
    argv = ["validate", "runs.json", "--json", "--no-cross-validate"] + (["--tolerance", "0.5"] if tolerance else [])
    check_writes(capsys, argv, folder, set())


BIG_CLUSTER = CLUSTER_TOML.replace("size = 4\n", "size = 131072\n")  # 2^20 devices
EVALUATE_BIG = ["evaluate", "--model", "llama3-8b", "--json", "--tp", "8"]
LARGE_VALID = [
    ["--cluster", "big.toml", "--devices", str(2**20), "--dp", str(2**17), "--global-batch-size", str(2**24)],
    ["--cluster", "dgx-h100", "--devices", "16", "--pp", "2", "--global-batch-size", str(2**24), "--schedule", "zb-h1"],
    ["--cluster", "dgx-h100", "--devices", "16", "--cp", "2", "--global-batch-size", "64", "--seq-len", str(2**21)],
]


@pytest.mark.parametrize("options", LARGE_VALID, ids=["devices-2^20", "batch-2^24-zb-h1", "seq-2^21"])
def test_large_valid_values(capsys, tmp_path, options) -> None:
    (tmp_path / "big.toml").write_text(BIG_CLUSTER)
    code, out = check_writes(capsys, EVALUATE_BIG + ["--seq-len", "2048"] + options, tmp_path, set())
    assert code == 0 and json.loads(out)["prediction"]["step_time_s"] > 0


@pytest.mark.slow
def test_plan_on_two_to_the_twenty_devices(capsys, tmp_path) -> None:
    (tmp_path / "big.toml").write_text(BIG_CLUSTER)
    argv = ["plan", "--model", "llama3-8b", "--cluster", "big.toml", "--devices", str(2**20), "--top", "1"]
    code, out = check_writes(capsys, argv + ["--global-batch-size", str(2**24), "--json"], tmp_path, set())
    assert code == 0 and json.loads(out)["prediction"]["step_time_s"] > 0


@pytest.fixture(scope="module")
def plan_json() -> dict:
    return saved_plan()


@pytest.mark.slow
@FUZZ_SLOW
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_campaign(capsys, tmp_path_factory, plan_json, data, seed) -> None:
    """The longer campaign: every kind of both files, drawn at random."""
    kinds = ["evaluate", "plan", "config", "cluster", "export", "names", "validate", "sweep"]
    kind = random.Random(seed).choice(kinds)
    if kind == "names":
        command = data.draw(st.sampled_from(["plan", "evaluate"]))
        _hostile_name_case(capsys, tmp_path_factory.mktemp("names"), data.draw(FILE_NAMES), command)
    elif kind == "validate":
        _validate_case(capsys, tmp_path_factory.mktemp("runs"), data.draw(mutated_runs()), data.draw(st.booleans()))
    elif kind == "sweep":
        folder = tmp_path_factory.mktemp("sweep")
        (folder / "spec.toml").write_bytes(data.draw(mutated_toml(SWEEP_TOML)))
        check_writes(capsys, ["sweep", "spec.toml", "--out", "out", "--workers", "1"], folder, {"out"})
    elif kind == "evaluate":
        check_contract(
            capsys,
            _mutated(["evaluate", *SMALL, "--tp", "2", "--pp", "2", "--dp", "4", "--json"], EVALUATE_OPTIONS, data),
        )
    elif kind == "plan":
        check_contract(capsys, _mutated(["plan", *SMALL, "--top", "2", "--json"], PLAN_OPTIONS, data))
    elif kind == "config":
        path = tmp_path_factory.mktemp("model") / "config.json"
        path.write_bytes(data.draw(mutated_json(CONFIG)))
        check_contract(capsys, ["evaluate", *SMALL[2:], "--model", str(path), "--tp", "8", "--dp", "2", "--json"])
    elif kind == "cluster":
        cluster_case(capsys, tmp_path_factory.mktemp("cluster"), data.draw(mutated_toml(CLUSTER_TOML)))
    else:
        folder = tmp_path_factory.mktemp("plan")
        (folder / "plan.json").write_bytes(data.draw(mutated_json(plan_json)))
        check_contract(
            capsys, ["export", str(folder / "plan.json"), "--framework", "megatron", "--out", str(folder / "o")]
        )
