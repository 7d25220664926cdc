"""The round-trip matrix for Megatron-Bridge (issue 27 item 2: the model as exported is the model as read).

For every catalog model: a small plan (8 H100s) is exported; a refusal must be one line. Otherwise the
recipe the launch script names builds its ConfigContainer and the exported overrides go on top, as
run_recipe.py does (test_real_megatron_bridge.run_recipe: Megatron-Bridge's own override parser and
``runtime_config_update`` with its validation). From the resulting model provider (a TransformerConfig
subclass) each fact of ``stated_facts`` is read back in Megatron's own terms (:func:`read_facts`) and must
equal nestplan's, or the export's notes must name it ("<fact>: ..."). Then the provider builds its model
on the meta device (one gloo process, Megatron-core's local layer spec) and the parameters are counted:
that count equals ``total_params`` (the multi-token-prediction modules are checked by count, mtp_num_layers,
not built: Megatron-core's MTP spec needs Transformer Engine) plus the padded vocabulary rows
where the export pads the vocabulary (noted as "vocab_size"). Models with many experts build slowly (a
module per expert): they are marked slow. The matrix prints with ``-s``:

    PYTHONPATH=~/.cache/nestplan-ci/frameworks:src python3 -m pytest -m '' -s tests/unit/test_real_megatron_bridge_facts.py
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile

import pytest
import test_real_megatron_bridge as real  # the stand-ins, the fixture and run_recipe (skips without the frameworks)
import torch
from test_real_megatron_bridge import bridge  # noqa: F401  (the fixture)

from megatron_router import router_facts
from nestplan import api
from nestplan.errors import ConfigError
from nestplan.export import nemo
from nestplan.export.plan import ExportInput
from nestplan.job import Job
from nestplan.model.config import load_model, model_names
from nestplan.model.layers.params import total_params
from nestplan.model.spec import ModelSpec
from nestplan.model.stated import stated_facts
from nestplan.plan import Plan
from nestplan.strategy.dims import ParallelDims

DEVICES = 8
SLOW_EXPERT_MODULES = 2000  # experts x MoE layers above which a meta build takes more than a few seconds
MATRIX: dict[str, str] = {}


def small_plan(name: str) -> Plan:
    """Tensor parallel 2 for a dense model (so that a vocabulary tp does not divide is padded), 8-way expert
    parallel for a mixture of experts, 2,048 tokens (or the model's learned positions)."""
    m = load_model(name)
    ep = 8 if m.is_moe and m.num_experts % 8 == 0 else 1
    dims = ParallelDims(tp=1, dp=1, ep=ep) if ep > 1 else ParallelDims(tp=2, dp=DEVICES // 2)
    seq = min(2048, m.max_position_embeddings)
    return api.evaluate_full(name, "dgx-h100", dims, Job(global_batch_size=64, seq_len=seq), devices=DEVICES).plan


def _expert_modules(name: str) -> int:
    m = load_model(name)
    return m.num_experts * len(m.moe_layers) if m.is_moe else 0


# ---------------------------------------------------------------- the facts as Megatron holds them
def _activation_name(p, stated: str) -> str:
    """The stated activation where Megatron's function computes Hugging Face's (transformers' ACT2FN) on a
    probe tensor, else the Megatron function's name."""
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 97, dtype=torch.float64)
    if torch.allclose(p.activation_func(x), ACT2FN[stated](x), atol=1e-6):
        return stated
    return getattr(p.activation_func, "__name__", str(p.activation_func))


def _rope_scaling(p, stated: dict | None) -> dict | None:
    """The provider's RoPE scaling as a Hugging Face rope_scaling object, restricted to the keys the model
    states (an absent key takes transformers' default, which Megatron's defaults match). Megatron-core's
    Llama 3.1 bands are RotaryEmbedding._apply_scaling's fixed defaults."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    if p.multi_latent_attention:
        keys = ("rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
        keys += ("mscale", "mscale_all_dim")
        read = (
            None if p.rope_type != "yarn" else {"rope_type": "yarn"} | dict(zip(_YARN, (getattr(p, k) for k in keys)))
        )
    elif p.rope_scaling:
        bands = inspect.signature(RotaryEmbedding._apply_scaling).parameters
        read = {"rope_type": "llama3", "factor": p.rope_scaling_factor} | {
            k: bands[k].default for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        }
    elif p.seq_len_interpolation_factor:
        read = {"rope_type": "linear", "factor": p.seq_len_interpolation_factor}
    elif p.position_embedding_type == "yarn":
        values = (getattr(p, "yarn_" + k) for k in ("rotary_scaling_factor", *_YARN[1:]))
        read = {"rope_type": "yarn", "truncate": p.yarn_correction_range_round_to_int} | dict(zip(_YARN, values))
    else:
        read = None
    if read is None or stated is None:
        return read
    return {k: read.get(k) for k in stated}


_YARN = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def read_facts(p, m: ModelSpec, stated: dict) -> dict[str, object]:
    """Each stated fact as Megatron-Bridge's provider ``p`` holds it."""
    from megatron.core.transformer.utils import is_layer_window_attention

    rotary = p.position_embedding_type in ("rope", "yarn")
    windowed = [is_layer_window_attention(p.window_size, p.window_attn_skip_freq, i + 1) for i in range(p.num_layers)]
    heads, groups = p.num_attention_heads, p.num_query_groups
    facts = {
        "norm": {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}[p.normalization],
        "norm_eps": p.layernorm_epsilon,
        "activation": _activation_name(p, stated["activation"]),
        "gated_mlp": p.gated_linear_unit,
        "vocab_size": p.vocab_size,
        "tied_embeddings": p.share_embeddings_and_output_weights,
        "attention_variant": "mla"
        if p.multi_latent_attention
        else ("mha" if groups in (None, heads) else "mqa" if groups == 1 else "gqa"),
        "qk_norm": "l2" if p.qk_l2_norm else ("head" if p.qk_layernorm and not p.multi_latent_attention else "none"),
        "window": (None, 0) if not p.window_size else (p.window_size[0] + 1, sum(windowed)),
        "attention_chunk": None,  # Megatron-core's GPT has no chunked attention
        "rope_layers": p.num_layers - sum(p.no_rope_freq or []) if isinstance(p.no_rope_freq, list) else p.num_layers,
        "rotary_fraction": p.qk_pos_emb_head_dim / (p.qk_head_dim + p.qk_pos_emb_head_dim)
        if p.multi_latent_attention
        else p.rotary_percent,
        "attention_sinks": p.softmax_type == "learnable",
        "parallel_block": False,  # Megatron-core's GPT layer: attention, then MLP
        "block_norms": 2,  # Megatron-core's GPT layer: pre-attention and pre-MLP norms
        "rope_theta": p.rotary_base if rotary else None,
        "rope_scaling": _rope_scaling(p, stated["rope_scaling"]) if rotary else None,
        "linear_bias": p.add_bias_linear,
        "qkv_bias": p.add_qkv_bias and not p.add_bias_linear,
        "local_rope_theta": p.rotary_base,  # one base for every layer
        "glu_clamp": p.activation_func_clamp_value,
        "glu_linear_offset": p.glu_linear_offset,
        "mtp_layers": p.mtp_num_layers or 0,
    }
    if p.num_moe_experts:
        facts |= router_facts(p, m)
    return facts


# ---------------------------------------------------------------- the model on the meta device
@contextlib.contextmanager
def one_process():
    """One gloo process and Megatron-core's model-parallel groups of size 1, for building on the meta device
    (only while building: the recipe's data-parallel size is the plan's, from WORLD_SIZE)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + tempfile.mktemp())
    parallel_state.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def built_parameters(p, monkeypatch) -> int:
    """The provider's model built on one CPU process on the meta device with Megatron-core's local block
    spec (no Transformer Engine; dense and MoE layers as moe_layer_freq says): the parameters, counted (the degrees do not change the whole model). MLA's
    rotary embedding asks CUDA for its device (rotary_pos_embedding.py): here the CPU answers. DeepSeek's
    expert selection bias is a buffer in Megatron (router.py: updated outside the optimizer), a parameter in
    nestplan's count: counted with them."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.identity_op import IdentityOp

    for field in ("tensor", "pipeline", "context", "expert"):
        setattr(p, f"{field}_model_parallel_size", 1)
    p.sequence_parallel = p.persist_layer_norm = p.gradient_accumulation_fusion = False
    p.moe_shared_expert_overlap = False  # a CUDA stream, no parameters
    p.layernorm_zero_centered_gamma = False  # the torch LayerNorm of the local spec has none; the same weights
    p.init_model_with_meta_device = p.use_cpu_initialization = True
    p.perform_initialization = False
    p.moe_token_dispatcher_type = "allgather"  # the all-to-all dispatcher makes a CUDA stream
    p.pipeline_model_parallel_layout = None
    p.num_layers_in_first_pipeline_stage = p.num_layers_in_last_pipeline_stage = None
    p.virtual_pipeline_model_parallel_size = None
    p.moe_grouped_gemm = False  # the local spec's experts: one MLP each
    p.mtp_num_layers = None  # Megatron-core's MTP block spec needs Transformer Engine: not built here
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    with one_process():
        spec = get_gpt_decoder_block_spec(p, use_transformer_engine=False, normalization=p.normalization)
        for layer in spec.layer_specs:  # the local core attention takes no MLA k_channels; it holds no parameters
            if p.multi_latent_attention:
                layer.submodules.self_attention.submodules.core_attention = _NoParameters
            if p.multi_latent_attention and not p.q_lora_rank:  # no query latent, no query latent norm
                layer.submodules.self_attention.submodules.q_layernorm = IdentityOp
        p.transformer_layer_spec = lambda config: spec
        p._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        model = p.provide(pre_process=True, post_process=True)
        selection_bias = sum(b.numel() for name, b in model.named_buffers() if name.endswith("expert_bias"))
        return sum(x.numel() for x in model.parameters()) + selection_bias


class _NoParameters(torch.nn.Module):
    """A parameterless stand-in for MLA's core attention in the local spec (DotProductAttention has no weights)."""

    def __init__(self, *args, **kwargs):
        super().__init__()


def expected_parameters(m: ModelSpec, vocab: int, noted: list[str]) -> int:
    """``total_params`` plus the padded vocabulary rows (input and, untied, output); less what the noted facts leave out: the norms beyond 2
    per block (block_norms, Gemma's sandwich norms) and, for a QK-norm over the whole width (qk_norm "full",
    OLMo 2), its weights beyond Megatron's per-head ones."""
    padded_rows = (vocab - m.vocab_size) * m.hidden_size * (1 if m.tied_embeddings else 2)
    count = round(total_params(m)) + padded_rows  # the MTP modules are not built (built_parameters)
    if "block_norms" in noted:
        count -= (m.block_norms - 2) * m.hidden_size * m.num_layers
    if "qk_norm" in noted:
        count -= (m.num_heads * m.head_dim + m.num_kv_heads * m.head_dim - 2 * m.head_dim) * m.num_layers
    return count


# ---------------------------------------------------------------- the matrix
def _noted(notes: tuple[str, ...], fact: str) -> bool:
    return any(note.startswith(f"{fact}:") for note in notes)


def _case(name: str):
    marks = [pytest.mark.slow] if _expert_modules(name) > SLOW_EXPERT_MODULES else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_case(n) for n in model_names()])
