"""Tracing (extra [trace]): per-block FLOPs and saved-activation bytes measured from the Hugging
Face model under fake tensors agree with the closed-form formulas of model/layers.py."""

from __future__ import annotations

import json
import sys

import pytest

from nestplan import api
from nestplan.catalog import entry_path
from nestplan.errors import ConfigError
from nestplan.model.layers import Shard, block_activation_bytes, block_model_flops
from nestplan.model.trace import trace_config
from nestplan.strategy.enums import Recompute

NO_EXTRA = "needs the [trace] extra (torch and transformers): pip install -e '.[trace]'"


@pytest.fixture
def trace_extra() -> None:
    """Skips the test where the optional [trace] extra is not installed (CI installs it)."""
    pytest.importorskip("torch", reason=NO_EXTRA)
    pytest.importorskip("transformers", reason=NO_EXTRA)


def test_without_torch_trace_is_one_line_and_exit_2(capsys, monkeypatch) -> None:
    """Without the extra, `nestplan trace` names what to install instead of a traceback."""
    from cli_helpers import run_cli

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    code, out, err = run_cli(capsys, ["trace", "--model", "llama2-7b", "--seq-len", "64"])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "nestplan[trace]" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "name,seq",
    [
        pytest.param("llama3-70b", 1024, marks=pytest.mark.slow),
        ("mixtral-8x7b", 1024),
        ("gpt3-175b", 1024),
        ("bert-large", 512),
    ],
)
def test_trace_agrees_with_the_closed_forms(name, seq, trace_extra) -> None:
    """FLOPs within 2%, saved bytes within 10% (Llama, Mixtral with top-2 of 8 experts, the GPT-2
    architecture of GPT-3, BERT). Llama 3 70B's 8k-wide blocks take seconds to trace: slow."""
    spec = api.resolve_model(name)
    result = trace_config(json.loads(entry_path("model", name).read_text()), seq_len=seq)
    assert len(result.blocks) == 2
    for block in result.blocks:
        flops = 3 * block_model_flops(spec, block.index, seq, seq)  # forward + backward (2x)
        saved = block_activation_bytes(spec, block.index, Shard(seq_len=seq), Recompute.NONE)
        assert block.flops == pytest.approx(flops, rel=0.02), name
        assert block.saved_bytes == pytest.approx(saved, rel=0.10), name
    assert result.total_flops > sum(b.flops for b in result.blocks)  # embedding and head besides


def test_trace_needs_a_model_type(trace_extra) -> None:
    with pytest.raises(ConfigError, match="model_type"):
        trace_config({"hidden_size": 64}, seq_len=16)


def test_cli_trace_prints_the_comparison(capsys, tmp_path, trace_extra) -> None:
    from cli_helpers import run_cli

    config = tmp_path / "config.json"
    config.write_text(entry_path("model", "llama2-7b").read_text())
    code, out, _ = run_cli(capsys, ["trace", "--model", str(config), "--seq-len", "512"])
    assert code == 0 and "traced" in out and "closed form" in out


def test_from_module_on_a_model_built_by_the_caller(trace_extra) -> None:
    """nestplan.model.from_module on a 2-block Llama 2 7B built under fake tensors gives the
    figures trace_config gives for its config."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig, AutoModelForCausalLM

    from nestplan.model import from_module

    config = json.loads(entry_path("model", "llama2-7b").read_text())
    fields = {k: v for k, v in config.items() if not k.startswith("_") and k != "model_type"}
    cfg = AutoConfig.for_model("llama", **fields)
    cfg.num_hidden_layers = 2
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager")
        result = from_module(model, {"input_ids": torch.zeros((1, 512), dtype=torch.long)})
    reference = trace_config(config, seq_len=512)
    assert [b.flops for b in result.blocks] == pytest.approx([b.flops for b in reference.blocks], rel=1e-9)
    assert result.blocks[0].saved_bytes > 0
