"""Reading Hugging Face config.json dicts and the model catalog into ModelSpec."""

from __future__ import annotations

import json

import pytest

from nestplan.errors import ConfigError, UnknownNameError
from nestplan.model import (
    SUPPORTED_FAMILIES,
    ModelSpec,
    load_model,
    model_names,
    parse_config,
)

CATALOG = [
    "bert-large",
    "deepseek-v2-lite",
    "deepseek-v3",
    "falcon-180b",
    "falcon-40b",
    "gemma2-27b",
    "gemma2-9b",
    "gemma3-27b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "gpt3-175b",
    "gpt3-35b",
    "grok-1",
    "jamba-1.5-mini",
    "kimi-k2",
    "korthikanti-175b",
    "korthikanti-1t",
    "korthikanti-22b",
    "korthikanti-530b",
    "llama2-7b",
    "llama3-70b",
    "llama3-8b",
    "llama3.1-405b",
    "llama3.1-70b",
    "llama3.1-8b",
    "llama4-maverick",
    "llama4-scout",
    "mixtral-8x7b",
    "mixtral-small",
    "nemotron-3-nano-30b-a3b",
    "nemotron-h-56b",
    "nemotron-h-8b",
    "nemotron4-15b",
    "nemotron4-340b",
    "olmo2-7b",
    "phi3-medium",
    "phi3-mini",
    "qwen3-235b-a22b",
    "qwen3-32b",
    "qwen3-8b",
]


def param_count(spec: ModelSpec) -> int:
    """Total parameters, counted here independently of nestplan's layer formulas."""
    h, q, kv = spec.hidden_size, spec.q_channels, spec.kv_channels
    bias = spec.linear_bias
    norm = 2 * h if spec.norm == "layernorm" else h
    attention = h * (q + 2 * kv) + q * h + (q + 2 * kv + h if bias else 0)

    def mlp(width: int) -> int:
        return (3 if spec.gated_mlp else 2) * h * width + (width + h if bias else 0)

    total = 0
    for layer in range(spec.num_layers):
        ffn = mlp(spec.ffn_hidden_size)
        if spec.is_moe_layer(layer):
            ffn = spec.num_experts * mlp(spec.moe_ffn_hidden_size) + spec.num_experts * h
            ffn += spec.num_shared_experts * mlp(spec.shared_expert_ffn_hidden_size)
        total += attention + ffn + 2 * norm
    embeddings = spec.vocab_size * h * (1 if spec.tied_embeddings else 2)
    if spec.learned_position_embeddings:
        embeddings += spec.max_position_embeddings * h
    embeddings += spec.type_vocab_size * h
    return total + embeddings + norm


# ---------------------------------------------------------------- catalog


def test_catalog_names():
    assert model_names() == CATALOG


@pytest.mark.parametrize("name", CATALOG)
def test_every_catalog_model_loads(name):
    spec = load_model(name)
    assert spec.name == name
    assert spec.family in SUPPORTED_FAMILIES
    assert spec.num_heads % spec.num_kv_heads == 0


@pytest.mark.parametrize("name", CATALOG)
def test_catalog_files_cite_a_source(name):
    from nestplan.catalog import entry_path

    data = json.loads(entry_path("model", name).read_text())
    assert isinstance(data["_source"], str) and len(data["_source"]) > 40


# Published totals: HF model cards / safetensors metadata for Llama and Mixtral, the papers' names otherwise.
@pytest.mark.parametrize(
    ("name", "expected", "rel"),
    [
        ("llama2-7b", 6_738_415_616, 1e-9),  # meta-llama/Llama-2-7b-hf
        ("llama3-8b", 8_030_261_248, 1e-9),  # meta-llama/Meta-Llama-3-8B
        ("llama3-70b", 70_553_706_496, 1e-9),  # meta-llama/Meta-Llama-3-70B
        ("llama3.1-405b", 405.85e9, 1e-3),  # Llama 3 herd paper: 405B
        ("mixtral-8x7b", 46_702_792_704, 1e-9),  # Jiang et al. 2024: 47B total
        ("mixtral-small", 790e6, 0.01),  # NEST paper, Appendix C.2.1: 790M
        ("bert-large", 340e6, 0.02),  # Devlin et al. 2019: 340M
        ("gpt3-175b", 175e9, 0.01),  # Brown et al. 2020, Table 2.1
        ("gpt3-35b", 35e9, 0.01),  # NEST paper, Appendix C.1.1
        ("korthikanti-22b", 22e9, 0.02),  # Korthikanti et al. 2022, Table 3
        ("korthikanti-175b", 175e9, 0.01),
        ("korthikanti-530b", 530e9, 0.01),
        ("korthikanti-1t", 1e12, 0.01),
    ],
)
def test_catalog_parameter_counts(name, expected, rel):
    assert param_count(load_model(name)) == pytest.approx(expected, rel=rel)


