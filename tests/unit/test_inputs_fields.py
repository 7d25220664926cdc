"""``nestplan.inputs.Fields``, the shared reader of typed, bounded fields from a mapping, and the model
family registry built on it: every getter's refusal is one ConfigError naming the origin, the field
(with a nested object's prefix), its value and the limit; the registry lists each model_type once,
with a reader and a writer, and docs/formats.md lists every one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from nestplan.errors import ConfigError
from nestplan.inputs import Fields
from nestplan.model import SUPPORTED_FAMILIES
from nestplan.model.families import ALIASES, FAMILIES

ROOT = Path(__file__).resolve().parents[2]

DATA = {
    "layers": 4,
    "share": 0.5,
    "on": True,
    "name": "fat-tree",
    "kind": "infiniband",
    "sizes": [8, 4],
    "level": {"bandwidth": 50.0, "size": 2},
    "unset": None,
}


def _refusal(call) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call(Fields(DATA, "cluster file 'c.toml'"))
    return info.value


def test_getters_read_typed_values_and_defaults() -> None:
    f = Fields(DATA, "cluster file 'c.toml'")
    assert f.integer("layers", 8) == 4 and f.integer("unset", 8, default=3) == 3
    assert f.number("share", 0.0, 1.0) == 0.5 and f.probability("share") == 0.5 and f.fraction("share") == 0.5
    assert f.flag("on") is True and f.flag("absent", False) is False
    assert f.string("name") == "fat-tree" and f.choice("kind", ("infiniband", "roce")) == "infiniband"
    assert f.items("sizes", 8) == [8, 4]
    level = f.table("level")
    assert level.number("bandwidth", 0.0, 1e3) == 50.0 and level.integer("size", 16) == 2
    assert f.read == {"layers", "unset", "share", "on", "absent", "name", "kind", "sizes", "level"}


@pytest.mark.parametrize(
    "call, message, field, limit",
    [
        (lambda f: f.integer("layers", 2), "field 'layers' must be an integer in 1..2, got 4", "layers", "1..2"),
        (lambda f: f.integer("share", 8), "field 'share' must be an integer in 1..8, got 0.5", "share", "1..8"),
        (lambda f: f.integer("missing", 8), "missing field 'missing'", "missing", None),
        (lambda f: f.number("layers", 0, 1), "field 'layers' must be a number in [0, 1], got 4", "layers", "[0, 1]"),
        (lambda f: f.flag("layers"), "field 'layers' must be true or false, got 4", "layers", "true, false"),
        (
            lambda f: f.string("layers"),
            "field 'layers' must be a non-empty string, got 4",
            "layers",
            "a non-empty string",
        ),
        (lambda f: f.choice("kind", ("roce",)), "field 'kind' is 'infiniband'; allowed: roce", "kind", ["roce"]),
        (lambda f: f.items("sizes", 1), "field 'sizes' must be a list of at most 1 entries", "sizes", "0..1 entries"),
        (lambda f: f.table("name"), "field 'name' must be an object, got 'fat-tree'", "name", "an object"),
        (
            lambda f: f.table("level").integer("size", 1),
            "field 'level.size' must be an integer in 1..1, got 2",
            "level.size",
            "1..1",
        ),
        (lambda f: f.refuse_unknown(("layers",)), "unknown field 'share'; allowed: layers", "share", ["layers"]),
    ],
)
def test_refusals_name_origin_field_value_and_limit(call, message, field, limit) -> None:
    error = _refusal(call)
    assert str(error).startswith(f"cluster file 'c.toml': {message}")
    assert error.field == field and error.limit == limit


def test_nested_unknown_key_is_named_with_its_prefix() -> None:
    error = _refusal(lambda f: f.table("level").refuse_unknown(("size",)))
    assert "unknown field 'level.bandwidth'; allowed: size" in str(error) and error.field == "level.bandwidth"


def test_registry_lists_each_model_type_once_with_reader_and_writer() -> None:
    assert SUPPORTED_FAMILIES == tuple(FAMILIES) and len(set(SUPPORTED_FAMILIES)) == len(SUPPORTED_FAMILIES)
    for model_type, family in FAMILIES.items():
        assert family.model_type == model_type and callable(family.read) and callable(family.write)
        assert family.max_positions > 0
    assert ALIASES == {"kimi_k2": "deepseek_v3"} and not set(ALIASES) & set(FAMILIES)


def test_formats_doc_lists_every_model_type_and_alias() -> None:
    text = (ROOT / "docs" / "formats.md").read_text()
    supported = text.split("The family is `model_type`", 1)[1].split("is read in its place", 1)[0]
    for model_type in (*SUPPORTED_FAMILIES, *ALIASES):
        assert f"`{model_type}`" in supported, model_type


def test_lists_of_values_and_tables_are_read_as_fields_named_by_index() -> None:
    f = Fields({"sizes": [8, 4], "levels": [{"size": 2}, {"size": 0}], "one": 3}, "cluster file 'c.toml'")
    sizes = f.listed("sizes", 4, minimum=2)
    assert [sizes.integer(key, 8) for key in sizes.data] == [8, 4]
    first, second = f.tables("levels", 4)
    assert first.integer("size", 8) == 2
    with pytest.raises(ConfigError, match=r"field 'levels\[1\].size' must be an integer in 1..8, got 0"):
        second.integer("size", 8)
    with pytest.raises(ConfigError, match=r"field 'sizes' must be a list of 3 entries, got 2"):
        f.listed("sizes", 3, minimum=3)
    many = f.many("one", 4)
    assert [many.integer(key, 8) for key in many.data] == [3] and many.name("[0]") == "one[0]"


def test_required_keys_and_bounded_strings() -> None:
    f = Fields({"name": "n" * 5, "note": ""}, "cluster file 'c.toml'")
    with pytest.raises(ConfigError, match=r"missing field 'size'; required: name, size") as info:
        f.require(("name", "size"))
    assert info.value.field == "size"
    with pytest.raises(ConfigError, match="field 'name' is 5 characters long; at most 4 allowed"):
        f.string("name", maximum=4)
    assert f.string("note", blank=True) == ""
