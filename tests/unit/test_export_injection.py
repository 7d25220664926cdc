"""Nothing from input runs when a generated launch script runs.

Hostile names reach the exporters five ways: a model's config.json (``_name_or_path`` or
``name``), a cluster file (its ``name`` or a level's), a saved plan JSON (``model``, ``cluster``,
``job.dtype``, the axis order), the model config and cluster definition a saved plan embeds, and
objects built in Python that no reader checked. Each either is refused with a one-line ConfigError
or is exported; every shell script written is then run with bash in a sandbox (stub launchers, a
temporary HOME and working folder) and must neither touch the canary file nor fail.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.catalog import entry_path
from nestplan.cluster import Cluster
from nestplan.errors import ConfigError, printable
from nestplan.export import FRAMEWORKS, export
from nestplan.export.common import comment_text, shell_word
from nestplan.export.plan import ExportInput
from nestplan.inputs import has_control
from nestplan.job import Job
from nestplan.network.topology import Level, Topology
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims

HOSTILE = [
    "x\ntouch $CANARY\n#",
    "$(touch $CANARY)",
    "`touch $CANARY`",
    "'; touch $CANARY; '",
    "a\r\ntouch $CANARY #\u2028",
]
STUBS = ("torchrun", "srun", "python", "python3", "deepspeed", "sbatch", "scontrol", "hostname")
LAUNCHERS = {
    "megatron": "torchrun",
    "torchtitan": "torchrun",
    "nemo": "torchrun",
    "megatron-bridge": "torchrun",
    "deepspeed": "deepspeed",
}
DIMS = ParallelDims(tp=2, pp=4, dp=2, layers_per_stage=(7, 9, 8, 8))  # uneven middle: Megatron's layout
DEVICES = 16
JOB = Job(global_batch_size=64, seq_len=2048)


def _sandbox_run(script: Path, tmp: Path, extra_env: dict[str, str] | None = None) -> tuple[Path, list[str]]:
    """Run ``script`` with bash: a fresh folder as working folder and HOME, PATH = stub launchers
    (each logs its name and exits 0) + /usr/bin:/bin, CANARY = a path the script must not create.
    Returns the canary path and the stubs called; a failing script fails the test."""
    box = tmp / f"box-{script.parent.name}-{script.stem}"
    bin_dir, home = box / "bin", box / "home"
    bin_dir.mkdir(parents=True)
    home.mkdir()
    log = box / "calls.log"
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho {name} >> "$STUB_LOG"\nexit 0\n')
        stub.chmod(0o755)
    canary = box / "canary"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(home),
        "CANARY": str(canary),
        "STUB_LOG": str(log),
        **(extra_env or {}),
    }
    done = subprocess.run(
        ["bash", str(script)], cwd=home, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, f"{script.name} failed: {done.stderr}"
    return canary, log.read_text().split() if log.exists() else []


def _check_scripts(paths: list[Path], framework: str, tmp: Path) -> None:
    """Every written shell script runs to its launcher without touching the canary, with and without
    a SLURM node list (the branch that asks scontrol for the master address)."""
    scripts = [p for p in paths if p.suffix == ".sh"]
    assert scripts, paths
    for script in scripts:
        for env in ({}, {"SLURM_JOB_NODELIST": "node[1-2]"}):
            canary, calls = _sandbox_run(script, tmp / ("slurm" if env else "plain"), env)
            assert not canary.exists(), f"{script.name} ran injected text"
            assert LAUNCHERS[framework] in calls, (script.name, calls)
    for p in paths:
        if p.suffix == ".json":
            json.loads(p.read_text())


def _check_refusal(err: ConfigError) -> None:
    assert "\n" not in str(err) and err.exit_code == 2, str(err)


def _export_and_run(build: Callable[[], Plan], tmp: Path) -> None:
    """``build()`` gives a plan (or refuses its input); every framework then exports it (or refuses
    it) and every script written runs inert."""
    try:
        plan = build()
    except ConfigError as err:
        _check_refusal(err)
        return
    for framework in FRAMEWORKS:
        try:
            paths, _ = api.export_plan(plan, framework, tmp / framework)
        except ConfigError as err:
            _check_refusal(err)
            continue
        _check_scripts(paths, framework, tmp / framework)


def _clean_plan(model="llama2-7b", cluster="h100-spine-leaf") -> Plan:
    return api.evaluate_full(model, cluster, DIMS, JOB, devices=DEVICES).plan


def _saved(plan: Plan) -> dict:
    """The plan as a saved file holds it (JSON text and back)."""
    return json.loads(json.dumps(plan.to_dict()))


@pytest.fixture(scope="module")
def plan() -> Plan:
    return _clean_plan()


def test_the_sandbox_sees_an_injection(tmp_path) -> None:
    """The harness itself: a script that does run a hostile line touches the canary."""
    script = tmp_path / "evil" / "launch.sh"
    script.parent.mkdir()
    script.write_text(f"#!/usr/bin/env bash\n# plan: {HOSTILE[0]}\ntorchrun\n")
    canary, calls = _sandbox_run(script, tmp_path)
    assert canary.exists() and calls == ["torchrun"]


@pytest.mark.parametrize("text", HOSTILE)
def test_helpers_keep_text_inert(text, tmp_path) -> None:
    """A comment line stays one line; a shell word is read back literally."""
    assert "\n" not in comment_text(text) and "\r" not in comment_text(text)
    script = tmp_path / "echo.sh"
    script.write_text(f"# {comment_text(text)}\nprintf %s {shell_word(text)}\n")
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": "/usr/bin:/bin", "CANARY": str(tmp_path / "c")},
        capture_output=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.decode() == text and not (tmp_path / "c").exists()


@pytest.mark.parametrize("key", ["_name_or_path", "name"])
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_model_config(key, text, tmp_path) -> None:
    config = json.loads(entry_path("model", "llama2-7b").read_text())
    config[key] = text
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))

    def build() -> Plan:  # the plan itself, then the plan read back from its JSON (the model config embedded)
        spec = api.resolve_model(str(path))
        fresh = api.evaluate_full(spec, "h100-spine-leaf", DIMS, JOB, devices=DEVICES).plan
        read = Plan.from_dict(_saved(fresh))
        assert read == fresh and read.model.name == text
        return read

    _export_and_run(build, tmp_path)


def _cluster_file(tmp: Path, name: str, leaf: str) -> Path:
    """16 H100s: nodes of 4, two nodes to a leaf (so the header names the leaf), two leaves."""
    levels = [
        {"name": "node", "size": 4, "bandwidth_GBps": 450, "latency_us": 1},
        {"name": leaf, "size": 2, "bandwidth_GBps": 50, "latency_us": 3},
        {"name": "spine", "size": 2, "bandwidth_GBps": 25, "latency_us": 5},
    ]
    path = tmp / "cluster.json"
    path.write_text(json.dumps({"name": name, "accelerator": "h100-sxm-80gb", "levels": levels}))
    return path


@pytest.mark.parametrize("where", ["name", "level"])
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_cluster_file(where, text, tmp_path) -> None:
    path = _cluster_file(tmp_path, text if where == "name" else "c", text if where == "level" else "leaf")

    def build() -> Plan:  # the plan itself, then the plan read back from its JSON (the cluster definition embedded)
        fresh = _clean_plan(cluster=api.resolve_cluster(str(path), DEVICES))
        read = Plan.from_dict(_saved(fresh))
        assert read == fresh
        return read

    _export_and_run(build, tmp_path)


def _set(plan: Plan, field: str, value) -> dict:
    changed = _saved(plan)
    if field == "placement.axis_order":
        changed["placement"]["axis_order"][-1] = value
    elif field.startswith("job."):
        changed["job"][field.removeprefix("job.")] = value
    else:
        changed[field] = value
    return changed


CHOICES = ("job.dtype", "job.grad_dtype", "job.optimizer", "placement.axis_order")  # fields with allowed values


@pytest.mark.parametrize("field", ["model", "cluster", *CHOICES])
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_plan_file(field, text, plan, capsys, tmp_path) -> None:
    """``nestplan export plan.json`` with the model and cluster given, so that the plan's own names
    only label the plan: a dtype or axis not allowed, or a name with a control character, is
    refused with one line naming the field and nothing written; other names are exported, inert."""
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(_set(plan, field, text)))
    refused = field in CHOICES or has_control(text)
    for framework in FRAMEWORKS:
        out = tmp_path / framework
        code, _, err = run_cli(
            capsys,
            [
                "export",
                str(saved),
                "--framework",
                framework,
                "--out",
                str(out),
                "--model",
                "llama2-7b",
                "--cluster",
                "h100-spine-leaf",
            ],
        )
        if refused:
            assert code == 2 and len(err.strip().splitlines()) == 1 and field in err, err
            assert not out.exists()
        else:
            assert code == 0, err
            _check_scripts(sorted(out.iterdir()), framework, out)


def _embed(field: str, text: str) -> Callable[[dict], None]:
    """A change of a saved plan's embedded model config or cluster definition (the ``model`` label
    is the name its model config is read under; the cluster's name is also the ``cluster`` label)."""

    def change(data: dict) -> None:
        definition = data["cluster_definition"]
        if field == "model":
            data["model"] = text
        elif field.startswith("model_config."):
            data["model_config"][field.removeprefix("model_config.")] = text
        elif field == "cluster_definition.name":
            definition["name"] = data["cluster"] = text
        elif field == "cluster_definition.levels[1].name":
            definition["levels"][1]["name"] = text
        else:
            definition["accelerator"][field.removeprefix("cluster_definition.accelerator.")] = text

    return change