@pytest.mark.parametrize(
    "name", ["gpt3-175b", "korthikanti-22b", "korthikanti-175b", "korthikanti-530b", "korthikanti-1t"]
)
def test_gpt_catalog_models_follow_12_l_h_squared(name):
    spec = load_model(name)
    assert spec.ffn_hidden_size == 4 * spec.hidden_size
    blocks = 12 * spec.num_layers * spec.hidden_size**2
    assert param_count(spec) == pytest.approx(blocks, rel=0.03)


def test_catalog_values():
    llama = load_model("llama3-70b")
    assert (llama.num_layers, llama.hidden_size, llama.num_heads, llama.num_kv_heads) == (80, 8192, 64, 8)
    assert (llama.ffn_hidden_size, llama.vocab_size, llama.max_position_embeddings) == (28672, 128256, 8192)
    assert llama.gated_mlp and llama.norm == "rmsnorm" and not llama.tied_embeddings and not llama.linear_bias
    big = load_model("llama3.1-405b")
    assert (big.num_layers, big.hidden_size, big.num_heads, big.num_kv_heads, big.ffn_hidden_size) == (
        126,
        16384,
        128,
        8,
        53248,
    )
    assert big.max_position_embeddings == 131072
    assert load_model("llama2-7b").num_kv_heads == 32
    kort = load_model("korthikanti-530b")
    assert (kort.num_layers, kort.hidden_size, kort.num_heads, kort.vocab_size) == (105, 20480, 128, 51200)
    assert kort.dropout and kort.linear_bias and kort.norm == "layernorm" and kort.learned_position_embeddings
    small = load_model("mixtral-small")
    assert (small.num_layers, small.hidden_size, small.num_heads, small.num_kv_heads) == (8, 1024, 16, 4)
    assert (small.num_experts, small.experts_per_token, small.moe_ffn_hidden_size) == (8, 2, 3584)
    assert small.moe_layers == tuple(range(8)) and small.is_moe
    bert = load_model("bert-large")
    assert (
        not bert.causal and bert.type_vocab_size == 2 and bert.tied_embeddings and bert.max_position_embeddings == 512
    )


def test_catalog_name_is_case_insensitive():
    assert load_model("Llama3-8B").name == "llama3-8b"


def test_unknown_catalog_name_lists_valid_names():
    with pytest.raises(UnknownNameError) as info:
        load_model("llama9-1b")
    message = str(info.value)
    assert "llama9-1b" in message and "llama3-8b" in message and "mixtral-small" in message
    assert isinstance(info.value, ConfigError)


# ---------------------------------------------------------------- families from inline dicts


def llama_dict(**overrides):
    data = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 688,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
    }
    data.update(overrides)
    return data


def test_llama_gqa_and_defaults():
    spec = parse_config(llama_dict(), "tiny")
    assert spec.name == "tiny" and spec.family == "llama"
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.kv_channels) == (8, 2, 32, 64)
    assert spec.ffn_hidden_size == 688 and spec.gated_mlp and spec.norm == "rmsnorm"
    assert not spec.tied_embeddings and not spec.linear_bias and not spec.dropout and spec.causal
    assert not spec.learned_position_embeddings and not spec.is_moe and spec.moe_layers == ()


def test_llama_kv_heads_default_to_heads_and_explicit_head_dim():
    data = llama_dict(head_dim=48)
    del data["num_key_value_heads"]
    spec = parse_config(data, "x")
    assert spec.num_kv_heads == 8 and spec.head_dim == 48 and spec.q_channels == 384


def test_llama_bias_tie_dropout_and_null_fields():
    spec = parse_config(
        llama_dict(attention_bias=True, tie_word_embeddings=True, attention_dropout=0.1, head_dim=None), "x"
    )
    assert spec.linear_bias and spec.tied_embeddings and spec.dropout and spec.head_dim == 32
    assert parse_config(llama_dict(mlp_bias=True), "x").linear_bias


def test_max_positions_default_is_the_family_default():
    data = llama_dict()
    del data["max_position_embeddings"]
    assert parse_config(data, "x").max_position_embeddings == 2048


def test_mistral_and_qwen2():
    mistral = parse_config(llama_dict(model_type="mistral", sliding_window=4096), "m")
    assert mistral.family == "mistral" and mistral.num_kv_heads == 2 and mistral.gated_mlp
    qwen = parse_config(llama_dict(model_type="qwen2", tie_word_embeddings=True), "q")
    assert qwen.family == "qwen2" and qwen.tied_embeddings and not qwen.linear_bias


