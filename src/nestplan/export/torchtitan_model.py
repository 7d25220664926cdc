"""The config module the torchtitan export writes next to its launch script (``nestplan_torchtitan.py``):
the model as torchtitan 0.3.0's own model of its architecture (``torchtitan_arch.architecture``: Llama 3,
Qwen3, DeepSeek-V3 or gpt-oss), sized and given the model's facts (RoPE, norm epsilon, query/key norms,
router, shared experts, vocabulary, tied embeddings), FP8 linears only where nestplan costed them, and a
split torchtitan's flags cannot give listed module by module.

The layers come from the architecture's own builders (torchtitan/models/llama3/__init__.py
``_build_llama3_layers``, qwen3/__init__.py ``_build_qwen3_layers`` and ``_build_qwen3_moe_layers``,
deepseek_v3/__init__.py ``_build_dsv3_layers``, gpt_oss/__init__.py ``_build_gptoss_layers`` and
``_make_gptoss_attn_config``); ``nestplan_facts`` in the module then sets what those builders fix: every
``RMSNorm.Config.eps`` and each ``MoE.Config``'s router, correction bias and shared experts."""

from __future__ import annotations

from nestplan.export.common import comment_text
from nestplan.export.plan import ExportInput
from nestplan.export.torchtitan_arch import DEEPSEEK_V3, GPT_OSS, LLAMA3, QWEN3, architecture
from nestplan.export.torchtitan_split import listed_split
from nestplan.model.config import catalog_architecture
from nestplan.model.facts import YARN_DEFAULTS, RopeType
from nestplan.model.spec import ModelSpec, QKNorm

# catalog model: (torchtitan's config_registry function lending the run settings, its model flavor, its
# Hugging Face assets folder), chosen for a model of that catalog model's architecture (its facts included:
# torchtitan's Llama 3 flavours are Llama 3.1's, with its "llama" RoPE scaling), whatever its name
# (model.config.catalog_architecture); the 405B takes the 70B's settings: torchtitan's llama3_405b builds FP8
# linears and compiles (torchtitan/models/llama3/config_registry.py)
MODEL_CONFIGS = {
    "llama3.1-8b": ("llama3_8b", "8B", "./assets/hf/Llama-3.1-8B"),
    "llama3.1-70b": ("llama3_70b", "70B", "./assets/hf/Llama-3.1-70B"),
    "llama3.1-405b": ("llama3_70b", "405B", "./assets/hf/Llama-3.1-405B"),
}
CONFIG_MODULE = "nestplan_torchtitan"  # the config module the export writes next to its launch script
CONFIG_FUNCTION = "nestplan_plan"
# per architecture: (its RoPE class, its registry import, the flavour lending the ModelSpec: parallelize,
# pipelining, state-dict adapter, the MoE load-balancing hook; its model is replaced)
REGISTRIES = {
    LLAMA3: ("ComplexRoPE", "from torchtitan.models.llama3 import _build_llama3_layers\n", "model_registry", "8B"),
    QWEN3: (
        "CosSinRoPE",
        "from torchtitan.models.qwen3 import _build_qwen3_layers, _build_qwen3_moe_layers\n"
        "from torchtitan.models.qwen3 import model_registry as qwen3_registry\n",
        "qwen3_registry",
        "30B-A3B",
    ),
    DEEPSEEK_V3: (
        "ComplexRoPE",
        "from torchtitan.models.deepseek_v3 import _build_dsv3_layers\n"
        "from torchtitan.models.deepseek_v3 import model_registry as deepseek_registry\n",
        "deepseek_registry",
        "16B",
    ),
    GPT_OSS: (
        "CosSinRoPE",
        "from torchtitan.models.gpt_oss import _build_gptoss_layers, _make_gptoss_attn_config\n"
        "from torchtitan.models.gpt_oss import model_registry as gptoss_registry\n"
        "from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts\n",
        "gptoss_registry",
        "20b",
    ),
}
BACKENDS = 'attn_backend="flex"'  # FlexAttention: what the cost model's fused attention kernel is


