"""Catalog and names (issue 27, item 5): Llama 3.1 8B and 70B as Hugging Face publishes them, and "did
you mean" on an unknown model, cluster, accelerator or framework name."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from nestplan import api
from nestplan.catalog import entry_path
from nestplan.errors import UnknownNameError
from nestplan.export import check_framework
from nestplan.hardware.accelerator import load_accelerator
from nestplan.model.layers import total_params


@pytest.mark.parametrize(
    "name,layers,hidden,params_b", [("llama3.1-8b", 32, 4096, 8.03), ("llama3.1-70b", 80, 8192, 70.55)]
)
def test_llama31_as_published(name, layers, hidden, params_b) -> None:
    """meta-llama/Llama-3.1-8B and -70B config.json: the Llama 3 shapes with 131072 positions, rope theta
    500000 and llama3 rope scaling (factor 8 from 8192); 8.03 B and 70.55 B parameters (the model cards)."""
    config = json.loads(entry_path("model", name).read_text())
    assert config["rope_theta"] == 500000.0 and config["vocab_size"] == 128256
    assert config["max_position_embeddings"] == 131072
    assert config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    spec = api.resolve_model(name)
    assert (spec.num_layers, spec.hidden_size) == (layers, hidden)
    assert total_params(spec) / 1e9 == pytest.approx(params_b, abs=0.01)
    assert total_params(spec) == total_params(api.resolve_model(name.replace("3.1", "3")))


@pytest.mark.parametrize(
    "lookup,typed,meant",
    [
        (lambda n: api.resolve_model(n), "llama3.1-70", "'llama3.1-70b'"),
        (lambda n: api.resolve_cluster(n), "dgx-h10", "'dgx-h100'"),
        (lambda n: load_accelerator(n), "h100-sxm", "'h100-sxm-80gb'"),
        (lambda n: check_framework(n), "megatorn", "'megatron'"),
    ],
)
def test_did_you_mean(lookup, typed, meant) -> None:
    with pytest.raises(UnknownNameError) as caught:
        lookup(typed)
    assert f"(did you mean {meant}" in str(caught.value) and "\n" not in str(caught.value)


def test_no_suggestion_when_nothing_is_close(capsys) -> None:
    code, _, err = run_cli(capsys, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--export", "jax"])
    assert code == 2 and "unknown framework 'jax'; valid frameworks:" in err and "did you mean" not in err


# -- "did you mean" for --framework and every other choice of the field table (settings.Setting.check) ----
@pytest.mark.parametrize("typed,meant", [("megatrn", "'megatron'"), ("Nemo", "'nemo'"), ("torchtitn", "'torchtitan'")])
def test_an_unknown_framework_option_names_the_closest(capsys, typed, meant) -> None:
    code, out, err = run_cli(capsys, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--framework", typed])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"framework '{typed}' is not one of megatron, nemo, torchtitan, deepspeed, fsdp" in err
    assert f"(did you mean {meant}?)" in err and "Invalid value" not in err


def test_every_choice_option_parses_with_the_field_table(capsys) -> None:
    """--cp-comm-type and --grad-reduce-dtype as --framework: the table's check, its suggestion, exit 2."""
    argv = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--dp", "8"]
    argv += ["--global-batch-size", "64"]
    code, _, err = run_cli(capsys, [*argv, "--cp-comm-type", "all-gather"])
    assert code == 2 and "cp comm type 'all-gather' is not one of" in err and "(did you mean 'allgather'?)" in err
    code, _, err = run_cli(capsys, [*argv, "--grad-reduce-dtype", "bf61"])
    assert code == 2 and "(did you mean 'bf16'?)" in err
    code, out, err = run_cli(capsys, [*argv, "--framework", "nemo", "--json"])
    assert code == 0 and json.loads(out)["job"]["framework"] == "nemo"


def test_an_unknown_framework_in_a_job_file_names_the_closest(capsys, tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('model = "llama3-8b"\ncluster = "dgx-h100"\n[settings]\nframework = "deepspeeed"\n')
    code, _, err = run_cli(capsys, ["plan", "--job", str(job)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "(did you mean 'deepspeed'?)" in err


def test_an_unknown_framework_in_a_runs_file_is_that_rows_problem(tmp_path) -> None:
    from test_validate import GOOD, _write

    from nestplan.validate import validate

    results = {r.id: r for r in validate(_write(tmp_path, [GOOD, GOOD | {"id": "typo", "framework": "Megatron-LM"}]))}
    assert results["good"].run is not None
    assert "(did you mean 'megatron'?)" in results["typo"].problem


def test_no_suggestion_for_a_choice_nothing_is_close_to() -> None:
    from nestplan.errors import ConfigError
    from nestplan.settings import RunSettings

    with pytest.raises(ConfigError) as caught:
        RunSettings.from_mapping({"framework": "jax"})
    assert "framework 'jax' is not one of" in str(caught.value) and "did you mean" not in str(caught.value)