def test_mixtral():
    spec = parse_config(llama_dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2), "mx")
    assert (spec.num_experts, spec.experts_per_token) == (4, 2)
    assert spec.moe_ffn_hidden_size == 688 and spec.ffn_hidden_size == 688
    assert spec.moe_layers == (0, 1, 2, 3) and spec.num_shared_experts == 0 and spec.is_moe_layer(3)


def qwen2_moe_dict(**overrides):
    data = llama_dict(
        model_type="qwen2_moe",
        num_hidden_layers=6,
        intermediate_size=1024,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=512,
        decoder_sparse_step=1,
        mlp_only_layers=[0, 3],
    )
    data.update(overrides)
    return data


def test_qwen2_moe_shared_expert_and_mlp_only_layers():
    spec = parse_config(qwen2_moe_dict(), "q2")
    assert (spec.num_experts, spec.experts_per_token, spec.moe_ffn_hidden_size) == (16, 4, 128)
    assert (spec.num_shared_experts, spec.shared_expert_ffn_hidden_size) == (1, 512)
    assert spec.ffn_hidden_size == 1024
    assert spec.moe_layers == (1, 2, 4, 5)
    assert not spec.is_moe_layer(0) and spec.is_moe_layer(1)


def test_qwen2_moe_sparse_step_and_no_shared_expert():
    spec = parse_config(
        qwen2_moe_dict(decoder_sparse_step=2, mlp_only_layers=[], shared_expert_intermediate_size=0), "x"
    )
    assert spec.moe_layers == (1, 3, 5)
    assert (spec.num_shared_experts, spec.shared_expert_ffn_hidden_size) == (0, 0)


def test_qwen3_moe():
    data = llama_dict(
        model_type="qwen3_moe",
        num_hidden_layers=3,
        head_dim=64,
        num_experts=32,
        num_experts_per_tok=8,
        moe_intermediate_size=96,
        attention_bias=False,
    )
    del data["intermediate_size"]  # every layer is MoE: allowed to be absent
    spec = parse_config(data, "q3")
    assert spec.head_dim == 64 and spec.q_channels == 512 and spec.kv_channels == 128
    assert spec.moe_layers == (0, 1, 2) and spec.num_shared_experts == 0
    assert spec.ffn_hidden_size == 96 and spec.moe_ffn_hidden_size == 96 and spec.experts_per_token == 8


def test_gpt2_defaults():
    spec = parse_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}, "g")
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (
        768,
        12,
        12,
        12,
        64,
    )
    assert spec.ffn_hidden_size == 3072 and spec.max_position_embeddings == 1024
    assert spec.tied_embeddings and spec.learned_position_embeddings and spec.linear_bias and spec.dropout
    assert not spec.gated_mlp and spec.norm == "layernorm"


def test_gpt2_explicit_inner_and_no_dropout():
    spec = parse_config(
        {
            "model_type": "gpt2",
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "vocab_size": 100,
            "n_inner": 100,
            "n_positions": 128,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
        "g",
    )
    assert spec.ffn_hidden_size == 100 and spec.max_position_embeddings == 128 and not spec.dropout


def test_gpt_neox():
    spec = parse_config(
        {
            "model_type": "gpt_neox",
            "hidden_size": 512,
            "num_hidden_layers": 6,
            "num_attention_heads": 8,
            "intermediate_size": 2048,
            "vocab_size": 50304,
            "max_position_embeddings": 2048,
            "rotary_pct": 0.25,
            "hidden_act": "gelu",
        },
        "neox",
    )
    assert (spec.hidden_size, spec.num_layers, spec.head_dim, spec.ffn_hidden_size) == (512, 6, 64, 2048)
    assert not spec.tied_embeddings and not spec.learned_position_embeddings and not spec.dropout
    assert spec.linear_bias and spec.norm == "layernorm" and not spec.gated_mlp


def test_bert():
    spec = parse_config(
        {
            "model_type": "bert",
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 512,
            "vocab_size": 30522,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
        },
        "b",
    )
    assert not spec.causal and spec.tied_embeddings and spec.learned_position_embeddings and spec.dropout
    assert spec.type_vocab_size == 2 and spec.ffn_hidden_size == 512 and spec.norm == "layernorm"


# ---------------------------------------------------------------- errors


def test_unsupported_model_type_lists_families():
    with pytest.raises(ConfigError) as info:
        parse_config({"model_type": "t5", "d_model": 512}, "x")
    message = str(info.value)
    assert "model_type 't5' is not supported" in message
    assert "llama" in message and "qwen3_moe" in message and "bert" in message
    assert info.value.field == "model_type"


def test_missing_model_type():
    with pytest.raises(ConfigError, match="model_type"):
        parse_config({"hidden_size": 4}, "x")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({k: v for k, v in llama_dict().items() if k != "num_attention_heads"}, "num_attention_heads"),
        ({k: v for k, v in llama_dict().items() if k != "vocab_size"}, "vocab_size"),
        ({k: v for k, v in llama_dict(model_type="mixtral", num_experts_per_tok=2).items()}, "num_local_experts"),
        (
            {k: v for k, v in qwen2_moe_dict().items() if k != "shared_expert_intermediate_size"},
            "shared_expert_intermediate_size",
        ),
        ({k: v for k, v in qwen2_moe_dict().items() if k != "intermediate_size"}, "intermediate_size"),
        ({k: v for k, v in qwen2_moe_dict().items() if k != "moe_intermediate_size"}, "moe_intermediate_size"),
        ({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 10}, "n_layer"),
        (
            {
                "model_type": "gpt_neox",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 10,
            },
            "intermediate_size",
        ),
        (
            {
                "model_type": "bert",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "intermediate_size": 256,
                "vocab_size": 10,
            },
            "num_attention_heads",
        ),
    ],
)
def test_missing_field_names_field_and_family(data, field):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x")
    assert str(info.value) == f"config.json ({data['model_type']}): missing field '{field}'"
    assert info.value.field == field


