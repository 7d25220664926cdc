"""The model families nestplan reads, one module each (its reader and writer side by side), and the
registry derived from them: every ``model_type`` and alias, in the order error messages list them.
Adding a family: a module here with its ``FAMILIES`` entries, and its line in ``_MODULES``."""

from __future__ import annotations

from nestplan.model.families import (
    deepseek,
    falcon,
    gemma,
    gpt2,
    gpt_oss,
    jamba,
    llama,
    llama4,
    mistral,
    nemotron,
    nemotron_h,
    olmo2,
    phi3,
    qwen,
)
from nestplan.model.families.common import Family

_MODULES = (
    llama,
    mistral,
    qwen,
    phi3,
    olmo2,
    gemma,
    nemotron,
    nemotron_h,
    jamba,
    gpt2,
    deepseek,
    llama4,
    gpt_oss,
    falcon,
)

# model_type -> its Family, every model_type nestplan reads
FAMILIES: dict[str, Family] = {family.model_type: family for module in _MODULES for family in module.FAMILIES}
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(FAMILIES)
# model_type values of configs whose model is a supported family's, read as that family
ALIASES: dict[str, str] = {alias: family.model_type for family in FAMILIES.values() for alias in family.aliases}