def _stages_source(counts: list[int]) -> tuple[str, str]:
    """(the function listing each stage's modules, the line that sets it) for a listed split."""
    function = (
        f"STAGE_LAYERS = [{', '.join(str(int(c)) for c in counts)}]   # per (virtual) stage, as costed\n\n\n"
        "def nestplan_stages():\n"
        '    """Each (virtual) stage\'s modules: the embedding first, the norm and head last."""\n'
        "    parts, first = [], 0\n"
        "    for count in STAGE_LAYERS:\n"
        '        parts.append([f"layers.{i}" for i in range(first, first + count)])\n'
        "        first += count\n"
        '    parts[0].insert(0, "tok_embeddings")\n'
        '    parts[-1] += ["norm", "lm_head"]\n'
        "    return parts\n\n\n"
    )
    return function, "    config.parallelism.module_fqns_per_model_part = nestplan_stages()\n"


# per RoPE scaling torchtitan takes: its RoPE.Config.scaling, and each field it sets from Hugging Face's key
# with transformers' default (None: required; MAX_POSITIONS: the model's maximum, YaRN's default length)
MAX_POSITIONS = "max_position_embeddings"
ROPE_SCALINGS: dict[RopeType, tuple[str, tuple[tuple[str, str, object, type], ...]]] = {
    RopeType.LLAMA3: (
        "llama",
        (
            ("scaling_factor", "factor", None, float),
            ("low_freq_factor", "low_freq_factor", None, float),
            ("high_freq_factor", "high_freq_factor", None, float),
            ("original_max_position_embeddings", "original_max_position_embeddings", None, int),
        ),
    ),
    RopeType.YARN: (
        "yarn",
        (
            ("rope_factor", "factor", None, float),
            ("beta_fast", "beta_fast", YARN_DEFAULTS["beta_fast"], float),
            ("beta_slow", "beta_slow", YARN_DEFAULTS["beta_slow"], float),
            ("original_seq_len", "original_max_position_embeddings", MAX_POSITIONS, int),
            ("truncate", "truncate", YARN_DEFAULTS["truncate"], bool),
        ),
    ),
}


def _rope_source(m: ModelSpec, seq_len: int) -> str:
    """The model's RoPE as its architecture's ``RoPE.Config`` (torchtitan/models/common/rope.py): base, and
    Llama 3.1's or YaRN's scaling by Hugging Face's parameters (``ROPE_SCALINGS``)."""
    f, arch = m.facts, architecture(m)
    dim = m.qk_rope_head_dim if arch == DEEPSEEK_V3 else m.head_dim
    length = max(int(seq_len), int(m.max_position_embeddings))
    args = [f"dim={int(dim)}", f"max_seq_len={length}", f"theta={float(f.rope_theta or 0.0)!r}"]
    scaling = f.rope_scaling
    if scaling is not None and scaling.kind in ROPE_SCALINGS:
        name, fields = ROPE_SCALINGS[scaling.kind]
        args.append(f'scaling="{name}"')
        for field, key, default, kind in fields:
            value = scaling.get(key, m.max_position_embeddings if default == MAX_POSITIONS else default)
            args.append(f"{field}={kind(value)!r}")
    return f"    rope = {REGISTRIES[arch][0]}.Config({', '.join(args)})\n"


def _sizes(m: ModelSpec) -> str:
    return f"n_layers={int(m.num_layers)}, dim={int(m.hidden_size)}, n_heads={int(m.num_heads)}"


