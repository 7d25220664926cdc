"""The model torchtitan 0.3.0 builds for a plan, and the config module that builds it, which the
torchtitan export writes next to its launch script (``nestplan_torchtitan.py``): a model of another
architecture as a Llama-architecture stand-in of its sizes, FP8 linears only where nestplan costed them,
and a split torchtitan's flags cannot give listed module by module."""

from __future__ import annotations

from dataclasses import replace

from nestplan.export.common import comment_text
from nestplan.export.plan import ExportInput
from nestplan.export.torchtitan_split import listed_split
from nestplan.model.config import catalog_architecture
from nestplan.model.spec import ModelSpec, QKNorm

# catalog model: (torchtitan's config_registry function lending the run settings, its model flavor, its
# Hugging Face assets folder), chosen for a model of that catalog model's architecture, whatever its name
# (model.config.catalog_architecture); the 405B takes the 70B's settings: torchtitan's llama3_405b builds FP8
# linears and compiles (torchtitan/models/llama3/config_registry.py)
MODEL_CONFIGS = {
    "llama3-8b": ("llama3_8b", "8B", "./assets/hf/Llama-3.1-8B"),
    "llama3-70b": ("llama3_70b", "70B", "./assets/hf/Llama-3.1-70B"),
    "llama3.1-405b": ("llama3_70b", "405B", "./assets/hf/Llama-3.1-405B"),
}
SWIGLU_MULTIPLE = 256  # Llama's FFN sizes are multiples of 256 (Touvron et al. 2023, Llama 2's multiple_of)
CONFIG_MODULE = "nestplan_torchtitan"  # the config module the export writes next to its launch script
CONFIG_FUNCTION = "nestplan_plan"


def _differences(m: ModelSpec) -> list[str]:
    """How ``m`` differs from what torchtitan 0.3.0 builds: Llama-architecture decoders (RMSNorm, SwiGLU,
    rotary positions, no biases, no dropout, untied head) and, for MoE, Qwen3-MoE blocks (every layer
    MoE, no shared experts)."""
    checks = [
        (m.norm != "rmsnorm", m.norm),
        (not m.gated_mlp, "a non-gated MLP"),
        (m.linear_bias, "linear biases"),
        (m.learned_position_embeddings, "learned position embeddings"),
        (m.rotary_fraction != 1.0, "partial rotary embeddings"),
        (m.tied_embeddings, "tied embeddings"),
        (m.dropout, "dropout"),
        (m.qkv_bias, "query/key/value biases"),
        (m.qk_norm != "none", "query/key norms"),
        (m.block_norms != 2, f"{m.block_norms} norms per block"),
        (any(m.window_of(i) is not None for i in range(m.num_layers)), "sliding-window attention"),
        (m.attention_sinks, "attention sinks"),
        (m.router_bias, "a router bias"),
        (m.parallel_block, "attention and MLP in parallel"),
    ]
    return [what for bad, what in checks if bad]


def llama_stand_in(m: ModelSpec) -> ModelSpec:
    """The Llama-architecture decoder of ``m``'s sizes torchtitan builds for a model of another
    architecture (``torchtitan.run_model``): a non-gated MLP's parameters kept by a SwiGLU of 2/3 its
    hidden size, rounded to a multiple of 256 as Llama's sizes are, so tp degrees still divide it."""
    ffn = m.ffn_hidden_size if m.gated_mlp else SWIGLU_MULTIPLE * round(2 * m.ffn_hidden_size / 3 / SWIGLU_MULTIPLE)
    return replace(
        m,
        name=f"{m.name} as llama",
        norm="rmsnorm",
        gated_mlp=True,
        ffn_hidden_size=ffn,
        linear_bias=False,
        learned_position_embeddings=False,
        rotary_fraction=1.0,
        tied_embeddings=False,
        dropout=False,
        qkv_bias=False,
        block_norms=2,
        blocks=tuple(replace(block, window=None, qk_norm=QKNorm.NONE) for block in m.blocks),
        attention_sinks=False,
        router_bias=False,
        parallel_block=False,
    )


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