def test_the_model_megatron_bridge_builds_is_the_model_read(
    bridge,  # noqa: F811
    name,
    tmp_path,
    monkeypatch,
) -> None:
    try:
        plan = small_plan(name)
        export = nemo.export(ExportInput(plan, "test"))
    except ConfigError as refusal:
        assert "\n" not in str(refusal)
        MATRIX[name] = f"refused | {str(refusal)[:110]}"
        return
    m = plan.model
    recipe, overrides = real.launch_arguments(plan, tmp_path)
    cfg = real.run_recipe(bridge, recipe, overrides, DEVICES, monkeypatch)
    p, stated = cfg.model, stated_facts(m)
    read = read_facts(p, m, stated)
    noted = sorted(fact for fact in stated if _noted(export.notes, fact))
    differing = {fact: (value, read[fact]) for fact, value in stated.items() if read[fact] != value}
    assert set(differing) <= set(noted), f"{name}: facts neither equal nor noted: {differing}"
    if m.is_mla:
        latent = (p.q_lora_rank or 0, p.kv_lora_rank, p.qk_head_dim + p.qk_pos_emb_head_dim, p.v_head_dim)
        assert latent == (m.q_lora_rank, m.kv_lora_rank, m.head_dim, m.value_head_dim)
    assert (p.mtp_num_layers or 0) == m.mtp_layers
    equal = len(stated) - len(differing)
    if p.multi_latent_attention and not p.q_lora_rank:
        # Megatron-core's local MLA spec has no plain query projection (its linear_q_proj stands unresolved
        # without Transformer Engine): facts only
        outcome = "not built (local MLA spec: no query latent)"
    else:
        built = built_parameters(p, monkeypatch)
        assert built == expected_parameters(m, p.vocab_size, noted), (name, built, total_params(m))
        outcome = f"built {built / 1e9:.2f}B = nestplan"
    MATRIX[name] = f"{outcome} | {equal}/{len(stated)} equal | noted: {', '.join(noted) or '-'}"
    MATRIX[name] += f" | {recipe}"


def test_the_matrix_has_a_row_per_model_run(request) -> None:
    """Printed with -s: one row per catalog model run above (built and equal, noted facts, or refused why)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("the matrix is collected in one process")
    width = max(map(len, MATRIX), default=0)
    print("\nMegatron-Bridge 0.6.2 round trip (model | outcome | facts | noted | recipe)")
    for name in sorted(MATRIX):
        print(f"{name:<{width}} | {MATRIX[name]}")
    assert MATRIX, "no model ran"