def _qwen3_layers(m: ModelSpec) -> str:
    """Qwen3 blocks: a dense MLP or a MoE per layer as the model has them, per-head query/key norms where it has."""
    sizes = f"{_sizes(m)}, n_kv_heads={int(m.num_kv_heads)}, head_dim={int(m.head_dim)}"
    lines, moe = [], set(m.moe_layers)
    if len(moe) < m.num_layers:
        lines.append(
            f"    dense = _build_qwen3_layers({sizes},\n        hidden_dim={int(m.ffn_hidden_size)}, {BACKENDS}, rope=rope)\n"
        )
    if moe:
        lines.append(
            f"    moe = _build_qwen3_moe_layers({sizes},\n        moe_hidden_dim={int(m.moe_ffn_hidden_size)}, "
            f"num_experts={int(m.num_experts)}, top_k={int(m.experts_per_token)},\n"
            f'        {BACKENDS}, moe_comm_backend="standard", rope=rope)\n'
        )
    if not moe:
        lines.append("    layers = dense\n")
    elif len(moe) == m.num_layers:
        lines.append("    layers = moe\n")
    else:
        listed = ", ".join(str(int(i)) for i in sorted(moe))
        lines.append(
            f"    moe_layers = {{{listed}}}\n    layers = [(moe if i in moe_layers else dense)[i] for i in range(len(dense))]\n"
        )
    if m.qk_norm is QKNorm.NONE:
        lines.append(
            "    layers = [replace(b, attention=replace(b.attention, qk_norm=None)) for b in layers]   # no query/key norms\n"
        )
    return "".join(lines)


def _deepseek_layers(m: ModelSpec) -> str:
    """DeepSeek-V3 blocks: latent attention, its first dense layers, then MoE layers with shared experts."""
    nope = m.head_dim - m.qk_rope_head_dim
    router = m.facts.router
    score = router.score.value if router is not None else "softmax"
    return (
        f"    layers = _build_dsv3_layers(\n        {_sizes(m)}, n_dense_layers={int(m.moe_layers[0])},\n"
        f"        q_lora_rank={int(m.q_lora_rank)}, kv_lora_rank={int(m.kv_lora_rank)}, qk_nope_head_dim={int(nope)}, "
        f"qk_rope_head_dim={int(m.qk_rope_head_dim)},\n        v_head_dim={int(m.v_head_dim or m.head_dim)}, "
        f"mscale={_mscale(m)!r}, dense_hidden_dim={int(m.ffn_hidden_size)}, moe_hidden_dim={int(m.moe_ffn_hidden_size)},\n"
        f"        num_experts={int(m.num_experts)}, num_shared_experts={int(m.num_shared_experts)}, "
        f'router_top_k={int(m.experts_per_token)}, router_score_func="{score}",\n'
        f'        {BACKENDS}, moe_comm_backend="standard", non_blocking_capacity_factor=None, rope=rope)\n'
    )


def _mscale(m: ModelSpec) -> float:
    """DeepSeek's softmax temperature under YaRN (Attention.Config.mscale): Hugging Face's ``mscale_all_dim``
    (transformers DeepseekV3Attention; 0, no temperature, where the config has none)."""
    scaling = m.facts.rope_scaling
    return float(scaling.get("mscale_all_dim", 0.0)) if scaling is not None else 0.0  # type: ignore[arg-type]


def _gptoss_layers(m: ModelSpec) -> str:
    """gpt-oss blocks, each attention rebuilt with the model's heads and its window (torchtitan's builder
    fixes 64 heads of 64 and a 128-key window on even layers)."""
    windows = ", ".join(str(m.window_of(i)) for i in range(m.num_layers))
    return (
        f"    layers = _build_gptoss_layers(\n        n_layers={int(m.num_layers)}, dim={int(m.hidden_size)}, "
        f"hidden_dim={int(m.moe_ffn_hidden_size)}, num_experts={int(m.num_experts)}, top_k={int(m.experts_per_token)},\n"
        f'        load_balance_coeff=None, {BACKENDS}, moe_comm_backend="standard", rope=rope)\n'
        f"    windows = [{windows}]   # keys each layer attends to (None: all)\n"
        "    for i, layer in enumerate(layers):\n"
        "        layer.attention = _make_gptoss_attn_config(\n"
        f"            dim={int(m.hidden_size)}, layer_id=i, {BACKENDS}, n_heads={int(m.num_heads)}, "
        f"n_kv_heads={int(m.num_kv_heads)}, head_dim={int(m.head_dim)},\n"
        "            sliding_window_size=windows[i], rope=rope)\n"
    )