EMBEDDED = (
    "model",
    "model_config._name_or_path",
    "model_config.model_type",
    "cluster_definition.name",
    "cluster_definition.levels[1].name",
    "cluster_definition.accelerator.name",
    "cluster_definition.accelerator.source",
)


@pytest.fixture(scope="module")
def plan_on_file_cluster(tmp_path_factory) -> Plan:
    """The clean plan on a cluster file of nodes of 4 (so that the header names the leaf level)."""
    path = _cluster_file(tmp_path_factory.mktemp("cluster"), "c", "leaf")
    return _clean_plan(cluster=api.resolve_cluster(str(path), DEVICES))


@pytest.mark.parametrize("field", EMBEDDED)
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_embedded_definitions(field, text, plan_on_file_cluster, capsys, tmp_path) -> None:
    """``nestplan export plan.json`` with nothing else given reads the model config and the cluster
    definition the plan embeds: a control character anywhere, or a model family that does not exist,
    is refused with one line and nothing written; other text is exported, inert. The same plan
    handed to the reader in Python (no file reader) is refused by the model and cluster readers'
    own checks or exported, inert."""
    data = _saved(plan_on_file_cluster)
    _embed(field, text)(data)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(data))
    refused = has_control(text) or field == "model_config.model_type"
    for framework in FRAMEWORKS:
        out = tmp_path / "cli" / framework
        code, _, err = run_cli(capsys, ["export", str(saved), "--framework", framework, "--out", str(out)])
        if refused:
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert not out.exists()
        else:
            assert code == 0, err
            _check_scripts(sorted(out.iterdir()), framework, out)
    _export_and_run(lambda: Plan.from_dict(data), tmp_path / "api")


