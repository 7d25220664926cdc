"""Reading the plan JSON, one field at a time: each getter checks its field's type and bounds and raises
one ``ConfigError`` naming the field and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from nestplan.errors import ConfigError, brief
from nestplan.inputs import check_name, check_string
from nestplan.plan.schema import MAX_COUNT, MAX_TERMS, SCHEMAS
from nestplan.plan.summary import frozen


def refusal(field: str, wanted: str, value: Any, limit: Any) -> ConfigError:
    """The error for plan JSON field ``field`` holding ``value`` where it must be ``wanted``."""
    return ConfigError(
        f"plan JSON field '{field}' must be {wanted}, got {brief(value)}", field=field, value=value, limit=limit
    )


def field_value(data: Any, key: str, where: str) -> Any:
    if not isinstance(data, Mapping) or key not in data:
        raise ConfigError(
            f"the plan JSON has no '{where}{key}' field; it is not a complete plan",
            field=f"{where}{key}",
            limit=" or ".join(SCHEMAS),
        )
    return data[key]


def count_value(value: Any, field: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer (not a bool, not a float) in ``minimum..maximum``."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise refusal(field, f"an integer in {minimum}..{maximum}", value, f"{minimum}..{maximum}")
    return value


def int_field(data: Any, key: str, where: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    return count_value(field_value(data, key, where), f"{where}{key}", minimum, maximum)


def _number(value: Any, field: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise refusal(field, "a finite number >= 0", value, "a finite number >= 0")
    return float(value)


def float_field(data: Any, key: str, where: str) -> float:
    return _number(field_value(data, key, where), f"{where}{key}")


def bool_field(data: Any, key: str, where: str) -> bool:
    value = field_value(data, key, where)
    if not isinstance(value, bool):
        raise refusal(f"{where}{key}", "true or false", value, [True, False])
    return value


def choice_field(data: Any, key: str, where: str, allowed: Sequence[str]) -> str:
    """A categorical setting: one of ``allowed``."""
    value = field_value(data, key, where)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(
            f"plan JSON field '{where}{key}' is {brief(value)}; allowed: {', '.join(allowed)}",
            field=f"{where}{key}",
            value=value,
            limit=list(allowed),
        )
    return value


def list_field(data: Any, key: str, where: str, length: int | None = None, maximum: int = MAX_COUNT) -> list[Any]:
    """A list of ``length`` entries (any length up to ``maximum`` when None)."""
    value = field_value(data, key, where)
    if not isinstance(value, list) or (len(value) != length if length is not None else len(value) > maximum):
        wanted = f"{length} entries" if length is not None else f"at most {maximum} entries"
        raise refusal(f"{where}{key}", f"a list of {wanted}", value, wanted)
    return value


def object_field(data: Any, key: str, where: str) -> Mapping[str, Any]:
    value = field_value(data, key, where)
    if not isinstance(value, Mapping):
        raise refusal(f"{where}{key}", "an object", value, "an object")
    return value


def terms_field(data: Any, key: str, where: str) -> Mapping[str, float]:
    """A breakdown: at most ``MAX_TERMS`` term names (plain names), each a finite number >= 0."""
    terms = object_field(data, key, where)
    if len(terms) > MAX_TERMS:
        raise ConfigError(
            f"plan JSON field '{where}{key}' has {len(terms)} terms; at most {MAX_TERMS} allowed",
            field=f"{where}{key}",
            value=len(terms),
            limit=MAX_TERMS,
        )
    return frozen(
        {
            check_name(term, f"{where}{key} term", "plan JSON"): _number(value, f"{where}{key}.{term}")
            for term, value in terms.items()
        }
    )


def name_field(data: Any, key: str) -> str:
    """The model or cluster a plan is for: a non-empty string without control characters."""
    value = field_value(data, key, "")
    if not isinstance(value, str) or not value.strip():
        raise refusal(key, "a non-empty string", value, "a name or a path")
    return check_string(value, key, "plan JSON")