def _layers_source(m: ModelSpec) -> str:
    arch = architecture(m)
    if arch == QWEN3:
        return _qwen3_layers(m)
    if arch == DEEPSEEK_V3:
        return _deepseek_layers(m)
    if arch == GPT_OSS:
        return _gptoss_layers(m)
    return (
        f"    layers = _build_llama3_layers(\n        {_sizes(m)}, n_kv_heads={int(m.num_kv_heads)}, "
        f"hidden_dim={int(m.ffn_hidden_size)}, {BACKENDS}, rope=rope)\n"
    )


def _facts_source(m: ModelSpec) -> str:
    """``nestplan_facts``: what the builders fix, set as the model states it."""
    lines = [
        "def nestplan_facts(model):\n",
        "    \"\"\"What torchtitan's builders fix, as the model states it: every norm's epsilon, each MoE's router,\n"
        '    its correction bias (expert_bias_E, MoE.Config.load_balance_coeff) and its shared experts."""\n',
        "    for _, norm, _, _ in model.traverse(RMSNorm.Config):\n",
        f"        norm.eps = {float(m.facts.norm_eps)!r}\n",
    ]
    router = m.facts.router
    if m.is_moe and router is not None:
        arch = architecture(m)
        groups = (int(m.routing_groups), int(m.routing_groups_per_token)) if m.routing_groups > 1 else (None, None)
        correction = arch != GPT_OSS and m.router_bias
        lines += [
            "    for _, moe, _, _ in model.traverse(MoE.Config):\n",
            f'        moe.router.score_func = "{router.score.value}"\n',
            f"        moe.router.route_norm = {bool(router.renormalised)}\n",
            f"        moe.router.route_scale = {float(router.scaling_factor)!r}\n",
            f"        moe.router.num_expert_groups, moe.router.num_limited_groups = {groups[0]}, {groups[1]}\n",
            f"        moe.router.gate.bias = {arch == GPT_OSS and m.router_bias}   # a bias on the router's logits (gpt-oss)\n",
            f"        moe.load_balance_coeff = {1e-3 if correction else None}   # a correction bias per expert\n",
        ]
        if m.num_shared_experts and (arch == QWEN3 or m.shared_expert_ffn_hidden_size != m.moe_ffn_hidden_size):
            hidden = int(m.num_shared_experts * m.shared_expert_ffn_hidden_size)
            lines.append(
                f"        moe.shared_experts = make_ffn_config(dim={int(m.hidden_size)}, hidden_dim={hidden}, "
                "w1_param_init=moe.router.gate.param_init,\n"
                "                                             w2w3_param_init=moe.router.gate.param_init)\n"
            )
    if m.facts.glu_clamp is not None and architecture(m) == GPT_OSS:  # gpt-oss's swiglu: both halves clamped
        lines += [
            "    for _, experts, _, _ in model.traverse(GptOssGroupedExperts.Config):\n",
            f"        experts.swiglu_limit = {float(m.facts.glu_clamp)!r}\n",
        ]
    return "".join(lines) + "    return model\n\n\n"


