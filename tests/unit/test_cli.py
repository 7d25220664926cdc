"""The CLI: JSON contract, readable output, one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli, with_options

EXAMPLE = [
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


NULLABLE = {
    "fp8_recipe",
    "moe_capacity_factor",
    "attention_kernel",
}  # null: no FP8, dropless experts, the framework's kernel (docs/formats.md, the plan's job)


def _filled(value) -> bool:
    if isinstance(value, dict):
        return all(_filled(v) for k, v in value.items() if k not in NULLABLE)
    if isinstance(value, list):
        return all(_filled(v) for v in value)
    return value is not None


def test_evaluate_json_has_every_field(capsys) -> None:
    code, out, err = run_cli(capsys, EXAMPLE + ["--json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "nestplan.plan/2"
    for key in (
        "model",
        "cluster",
        "devices_total",
        "devices_used",
        "job",
        "parallel",
        "stages",
        "placement",
        "prediction",
        "search",
        "model_config",
        "model_calibration",
        "cluster_definition",
    ):
        assert key in data
    for key in (
        "step_time_s",
        "breakdown_s",
        "tokens_per_s",
        "model_tflops_per_device",
        "hardware_tflops_per_device",
        "mfu",
        "peak_memory_bytes_per_device",
        "memory_breakdown_bytes",
    ):
        assert key in data["prediction"]
    assert _filled(data)
    assert data["parallel"]["num_microbatches"] == 64 and len(data["stages"]) == 8
    assert data["placement"]["levels_spanned"]["tp"] == 0


def test_evaluate_readable(capsys) -> None:
    code, out, _ = run_cli(capsys, EXAMPLE)
    assert code == 0 and "step time" in out and "stages" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model", "gpt5"], "unknown model 'gpt5' (did you mean 'gpt3-35b'"),
        (["--cluster", "nowhere"], "unknown cluster 'nowhere'; valid clusters:"),
        (["--tp", "7"], "tp 7 does not divide the model's 96 attention heads"),
        (["--dp", "2"], "= 128, not the 64 devices"),
        (["--mbs", "2", "--global-batch-size", "63"], "global batch size 63 is not divisible by dp x ep x micro-batch"),
        (["--recompute", "sometimes"], "sometimes"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, argv, needle) -> None:
    code, out, err = run_cli(capsys, with_options(EXAMPLE, argv))
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and out == ""


def test_unsupported_family_config(capsys, tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    args = list(EXAMPLE)
    args[args.index("--model") + 1] = str(path)
    code, _, err = run_cli(capsys, args)
    assert code == 2 and "supported families" in err and "llama" in err


def test_missing_field_config(capsys, tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "intermediate_size": 11008,
                "vocab_size": 32000,
            }
        )
    )
    args = list(EXAMPLE)
    args[args.index("--model") + 1] = str(path)
    code, _, err = run_cli(capsys, args)
    assert code == 2 and "num_attention_heads" in err


def test_list(capsys) -> None:
    code, out, _ = run_cli(capsys, ["list", "models"])
    assert code == 0 and "gpt3-175b" in out.split()
    code, out, _ = run_cli(capsys, ["list", "clusters"])
    assert "dgx-a100" in out.split()