def _hostile_network(plan: Plan, text: str) -> Cluster:
    """The plan's cluster renamed ``text``, on nodes (and hosts) of 4 whose middle level is named ``text``."""
    levels = (Level("node", 4, 450e9, 1e-6), Level(text, 2, 50e9, 3e-6), Level("spine", 2, 25e9, 5e-6))
    return dataclasses.replace(plan.cluster, name=text, topology=Topology(text, levels), gpus_per_host=4)


@pytest.mark.parametrize("text", HOSTILE)
def test_exporters_quote_on_their_own(text, plan, tmp_path) -> None:
    """Defence in depth: hostile names in objects no reader checked (the plan's model and cluster,
    the network's level names, the nestplan version) are exported, shown escaped, and inert."""
    hostile = dataclasses.replace(
        plan, model=dataclasses.replace(plan.model, name=text), cluster=_hostile_network(plan, text)
    )
    inp = ExportInput(hostile, text)
    for framework in FRAMEWORKS:
        result = export(framework, inp)
        paths = result.write(tmp_path / framework)
        launcher = next(p for p in paths if p.suffix == ".sh").read_text()
        assert f"# plan: {printable(text)} on {printable(text)}," in launcher
        assert f"share a {printable(text)}" in launcher
        _check_scripts(paths, framework, tmp_path / framework)


@pytest.mark.parametrize("field", ["dtype", "grad_dtype"])
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_job_setting_in_settings_is_refused_or_inert(field, text, plan, tmp_path) -> None:
    """A job setting no check saw (set past ``Job``'s own; its optimizer is an ``Optimizer`` by type):
    each exporter refuses it with one line or writes it inert."""
    job = dataclasses.replace(plan.job)
    object.__setattr__(job, field, text)
    inp = ExportInput(dataclasses.replace(plan, job=job), version="test")
    for framework in FRAMEWORKS:
        try:
            paths = export(framework, inp).write(tmp_path / framework)
        except ConfigError as err:
            _check_refusal(err)
            continue
        _check_scripts(paths, framework, tmp_path / framework)


@pytest.mark.parametrize(
    "dims, layout",
    [
        (DIMS, "Et*7|t*9|t*8|t*8L"),
        (
            dataclasses.replace(
                DIMS, schedule="interleaved", virtual_stages=2, layers_per_stage=(0, 5, 4, 3, 4, 4, 4, 8)
            ),
            "E|t*5|t*4|t*3|(t*4|)*3t*8L",
        ),
    ],
)
def test_megatron_layout_survives_the_shell(dims, layout, tmp_path) -> None:
    """The pipeline layout ('Et*7|t*9|t*8|t*8L'; per virtual stage with Megatron's (...)*n
    repetition) reaches Megatron-LM and NeMo as one argument."""
    plan = api.evaluate_full("llama2-7b", "h100-spine-leaf", dims, JOB, devices=DEVICES).plan
    for framework in ("megatron", "nemo"):
        paths, _ = api.export_plan(plan, framework, tmp_path / framework)
        script = next(p for p in paths if p.suffix == ".sh")
        stub = tmp_path / framework / "args.sh"
        stub.write_text('printf "%s\\n" "$@" > "$HOME/args"\n')
        text = script.read_text().replace('"${TORCHRUN[@]}"', f"bash {shell_word(stub)}")
        script.write_text(text)
        _sandbox_run(script, tmp_path / framework)
        home = tmp_path / framework / f"box-{framework}-{script.stem}" / "home"
        args = (home / "args").read_text().splitlines()
        assert (
            layout in args if framework == "megatron" else f'model.pipeline_model_parallel_layout="{layout}"' in args
        ), args