@pytest.mark.parametrize("value", [0, -4, 4.5, 256.0, "256", True, [256], 2**16 + 1])
def test_bad_integer_names_field_and_value(value):
    with pytest.raises(ConfigError) as info:
        parse_config(llama_dict(hidden_size=value), "x")
    message = str(info.value)
    assert "'hidden_size'" in message and repr(value) in message and "an integer in 1..65536" in message
    assert info.value.field == "hidden_size"


def test_bad_flag_and_probability():
    with pytest.raises(ConfigError, match="tie_word_embeddings.*'yes'"):
        parse_config(llama_dict(tie_word_embeddings="yes"), "x")
    with pytest.raises(ConfigError, match="resid_pdrop.*1.5"):
        parse_config(
            {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 10, "resid_pdrop": 1.5}, "x"
        )


def test_heads_not_dividing_hidden():
    with pytest.raises(ConfigError) as info:
        parse_config(llama_dict(hidden_size=250), "x")
    assert "num_attention_heads 8 does not divide hidden_size 250" in str(info.value)
    with pytest.raises(ConfigError, match="n_head 5 does not divide n_embd 64"):
        parse_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 5, "vocab_size": 10}, "x")
    # an explicit head_dim makes the division unnecessary
    assert parse_config(llama_dict(hidden_size=250, head_dim=32), "x").q_channels == 256


def test_kv_heads_not_dividing_heads():
    with pytest.raises(ConfigError) as info:
        parse_config(llama_dict(num_key_value_heads=3), "x")
    assert "num_key_value_heads 3 does not divide num_attention_heads 8" in str(info.value)
    assert info.value.field == "num_key_value_heads"


def test_moe_consistency_errors():
    with pytest.raises(ConfigError, match="num_experts_per_tok 5 exceeds num_local_experts 4"):
        parse_config(llama_dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=5), "x")
    with pytest.raises(ConfigError, match="mlp_only_layers.*6"):
        parse_config(qwen2_moe_dict(mlp_only_layers=[6]), "x")


def test_top_level_not_a_dict():
    with pytest.raises(ConfigError, match="JSON object"):
        parse_config([1, 2], "x")  # type: ignore[arg-type]


# ---------------------------------------------------------------- load_model from files


def test_load_from_path_uses_name_field(tmp_path):
    path = tmp_path / "whatever.json"
    path.write_text(json.dumps(llama_dict(_name_or_path="org/tiny-llama")))
    spec = load_model(str(path))
    assert spec.name == "org/tiny-llama" and spec.num_kv_heads == 2


def test_load_from_path_falls_back_to_stem_and_folder(tmp_path):
    (tmp_path / "my-model.json").write_text(json.dumps(llama_dict()))
    assert load_model(str(tmp_path / "my-model.json")).name == "my-model"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(llama_dict()))
    assert load_model(str(folder)).name == "ckpt"
    assert load_model(str(folder / "config.json")).name == "ckpt"


def test_load_missing_file_names_path(tmp_path):
    path = tmp_path / "absent.json"
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    assert str(path) in str(info.value) and "does not exist" in str(info.value)


def test_load_invalid_json_gives_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": ,\n}\n')
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    assert "invalid JSON at line 3 column" in str(info.value) and str(path) in str(info.value)


def test_load_top_level_not_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ConfigError, match="top level must be an object, got list"):
        load_model(str(path))


def test_errors_from_a_file_still_name_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(llama_dict(num_hidden_layers=0)))
    with pytest.raises(ConfigError, match="'num_hidden_layers'.*0"):
        load_model(str(path))
