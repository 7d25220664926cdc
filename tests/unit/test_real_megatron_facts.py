"""The round-trip matrix for Megatron-LM (issue 27 item 2): every catalog model the export takes, exported from a
small plan, parsed and validated by megatron-core 0.19.2's own ``parse_args``/``validate_args`` (test_real_megatron's
``Launch`` and ``parsed_and_validated``, with their stand-ins), turned into Megatron-core's ``TransformerConfig``
(``core_transformer_config_from_args``) and ``GPTModelConfig``/``HybridModelConfig`` (``gpt_config_from_args``,
``hybrid_config_from_args``), and the model built on the meta device by ``GPTModelBuilder`` (megatron/training/models/
gpt.py) with the local (non-Transformer-Engine) layer spec in a one-process gloo group. Every stated fact
(``nestplan.model.stated``) must equal Megatron's or be named in the export's notes; the built model's parameter count
must equal ``total_params`` once the noted vocabulary padding and block norms are taken out. A model the export
refuses must be refused in one line.

Stand-ins for the build (none changes a parameter): one-way tensor, pipeline, context and expert parallelism (the
whole model on one rank), CPU initialisation without init (parameters on the meta device), no persistent LayerNorm
no gradient-accumulation fusion (CUDA kernels) and no zero-centred gamma (torch's LayerNorm lacks it: the same
weights, read as 1 + gamma); the core attention, which holds no parameters, is a
parameterless module under MLA (the local DotProductAttention takes no MLA head sizes; no sinks there); ``torch.cuda.current_device`` answers
"cpu" and ``torch.cuda.Stream`` is None (YaRN's cache, the all-to-all dispatcher's copy stream).

``python3 -m pytest tests/unit/test_real_megatron_facts.py -s`` prints the matrix.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest
import torch
from planned_cases import evaluated
from test_real_megatron import Launch, megatron_args

from megatron_router import router_facts
from nestplan.errors import PlannerError
from nestplan.export import megatron
from nestplan.export.megatron_facts import GPT_LAYER_NORMS, padded_vocab
from nestplan.model.config import model_names
from nestplan.model.layers.params import mtp_params, total_params
from nestplan.model.spec import ModelSpec
from nestplan.model.stated import attention_variant, stated_facts
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims

pytest.importorskip("megatron.training.models.gpt", reason="megatron-core 0.19.2 unpacked on PYTHONPATH: see .ci/run")
from megatron.core import parallel_state  # noqa: E402
from megatron.core.activations import squared_relu  # noqa: E402
from megatron.core.fusions.fused_bias_geglu import quick_gelu  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.transformer.utils import is_layer_window_attention  # noqa: E402
from megatron.training.argument_utils import (  # noqa: E402
    core_transformer_config_from_args,
    gpt_config_from_args,
)
from megatron.core.models.backends import LocalSpecProvider  # noqa: E402
from megatron.training.models.gpt import GPTModelBuilder  # noqa: E402

ACTIVATIONS = {torch.nn.functional.silu: "silu", torch.nn.functional.gelu: "gelu", squared_relu: "relu2"}
ACTIVATIONS[quick_gelu] = "quick_gelu"
HEAVY = ("deepseek-v3", "kimi-k2", "qwen3-235b-a22b", "grok-1")  # thousands of expert modules: the slow run builds them
MATRIX: dict[str, str] = {}


def small_plan(m: ModelSpec) -> Plan:
    """8 GPUs, tp 2 (tp 1 for biased experts, which Megatron-core splits only with etp 1), 4k tokens or the
    learned positions' length."""
    tp = 1 if m.is_moe and m.linear_bias else 2
    seq = min(4096, m.max_position_embeddings) if m.learned_position_embeddings else 4096
    return evaluated(m.name, "dgx-h100", 8, ParallelDims(tp=tp, sp=tp > 1, dp=8 // tp), 64, seq)


# ---------------------------------------------------------------- Megatron's facts, in nestplan's terms
def rope_scaling(args, config, model_config) -> dict | None:
    """The rotary scaling Megatron builds, as a Hugging Face rope_scaling object with every key transformers
    defaults (YaRN's mscale pair as Megatron takes it: export.megatron_facts._mscales)."""
    if config.multi_latent_attention:
        if config.rotary_scaling_factor == 1.0:  # YaRN with factor 1 is plain RoPE
            return None
        keys = ("beta_fast", "beta_slow", "original_max_position_embeddings", "mscale", "mscale_all_dim")
        return {"rope_type": "yarn", "factor": config.rotary_scaling_factor, "truncate": True} | {
            k: getattr(config, k) for k in keys
        }
    if model_config.position_embedding_type == "yarn":
        keys = ("beta_fast", "beta_slow", "original_max_position_embeddings", "mscale", "mscale_all_dim")
        found = {k: getattr(config, f"yarn_{k}") for k in keys}
        return (
            {"rope_type": "yarn", "factor": config.yarn_rotary_scaling_factor}
            | found
            | {"truncate": config.yarn_correction_range_round_to_int}
        )
    if model_config.rope_scaling:  # RotaryEmbedding._apply_scaling's fixed bands
        return {"rope_type": "llama3", "factor": args.rope_scaling_factor, "low_freq_factor": 1.0}
    if model_config.seq_len_interpolation_factor:
        return {"rope_type": "linear", "factor": float(model_config.seq_len_interpolation_factor)}
    return None


def expected_scaling(m: ModelSpec) -> dict | None:
    """The model's rope_scaling with transformers' defaults filled in, in the keys ``rope_scaling`` gives."""
    s = m.facts.rope_scaling
    if s is None:
        return None
    if s.kind.value == "llama3":
        return {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.get("low_freq_factor")}
    if s.kind.value != "yarn":
        return s.as_dict()
    mscale, all_dim = (s.get("mscale"), s.get("mscale_all_dim"))
    pair = (mscale, all_dim) if mscale and all_dim else (1.0, 0.0)
    return {
        "rope_type": "yarn",
        "factor": s.factor,
        "beta_fast": s.get("beta_fast", 32.0),
        "beta_slow": s.get("beta_slow", 1.0),
        "original_max_position_embeddings": s.get("original_max_position_embeddings", 4096),
        "mscale": pair[0],
        "mscale_all_dim": pair[1],
        "truncate": s.get("truncate", True),
    }


def megatron_facts(m: ModelSpec, args, config, model_config) -> dict[str, object]:
    """Each stated fact as Megatron built it."""
    kind = model_config.position_embedding_type
    rotary = kind in ("rope", "yarn")
    windowed = [
        is_layer_window_attention(config.window_size, config.window_attn_skip_freq, i + 1) for i in range(m.num_layers)
    ]
    no_rope = config.no_rope_freq or [0] * m.num_layers
    if config.multi_latent_attention:
        fraction = config.qk_pos_emb_head_dim / (config.qk_head_dim + config.qk_pos_emb_head_dim)
        base = config.rotary_base
    else:
        fraction, base = (model_config.rotary_percent if rotary else 0.0), model_config.rotary_base
    groups = config.num_query_groups or config.num_attention_heads
    facts = {
        "norm": "rmsnorm" if config.normalization == "RMSNorm" else "layernorm",
        "norm_eps": config.layernorm_epsilon,
        "activation": ACTIVATIONS[config.activation_func],
        "gated_mlp": config.gated_linear_unit,
        "vocab_size": padded_vocab(model_config.vocab_size, config.tensor_model_parallel_size),
        "tied_embeddings": model_config.share_embeddings_and_output_weights,
        "attention_variant": "mla"
        if config.multi_latent_attention
        else attention_variant(dataclasses.replace(m, num_kv_heads=groups)),
        "qk_norm": "head"
        if config.qk_layernorm and not config.multi_latent_attention
        else ("l2" if config.qk_l2_norm else "none"),
        "window": ((config.window_size[0] + 1) if config.window_size else None, sum(windowed)),
        "attention_chunk": None,
        "rope_layers": m.num_layers - sum(no_rope),
        "rotary_fraction": fraction if kind != "learned_absolute" else 1.0,
        "attention_sinks": config.softmax_type == "learnable",
        "parallel_block": False,
        "block_norms": 1 if m.is_hybrid else GPT_LAYER_NORMS,
        "rope_theta": float(base) if rotary else None,
        "rope_scaling": rope_scaling(args, config, model_config) if rotary else None,
        "linear_bias": config.add_bias_linear,
        "qkv_bias": config.add_qkv_bias and not config.add_bias_linear,  # biases on Q/K/V alone
        "local_rope_theta": float(base) if rotary else None,
        "glu_clamp": config.activation_func_clamp_value,
        "glu_linear_offset": config.glu_linear_offset,
        "mtp_layers": config.mtp_num_layers or 0,
    }
    return facts | (router_facts(config, m) if config.num_moe_experts else {})


def differing(m: ModelSpec, found: dict[str, object]) -> list[str]:
    stated = stated_facts(m) | {"rope_scaling": expected_scaling(m)}
    return [name for name, value in stated.items() if found[name] != value]


# ---------------------------------------------------------------- the model, built
# the build's stand-ins (docstring): the whole model on one rank, parameters on the meta device, no CUDA kernels
ONE_RANK = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "sequence_parallel": False,
    "tp_comm_overlap": False,
    "transformer_impl": "local",
    "use_cpu_initialization": True,
    "perform_initialization": False,
    "persist_layer_norm": False,
    "gradient_accumulation_fusion": False,
    "layernorm_zero_centered_gamma": False,
}


class CoreAttentionStandIn(torch.nn.Module):
    """The core attention (softmax(QK^T)V) holds no parameters: a parameterless module in its place."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()


@pytest.fixture(scope="module")
def one_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    parallel_state.initialize_model_parallel()
    yield ProcessGroupCollection.use_mpu_process_groups()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()  # the tests after this module make their own


def built_parameters(args, config, groups, monkeypatch) -> int:
    """Parameters of the GPTModel Megatron builds from the exported arguments, on one rank (stand-ins: docstring),
    with the routers' expert biases, which Megatron keeps as buffers (router.py: the load-balancing rule, not the
    optimizer, updates them) and nestplan counts as parameters (Hugging Face's e_score_correction_bias)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: None)
    whole = dataclasses.replace(config, **ONE_RANK)
    for name, value in vars(config).items():  # _apply_yarn_config_from_args's attributes, beside the fields
        if name.startswith("yarn_"):
            setattr(whole, name, value)
    if config.multi_latent_attention:  # for the decoder's layers and the MTP modules' alike
        monkeypatch.setattr(LocalSpecProvider, "core_attention", lambda self: CoreAttentionStandIn)
    model_config = gpt_config_from_args(args, whole)
    model_config.make_vocab_size_divisible_by = args.make_vocab_size_divisible_by * config.tensor_model_parallel_size
    with torch.device("meta"):
        model = GPTModelBuilder(model_config).build_model(groups)
    expert_bias = sum(b.numel() for name, b in model.named_buffers() if name.endswith("expert_bias"))
    return sum(p.numel() for p in model.parameters()) + expert_bias


def explained_parameters(m: ModelSpec, noted: list[str], tp: int) -> int:
    """What the noted facts add to (or take from) Megatron's count: padded vocabulary rows (embedding and, untied,
    output layer), the block norms its GPT layer lacks, a per-head QK-norm for one over the whole width, MLA's
    kv latent norm left out without a query latent, and the MTP modules."""
    rows = padded_vocab(m.vocab_size, tp) - m.vocab_size if "vocab_size" in noted else 0
    extra = rows * m.hidden_size * (1 if m.tied_embeddings else 2)
    if "block_norms" in noted:
        extra -= (m.block_norms - GPT_LAYER_NORMS) * m.hidden_size * m.num_layers
    if m.mtp_layers:  # built by Megatron (--mtp-num-layers), costed apart from total_params
        extra += mtp_params(m, own_embedding_and_head=False)
    if m.is_mla and not m.q_lora_rank:  # the kv latent norm left out (noted under attention_variant)
        extra -= m.kv_lora_rank * m.num_layers
    if "qk_norm" in noted:  # per head (2 head_dim) instead of over the query and key widths
        extra -= ((m.num_heads + m.num_kv_heads) * m.head_dim - 2 * m.head_dim) * m.num_layers
    return extra


# ---------------------------------------------------------------- the matrix
def round_trip(name: str, tmp_path, monkeypatch, groups, build: bool) -> str:
    m = megatron_model(name)
    try:
        plan = small_plan(m)
        launch = Launch(plan, tmp_path)
    except PlannerError as refusal:
        assert "\n" not in str(refusal) and "cannot export to Megatron-LM" in str(refusal)
        return f"refused: {str(refusal).split(': ', 1)[1]}"
    args = megatron_args(launch, monkeypatch)
    config = core_transformer_config_from_args(args)
    model_config = gpt_config_from_args(args, config)
    notes = " ".join(launch.export.notes)
    noted = differing(m, megatron_facts(m, args, config, model_config))
    unnoted = [name for name in noted if f"{name}:" not in notes]
    assert not unnoted, f"{name}: facts neither equal nor noted: {unnoted}"
    row = f"facts equal but {', '.join(noted)} (noted)" if noted else "facts equal"
    if m.is_hybrid or not m.causal or not build:
        why = "HybridModel" if m.is_hybrid else ("BertModel" if not m.causal else "heavy: -m slow builds it")
        return f"not built ({why}); {row}"
    count = built_parameters(args, config, groups, monkeypatch)
    explained = int(explained_parameters(m, noted, plan.dims.tp))
    assert count == total_params(m) + explained, (name, count, total_params(m))
    return f"built, {count:,} parameters (total_params {explained:+,} noted); {row}"


def megatron_model(name: str) -> ModelSpec:
    from nestplan import api

    return api.resolve_model(name)


LIGHT = [n for n in model_names() if n not in HEAVY]


@pytest.mark.parametrize("name", LIGHT)
def test_megatron_round_trip(name, tmp_path, monkeypatch, one_process_group) -> None:
    MATRIX[name] = round_trip(name, tmp_path, monkeypatch, one_process_group, build=True)
    print(f"\n| {name} | {MATRIX[name]} |")


@pytest.mark.slow
@pytest.mark.parametrize("name", HEAVY)
def test_megatron_round_trip_of_the_largest_experts(name, tmp_path, monkeypatch, one_process_group) -> None:
    MATRIX[name] = round_trip(name, tmp_path, monkeypatch, one_process_group, build=True)
    print(f"\n| {name} | {MATRIX[name]} |")


@pytest.mark.parametrize("name", HEAVY)
def test_megatron_facts_of_the_largest_experts(name, tmp_path, monkeypatch, one_process_group) -> None:
    print(f"\n| {name} | {round_trip(name, tmp_path, monkeypatch, one_process_group, build=False)} |")


def test_the_matrix_covers_the_catalog() -> None:
    assert set(LIGHT) | set(HEAVY) == set(model_names()) and megatron.NAME == "megatron"