def _model_source(m: ModelSpec, fp8: bool, compiled: bool) -> tuple[str, str]:
    """(imports, body of ``nestplan_model``) for torchtitan 0.3.0 building ``m``: its own Llama 3 flavor
    where it ships one, else its Llama 3 (dense) or Qwen3-MoE (MoE, query/key norms removed) layers
    at ``m``'s sizes, resized from a shipped flavor that lends the initialisation and rotary settings."""
    converter = f'Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled={compiled})'
    imports = "from torchtitan.components.quantization import Float8LinearConverter\n" if fp8 else ""
    shipped = catalog_architecture(m, MODEL_CONFIGS)
    if shipped is not None:
        _, flavor, _ = MODEL_CONFIGS[shipped]
        return imports, f'    return model_registry("{flavor}"{f", converters=[{converter}]" if fp8 else ""})\n'
    imports = "from dataclasses import replace\n\n" + imports
    sizes = (
        f"n_layers={int(m.num_layers)}, dim={int(m.hidden_size)}, n_heads={int(m.num_heads)}, "
        f"n_kv_heads={int(m.num_kv_heads)}"
    )
    if m.is_moe:
        imports += (
            "from torchtitan.models.qwen3 import _build_qwen3_moe_layers\n"
            "from torchtitan.models.qwen3 import model_registry as qwen3_registry\n"
        )
        layers = (
            f"    layers = _build_qwen3_moe_layers(\n        {sizes}, head_dim={int(m.head_dim)},\n"
            f"        moe_hidden_dim={int(m.moe_ffn_hidden_size)}, num_experts={int(m.num_experts)}, "
            f"top_k={int(m.experts_per_token)},\n"
            '        attn_backend="flex", moe_comm_backend="standard", rope=replace(rope, '
            f"dim={int(m.head_dim)}))\n"
            "    layers = [replace(b, attention=replace(b.attention, qk_norm=None)) for b in layers]\n"
        )
        spec = '    spec = qwen3_registry("30B-A3B")   # Qwen3-MoE blocks: softmax top-k router, renormalised\n'
    else:
        imports += "from torchtitan.models.llama3 import _build_llama3_layers\n"
        layers = (
            f"    layers = _build_llama3_layers(\n        {sizes},\n        hidden_dim={int(m.ffn_hidden_size)}, "
            f'attn_backend="flex", rope=replace(rope, dim={int(m.head_dim)}))\n'
        )
        spec = '    spec = model_registry("8B")   # Llama 3 blocks\n'
    vocab, dim = int(m.vocab_size), int(m.hidden_size)
    body = (
        spec
        + "    base = spec.model\n    rope = base.layers[0].attention.rope\n"
        + layers
        + f"    model = replace(base, dim={dim}, vocab_size={vocab}, layers=layers,\n"
        f"                    tok_embeddings=replace(base.tok_embeddings, num_embeddings={vocab}, "
        f"embedding_dim={dim}),\n"
        f"                    norm=replace(base.norm, normalized_shape={dim}),\n"
        f"                    lm_head=replace(base.lm_head, in_features={dim}, out_features={vocab}))\n"
        + (f"    model = {converter}.build().convert(model)\n" if fp8 else "")
        + '    return replace(spec, flavor="nestplan", model=model)\n'
    )
    return imports, body


def config_module(inp: ExportInput, m: ModelSpec, compiled: bool) -> str:
    """The text of ``nestplan_torchtitan.py``: torchtitan 0.3.0's config for the plan (the model nestplan
    costed, FP8 linears only where it costed them), read by ``--module nestplan_torchtitan --config
    nestplan_plan``. ``m``: the model torchtitan builds for the plan (``torchtitan.run_model``). Every
    value in it is an integer of the validated model or a fixed name."""
    job = inp.plan.job
    imports, body = _model_source(m, job.fp8, compiled)
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
        "def nestplan_model():\n" + body + "\n\n" + stages + f"def {CONFIG_FUNCTION}():\n"
        f"    config = config_registry.{base}()   # torchtitan's run settings (data, optimizer, checkpoints)\n"
        "    config.model_spec = nestplan_model()\n"
        "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)\n"
        + assets_line
        + stages_line
        + "    return config\n"
    )
