"""Read a Hugging Face style ``config.json`` into a :class:`ModelSpec` (:func:`parse_config`), and
write a ModelSpec back as one (:func:`config_dict`, its inverse).

The dict is read directly (no ``transformers`` import, no download), with each
family's own field names, by the family's reader in ``model/families/`` (the
registry there lists every ``model_type`` read). A field that is absent (or
``null``) takes the default the family's ``transformers`` configuration class
gives it, except for the sizes that define a model (hidden size, layers, heads,
FFN width, vocabulary, expert counts), which are required. A config whose
``text_config`` is an object (multimodal wrappers) is read from it. Every size
is bounded (``MAX_LAYERS`` ...: ``model.families.common``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nestplan import catalog
from nestplan.errors import ConfigError, brief, printable
from nestplan.inputs import check_length, check_string, load_object
from nestplan.model.families import ALIASES, FAMILIES, SUPPORTED_FAMILIES
from nestplan.model.families.common import (
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    ConfigFields,
)
from nestplan.model.facts import fact_fields, read_facts
from nestplan.model.spec import ModelSpec

__all__ = [
    "MAX_EXPERTS",
    "MAX_FFN",
    "MAX_HEAD_DIM",
    "MAX_HEADS",
    "MAX_HIDDEN",
    "MAX_LAYERS",
    "MAX_NAME_CHARS",
    "MAX_POSITIONS",
    "MAX_VOCAB",
    "catalog_architecture",
    "config_dict",
    "load_model",
    "model_names",
    "parse_config",
]

MAX_NAME_CHARS = 200  # a model's name labels plans, tables and exported files


def _check_model_name(name: str, field: str = "model name") -> str:
    """``name`` itself: no control character, at most ``MAX_NAME_CHARS`` characters."""
    check_string(name, field, "config.json")
    check_length(name, field, "config.json", MAX_NAME_CHARS)
    return name


def parse_config(data: dict, name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` dict; the family is its ``model_type``. A
    multimodal config whose ``text_config`` object holds the language model (Gemma 3, LLaVA, ...) is
    read from that object: the language model is what nestplan plans (the vision tower is not counted)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config.json: top level must be a JSON object, got {type(data).__name__}", field="config")
    if isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    supported = ", ".join(SUPPORTED_FAMILIES)
    family = data.get("model_type")
    family = ALIASES.get(family, family) if isinstance(family, str) else family
    if family is None:
        raise ConfigError(
            f"config.json: missing field 'model_type'; supported families: {supported}",
            field="model_type",
            limit=list(SUPPORTED_FAMILIES),
        )
    if not isinstance(family, str) or family not in FAMILIES:
        raise ConfigError(
            f"model_type {brief(family)} is not supported; supported families: {supported}",
            field="model_type",
            value=brief(family),
            limit=list(SUPPORTED_FAMILIES),
        )
    fields = ConfigFields(data, FAMILIES[family])
    spec = FAMILIES[family].read(fields, _check_model_name(name))
    spec = dataclasses.replace(spec, facts=read_facts(fields, FAMILIES[family].facts, spec.is_moe))
    fields.check_unread()
    return spec


# ---------------------------------------------------------------------------
# writing: the inverse of parse_config


def config_dict(spec: ModelSpec) -> dict[str, Any]:
    """The inverse of :func:`parse_config`: ``spec`` as a Hugging Face ``config.json`` object of its
    family, which ``parse_config`` reads back into ``spec`` (its name and trace calibration aside:
    ``parse_config(config_dict(s), s.name)`` is ``s`` with both ``traced_*_scale`` at 1.0).

    It cannot write a ModelSpec that no config.json of its family gives (one built or altered by
    hand, such as a Llama with LayerNorm): a ConfigError names the first such field."""
    family = FAMILIES[spec.family]
    config = {"model_type": spec.family, **family.write(spec), **fact_fields(spec.facts, family.facts)}
    expected = dataclasses.replace(spec, traced_flops_scale=1.0, traced_activation_scale=1.0)
    read = parse_config(config, spec.name)
    if read != expected:
        differing = next(
            f.name for f in dataclasses.fields(ModelSpec) if getattr(read, f.name) != getattr(expected, f.name)
        )
        what, value = differing, getattr(expected, differing)
        if differing == "blocks":  # the first block the config cannot give
            layer = next(i for i, block in enumerate(value) if read.blocks[i : i + 1] != (block,))
            what, value = f"block {layer}", value[layer]
        raise ConfigError(
            f"model {printable(spec.name)} cannot be written as a {spec.family} config.json: its "
            f"{what} {brief(value, 160)} is not one such a config gives",
            field=differing,
            value=value,
        )
    return config


# ---------------------------------------------------------------------------
# files and the catalog


def _name_for_path(data: dict, path: Path) -> str:
    """``_name_or_path`` or ``name`` from the config, else the file stem (the folder for ``config.json``),
    checked as a name (:func:`_check_model_name`)."""
    for key in ("_name_or_path", "name"):
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return _check_model_name(value.strip(), f"field '{key}'")
    if path.stem == "config" and path.resolve().parent.name:
        return _check_model_name(path.resolve().parent.name, "the folder name")
    return _check_model_name(path.stem, "the file name")


def _as_path(text: str) -> Path | None:
    """The config file ``text`` designates, or None when it is a catalog name."""
    path = catalog.user_path(text)
    if catalog.is_file(path):
        return path
    if catalog.is_dir(path) and catalog.is_file(path / "config.json"):
        return path / "config.json"
    if text.lower().endswith(".json") or "/" in text or "\\" in text:
        return path / "config.json" if catalog.is_dir(path) else path
    return None


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a Hugging Face ``config.json`` (a file, or a folder holding one)."""
    text = str(name_or_path).strip()
    path = _as_path(text)
    if path is not None:
        data = load_object(path, "model config file", "json")
        return parse_config(data, _name_for_path(data, path))
    entry = catalog.entry_path("model", text)
    return parse_config(load_object(entry, "model config file", "json"), entry.stem)


def catalog_architecture(spec: ModelSpec, names: Iterable[str]) -> str | None:
    """The first catalog model of ``names`` whose architecture is ``spec``'s (every field equal but the name and
    the trace calibration), else None. Exports choose a framework's model flavour or recipe by it, never by
    the name a config gives itself: a small config.json named ``llama3-8b`` is not Llama 3 8B, and a
    config.json of Llama 3 8B's shape under another name is."""
    return next((name for name in names if _architecture(_catalog_model(name)) == _architecture(spec)), None)


def _architecture(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, name="", traced_flops_scale=1.0, traced_activation_scale=1.0)


@functools.cache
def _catalog_model(name: str) -> ModelSpec:
    return load_model(name)


def model_names() -> list[str]:
    """Sorted names of the models shipped in the catalog."""
    return catalog.names("model")