def _model_source(m: ModelSpec, fp8: bool, seq_len: int, compiled: bool) -> tuple[str, str]:
    """(imports, functions up to ``nestplan_model``) for torchtitan 0.3.0 building ``m``: its own Llama 3
    flavor where it ships one of ``m``'s architecture, else its architecture's model built at ``m``'s sizes
    with ``m``'s facts."""
    converter = f'Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled={compiled})'
    imports = "from torchtitan.components.quantization import Float8LinearConverter\n" if fp8 else ""
    shipped = catalog_architecture(m, MODEL_CONFIGS)
    if shipped is not None:
        _, flavor, _ = MODEL_CONFIGS[shipped]
        converters = f", converters=[{converter}]" if fp8 else ""
        return imports, f'def nestplan_model():\n    return model_registry("{flavor}"{converters})\n'
    arch = architecture(m)
    rope_class, registry_import, registry, flavor = REGISTRIES[arch]
    imports = (
        "from dataclasses import replace\n\n"
        + imports
        + f"from torchtitan.models.common import {rope_class}, RMSNorm\n"
        + "from torchtitan.models.common.moe import MoE\n"
        + registry_import
    )
    facts = _facts_source(m)
    if "make_ffn_config(" in facts:
        imports += "from torchtitan.models.common.config_utils import make_ffn_config\n"
    vocab, dim = int(m.vocab_size), int(m.hidden_size)
    body = (
        f'    spec = {registry}("{flavor}")   # torchtitan\'s {arch} model, sized and given the facts below\n'
        + "    base = spec.model\n"
        + _rope_source(m, seq_len)
        + _layers_source(m)
        + f"    model = replace(base, dim={dim}, vocab_size={vocab}, layers=layers, "
        f"enable_weight_tying={bool(m.tied_embeddings)},\n"
        f"                    tok_embeddings=replace(base.tok_embeddings, num_embeddings={vocab}, embedding_dim={dim}),\n"
        f"                    norm=replace(base.norm, normalized_shape={dim}),\n"
        f"                    lm_head=replace(base.lm_head, in_features={dim}, out_features={vocab})"
        + (", mtp_layers=[]" if arch == DEEPSEEK_V3 else "")
        + ")\n    model = nestplan_facts(model)\n"
        + (f"    model = {converter}.build().convert(model)\n" if fp8 else "")
        + '    return replace(spec, flavor="nestplan", model=model)\n'
    )
    return imports, facts + "def nestplan_model():\n" + body


def config_module(inp: ExportInput, m: ModelSpec, compiled: bool) -> str:
    """The text of ``nestplan_torchtitan.py``: torchtitan 0.3.0's config for the plan (the model nestplan
    costed, FP8 linears only where it costed them), read by ``--module nestplan_torchtitan --config
    nestplan_plan``. ``m``: the model torchtitan builds for the plan (``torchtitan_arch.run_model``). Every
    value in it is a number or flag of the validated model, written by Python's repr, or a fixed name."""
    job = inp.plan.job
    imports, functions = _model_source(m, job.fp8, job.seq_len, compiled)
    base, _, assets = MODEL_CONFIGS.get(catalog_architecture(m, MODEL_CONFIGS), ("llama3_70b", "", ""))
    assets_line = f'    config.hf_assets_path = "{assets}"\n' if assets else ""
    listed = listed_split(inp.plan)
    stages, stages_line = _stages_source(listed) if listed is not None else ("", "")
    return (
        '"""torchtitan 0.3.0 config written by nestplan: the model it builds for the plan and its precision.'
        "\n\nThe launch script puts this folder on PYTHONPATH and passes --module "
        f'{CONFIG_MODULE} --config {CONFIG_FUNCTION};\nits flags set the parallelism, batch and sequence."""\n'
        f"# nestplan {comment_text(inp.version)}\n# model: {comment_text(m.name)}, {int(m.num_layers)} layers, hidden {int(m.hidden_size)}"
        f"{f', {int(m.num_experts)} experts (top {int(m.experts_per_token)})' if m.is_moe else ''}"
        f"; FP8 linears: {'yes' if job.fp8 else 'no'}\n\n"
        + imports
        + "from torchtitan.models.common.config_utils import decoder_vocab_size\n"
        "from torchtitan.models.llama3 import config_registry, model_registry\n\n\n"
        + functions
        + "\n\n"
        + stages
        + f"def {CONFIG_FUNCTION}():\n"
        f"    config = config_registry.{base}()   # torchtitan's run settings (data, optimizer, checkpoints)\n"
        "    config.model_spec = nestplan_model()\n"
        "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)\n"
        + assets_line
        + stages_line
        + "    return config\n"
    )
